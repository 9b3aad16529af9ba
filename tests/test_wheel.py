"""Issue 30, item 3: the wheel of ``python -m build --wheel --no-isolation`` installs into a fresh venv holding only
torch and the runtime dependencies, and with no compiler on PATH imports ``qkernels._C``, runs ``cliff_loss`` on the
``cpu`` backend and ``qkernels train --steps 2``. Issue 37: the wheel is abi3 (``cp310-abi3``) and asks for
``torch>=`` the stable-ABI target, not one release (scripts/build_wheels.sh makes it manylinux; another torch:
scripts/cross_torch_check.sh). Issue 47: the bare wheel brings torch and numpy only, runs the ops with them, and
``qkernels train`` names the extra it needs; ``qkernels[train]`` then trains.

About a minute after ``scripts/bootstrap.sh``: the wheel build reuses the objects of its editable build (setup.py
keeps them in build/temp.*; same ninja) and only links and packs; the fresh venv sees this environment's torch, numpy,
scipy and scikit-learn (and what they require) through .pth files (``_share``) instead of a copy, and pip installs the
wheel and the rest of its train extra."""

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from conftest import missing, skip_unless

from qkernels import _ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "ninja")

pytestmark = [
    pytest.mark.slow,
    skip_unless("ext", f"needs a built qkernels._C to package ({_ext.REASON})"),
]

CHECK = textwrap.dedent("""
    import sys
    import torch
    import qkernels
    import qkernels._C  # noqa: F401
    from qkernels import _ext

    assert qkernels.__file__.startswith(sys.prefix), qkernels.__file__  # the wheel, not the source tree
    assert _ext.LOADED and "cpu" in qkernels.available_backends(), _ext.REASON
    z = torch.randn(512, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    cond = torch.arange(10).repeat(3, 1)
    with qkernels.use_backend("cpu"):
        loss = qkernels.cliff_loss(z, cond_index=cond)
    loss.backward()
    with qkernels.use_backend("reference"):
        want = qkernels.cliff_loss(z.detach(), cond_index=cond)
    torch.testing.assert_close(loss.detach(), want, rtol=2e-4, atol=2e-5)
    assert torch.isfinite(z.grad).all()
    print("cliff_loss cpu", loss.item())
""")


def _run(cmd, *, env=None, cwd=None, timeout=900):
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd[:4]} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def _share(names: list[str], folder, pth: str) -> None:
    """Makes the distributions ``names`` and everything they require (as installed in this interpreter) importable
    by another one: ``folder`` gets a link to each of their top-level files and folders and their metadata, and
    the other interpreter's ``pth`` file names ``folder``."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(names)
    os.makedirs(folder, exist_ok=True)
    while todo:
        dist = metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for part in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            src, dst = dist.locate_file(part), os.path.join(folder, part)
            if not os.path.lexists(dst) and os.path.exists(src):
                os.symlink(src, dst)
        for r in map(Requirement, dist.requires or ()):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    with open(pth, "w") as f:
        f.write(f"{folder}\n")


def test_wheel_installs_and_runs_without_a_compiler(tmp_path, source_tree_build):
    if subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True, cwd=ROOT).returncode:
        missing("build", "the `build` package (the dev extra) is not installed")
    dist = tmp_path / "dist"
    # the dev venv's tools first on PATH, as in scripts/bootstrap.sh: another ninja's log recompiles everything
    dev = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), ROOT], env=dev, cwd=ROOT)
    (wheel,) = glob.glob(str(dist / "qkernels-*.whl"))
    assert os.path.basename(wheel).endswith("-cp310-abi3-linux_x86_64.whl"), wheel  # one wheel for CPython >= 3.10
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert "qkernels/py.typed" in zf.namelist() and "qkernels/_C.abi3.so" in zf.namelist()
        if importlib.util.find_spec("jax") is not None:  # built with jax importable: qkernels.jax's FFI library too
            assert "qkernels/jax/_kernels.abi3.so" in zf.namelist(), zf.namelist()
    assert f"Requires-Dist: torch>={_ext.target()}\n" in meta  # any torch from the stable-ABI target on
    assert "Requires-Dist: torch==" not in meta
    required = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    light = ["numpy", "torch", *(["triton"] if torch.version.cuda else [])]  # the light install (setup.py REQUIRES)
    assert sorted(r.split(">")[0] for r in required if "extra ==" not in r) == light
    assert any(r.startswith("scikit-learn") and 'extra == "train"' in r for r in required)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    bindir = str(venv / "bin")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "QKERNELS_NO_EXT")
    }
    env.update(PATH=bindir, CC="/nonexistent/cc", CXX="/nonexistent/c++")  # only the venv's own scripts
    found = [c for c in COMPILERS if shutil.which(c, path=bindir)]
    assert not found, f"compilers on the fresh venv's PATH: {found}"

    # torch (and numpy) as installed here, seen by the fresh venv through a .pth file naming a folder that links
    # their files and nothing else: pip then finds the wheel's requirements met, as it would after installing them
    # (a copy of torch's 900 MB took most of this test's time)
    py = str(venv / "bin" / "python")
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    _share(["torch", "numpy"], tmp_path / "shared_runtime", os.path.join(site, "shared_runtime.pth"))
    _run([py, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], env=env, cwd=tmp_path)  # venv's: older than torch's
    _run([py, "-m", "pip", "install", "-q", "--no-deps", wheel], env=env, cwd=tmp_path)
    _run([py, "-m", "pip", "check"], env=env, cwd=tmp_path)  # every requirement of the wheel is there
    out = _run(
        [py, "-c", CHECK + "\nimport importlib.util; assert importlib.util.find_spec('sklearn') is None"],
        env=env,
        cwd=tmp_path,
    ).stdout
    assert "cliff_loss cpu" in out  # the ops with torch and numpy only
    run = tmp_path / "run"
    train = [str(venv / "bin" / "qkernels"), "train", "--steps", "2", "--protocol", "fast", "--out", str(run)]
    r = subprocess.run(train, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        "qkernels: error: qkernels train needs scikit-learn: pip install 'qkernels[train]'"
    )
    # the train extra: scipy and scikit-learn shared the same way, the rest (h5py, pillow) installed by pip
    _share(["scipy", "scikit-learn"], tmp_path / "shared_train", os.path.join(site, "shared_train.pth"))
    r = _run([py, "-m", "pip", "install", f"{wheel}[train]"], env=env, cwd=tmp_path)
    assert "Successfully installed" in r.stdout and "h5py" in r.stdout, r.stdout[-2000:]
    _run(train, env=env, cwd=tmp_path)
    assert (run / "metrics.json").exists() and (run / "checkpoint.pt").exists()
