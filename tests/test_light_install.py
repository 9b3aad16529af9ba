"""Issue 47, items 3-4: ``pip install qkernels`` is torch + numpy; every other dependency comes with an extra that a
one-line error names when its feature is used; ``qkernels --help`` and a bad command line import neither torch nor
scikit-learn (the CLI's start-up)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import require

from qkernels import _extras, cli

ROOT = Path(__file__).resolve().parents[1]

# a meta path finder that makes the optional dependencies look uninstalled, in a fresh interpreter
BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {"scipy", "sklearn", "h5py", "PIL", "matplotlib"}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
""")


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# ------------------------------------------------------------------------------------------- 3. extras
def test_the_ops_models_and_procedural_data_run_with_torch_and_numpy_only_and_extras_are_named():
    code = BLOCK + textwrap.dedent("""
        import json, tempfile, torch
        import qkernels
        from qkernels import nn

        g = torch.Generator().manual_seed(0)
        z = torch.randn(64, 3, generator=g, requires_grad=True)
        loss = (qkernels.cliff_loss(z, cond_index=torch.arange(8).repeat(3, 1)) + qkernels.klm_loss(z)
                + qkernels.latent_quantize(z, torch.linspace(-1, 1, 5)).loss_commit + qkernels.fsq(z, 5).z_q.sum()
                + qkernels.normalized_hessian_penalty(lambda x: torch.tanh(x) ** 2, z)
                + nn.LatentQuantizer(3, 7)(z).z_q.sum())
        loss.backward()
        assert torch.isfinite(z.grad).all()
        from qkernels.data import load_dataset
        from qkernels.models import build_model
        ds = load_dataset("sprites", image_size=16)  # procedural: no h5py, no pillow
        model = build_model("tripod", ds.observation_shape, 4, arch="small")
        errors = {}
        def error(what, fn):
            try:
                fn()
            except ImportError as err:
                errors[what] = [type(err).__name__, str(err)]
        import qkernels.metrics as M  # issue 57: only the names that need scikit-learn / scipy fail
        x = torch.rand(4, 3, 8, 8)
        assert M.psnr(x, x * 0.9) > 0 and M.mse(x, x) == 0 and M.psnr_uint8(x, x * 0.9) > 0
        s = torch.randint(0, 3, (200, 2))
        assert 0 <= M.mig(s, s.float())["mig"] <= 1 and "modularity" in M.modularity(s, s.float())
        assert M.get_protocol("tripod").metrics == ("infomec", "dci")
        assert M.evaluate(lambda x: x.flatten(1)[:, :3], ds, metrics=["mig"], num_samples=50)["mig.mig"] >= 0
        from qkernels.metrics import dci, infomec, mcc, sap  # the names import; a call says what it needs
        for name, fn in (("dci", dci), ("infomec", infomec), ("sap", sap), ("mcc", mcc)):
            error(name, lambda fn=fn: fn(s, s.float()))
        encoded = []
        error("evaluate", lambda: M.evaluate(lambda x: encoded.append(x) or x.flatten(1)[:, :3], ds, num_samples=50))
        assert encoded == []  # refused before encoding anything
        error("figures", lambda: __import__("qkernels.train.figures"))
        from qkernels.data import Shapes3D, contact_sheet
        error("shapes3d", lambda: Shapes3D(tempfile.mkdtemp() + "/3dshapes.h5"))
        error("contact_sheet", lambda: contact_sheet(ds, tempfile.mkdtemp() + "/s.png"))
        from qkernels.bench import plot
        error("plot", plot._matplotlib)
        from qkernels.cli import main
        code = main(["train", "--out", tempfile.mkdtemp() + "/run"])
        print(json.dumps({"errors": errors, "train_exit": code}))
    """)
    res = _run(code)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    want = {
        "dci": "qkernels.metrics.dci needs scikit-learn: pip install 'qkernels[metrics]'",
        "infomec": "qkernels.metrics.infomec needs scipy: pip install 'qkernels[metrics]'",
        "sap": "qkernels.metrics.sap needs scikit-learn: pip install 'qkernels[metrics]'",
        "mcc": "qkernels.metrics.mcc needs scipy: pip install 'qkernels[metrics]'",
        "evaluate": "qkernels.metrics.evaluate (its infomec) needs scipy: pip install 'qkernels[metrics]'",
        "figures": "qkernels.train.figures needs pillow: pip install 'qkernels[train]'",
        "shapes3d": "qkernels.data.Shapes3D needs h5py: pip install 'qkernels[data]'",
        "contact_sheet": "qkernels.data.contact_sheet needs pillow: pip install 'qkernels[data]'",
        "plot": "qkernels bench --plot needs matplotlib: pip install 'qkernels[plot]'",
    }
    assert out["errors"] == {k: ["MissingExtraError", v] for k, v in want.items()}
    # the CLI checks before training: one line, exit 1
    assert out["train_exit"] == 1
    assert res.stderr.strip().splitlines()[-1] == (
        "qkernels: error: qkernels train needs scikit-learn: pip install 'qkernels[train]'"
    )


