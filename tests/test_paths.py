"""Every repository path named exists: in the docs, the READMEs, the benchmark notes, and the package's, the scripts',
the examples' and the GPU harness's sources (docstrings, comments, strings). A path is a token that starts with one of
the repository's top-level folders and ends in a file extension or a slash (``gpu/gpu_check.sh``,
``benchmarks/results/``); globs (``gpu/experiments/*.patch``) must match a file, ``{a,b}`` each alternative."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("qkernels", "tests", "benchmarks", "scripts", "python", "docs", "csrc", "gpu")
# a top-level folder not preceded by a path character (so "kylehkhsu/tripod" or "lddr/run.py" are not ours)
PATH = re.compile(r"(?<![\w./\-~$])((?:" + "|".join(TOP) + r")/[\w./*{},\-]*)")
# named on purpose without being in this repository
NOT_HERE = {
    "scripts/train_autoencoder.py": "the Tripod authors' training script (kylehkhsu/tripod)",
    "scripts/prepare_shapes3d.py": "the FactorQVAE authors' data preparation (ituvisionlab/FactorQVAE)",
}
BUILT = re.compile(r"qkernels/[\w/]*(_C|_kernels)[\w.]*\.so")  # native libraries, built in place (git-ignored)

SOURCES = ("docs/**/*.md", "README.md", "benchmarks/*.md", "qkernels/**/*.py", "python/*.py")
SOURCES += tuple(f"{folder}/**/*.{ext}" for folder in ("scripts", "gpu") for ext in ("md", "py", "sh"))


def _sources() -> dict[Path, str]:
    """Every file the check reads, whole: prose, and code with its docstrings, comments and string literals (a path
    in a string literal must exist too)."""
    return {path: path.read_text() for pattern in SOURCES for path in sorted(ROOT.glob(pattern)) if path.is_file()}


def named_paths(text: str) -> list[str]:
    """The repository paths ``text`` names, braces expanded."""
    found = []
    for match in PATH.finditer(text):
        token = match.group(1).rstrip(".,")
        if not (token.endswith("/") or re.search(r"\.\w+$", token)):
            continue  # a module or folder named without a slash: not checked
        braces = re.search(r"\{([^{}]*)\}", token)
        found += (
            [token[: braces.start()] + alt + token[braces.end() :] for alt in braces.group(1).split(",")]
            if braces
            else [token]
        )
    return found


def _exists(path: str) -> bool:
    return path in NOT_HERE or BUILT.fullmatch(path) is not None or any(ROOT.glob(path))


def test_the_scan_finds_paths_and_misses_others():
    text = (
        "see `gpu/gpu_check.sh`, benchmarks/results/ and tests/sm90/sm90_cache.json; tests_call{1,2}.log; "
        "kylehkhsu/tripod's scripts/train_autoencoder.py, qkernels.jax, `qkernels/jax` and "
        "benchmarks/results/nvidia-h200/2026-11-27-d290235/tests_call{1,2}.log.gz."
    )
    assert named_paths(text) == [
        "gpu/gpu_check.sh",
        "benchmarks/results/",
        "tests/sm90/sm90_cache.json",
        "scripts/train_autoencoder.py",
        "benchmarks/results/nvidia-h200/2026-11-27-d290235/tests_call1.log.gz",
        "benchmarks/results/nvidia-h200/2026-11-27-d290235/tests_call2.log.gz",
    ]
    assert not _exists("scripts/gpu_check_jax.py") and not _exists("gpu/experiments/cliff_standardize_once.patch")
    assert _exists("gpu/experiments/*.patch") and _exists("qkernels/_C_cuda.abi3.so")
    assert _exists("qkernels/jax/_kernels_cuda.abi3.so") and not _exists("qkernels/jax/kernels.py")


def test_every_path_named_exists():
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path, text in _sources().items()
        for name in sorted(set(named_paths(text)))
        if not _exists(name)
    ]
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


def _anchors(markdown: str) -> set[str]:
    """GitHub's (and mkdocs') anchors of a markdown file's headings."""
    heads = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_anchor_named_is_a_heading():
    """A ``page.md#anchor`` named in the sources (e.g. each routing row of qkernels/_backend.py) reaches a heading."""
    named = [
        (path, page, anchor)
        for path, text in _sources().items()
        for page, anchor in re.findall(r"((?:docs|benchmarks)/[\w./\-]*\.md)#([\w\-]+)", text)
    ]
    assert any(page == "docs/design/routing.md" for _, page, _ in named)
    broken = [
        f"{path.relative_to(ROOT)}: {page}#{anchor}"
        for path, page, anchor in named
        if anchor not in _anchors((ROOT / page).read_text())
    ]
    assert not broken, broken