def test_needs_passes_other_import_errors_and_require_checks_without_importing(monkeypatch):
    with pytest.raises(ModuleNotFoundError) as exc:  # not an optional dependency: unchanged
        with _extras.needs("x", "metrics"):
            import qkernels_no_such_module  # noqa: F401
    assert not isinstance(exc.value, _extras.MissingExtraError)
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if not installed (also where another test imported it)
    monkeypatch.setitem(sys.modules, "sklearn.svm", None)
    with pytest.raises(
        ImportError, match=r"^qkernels.metrics.sap needs scikit-learn: pip install 'qkernels\[metrics\]'$"
    ):
        with _extras.needs("qkernels.metrics.sap", "metrics"):
            from sklearn.svm import LinearSVC  # noqa: F401
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None if name == "scipy" else object())
    with pytest.raises(
        _extras.MissingExtraError, match=r"^qkernels train needs scipy: pip install 'qkernels\[train\]'$"
    ):
        _extras.require("qkernels train", "train", "sklearn", "scipy", "PIL")


def test_the_package_asks_for_torch_and_numpy_and_offers_the_extras():
    tree = ast.parse((ROOT / "setup.py").read_text())
    requires = next(
        ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "REQUIRES"
    )
    assert [r.split(">")[0] for r in requires] == ["numpy"]
    tomllib = require("tomllib", "tomllib")  # Python >= 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"train", "metrics", "data", "plot", "docs", "jax", "dev"} <= set(extras)

    def names(extra):
        return {r.split(">")[0].split("=")[0].split("[")[0].split(";")[0].strip() for r in extras[extra]}

    assert names("metrics") == {"scipy", "scikit-learn"} and names("data") == {"h5py", "pillow"}
    assert names("train") == names("metrics") | names("data") | {"tomli"}  # tomli: qkernels sweep's TOML on 3.10
    assert names("ray") == {"ray"} and "ray" in names("dev")  # qkernels sweep --ray; CI tests it on a local cluster
    assert names("train") | names("plot") | names("docs") <= names("dev")  # bootstrap.sh installs .[dev]: everything
    assert set(_extras.DISTRIBUTIONS.values()) >= names("train") | names("plot")


# ------------------------------------------------------------------------------------------- 4. start-up
def test_help_and_bad_command_lines_import_neither_torch_nor_sklearn():
    code = textwrap.dedent("""
        import contextlib, io, json, sys
        from qkernels.cli import main
        codes = []
        for argv in (["--help"], ["train", "--help"], ["bench", "--help"], ["sweep", "--help"], ["trian"],
                     ["train", "--model", "nope"],
                     ["train", "--steps", "0"], ["--version"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    codes.append(main(argv))
                except SystemExit as exc:
                    codes.append(exc.code)
        heavy = sorted({m.partition(".")[0] for m in sys.modules} & {"torch", "sklearn", "scipy", "numpy", "PIL"})
        print(json.dumps([codes, heavy]))
    """)
    res = _run(code)
    assert res.returncode == 0, res.stderr[-3000:]
    codes, heavy = json.loads(res.stdout.strip().splitlines()[-1])
    assert codes == [0, 0, 0, 0, 2, 2, 2, 0] and heavy == []


def test_the_parsers_names_are_the_registries():
    from qkernels.metrics.protocols import PROTOCOLS
    from qkernels.models.registry import METHODS

    assert cli.MODELS == tuple(METHODS)
    assert cli.PAPER_STEPS == {n: s.paper_steps for n, s in METHODS.items() if s.paper_steps}
    assert cli.PROTOCOL_NAMES == tuple(PROTOCOLS)


def test_help_texts_are_plain_and_every_command_describes_itself(capsys):
    for argv in (["--help"], ["bench", "--help"], ["train", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = capsys.readouterr().out
        assert "``" not in text and ":data:" not in text and ":mod:" not in text, argv
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    usage, description = capsys.readouterr().out.split("\n\n")[:2]
    assert description.startswith("Time (min and median")
