"""Issue 30, item 6: one version. pyproject.toml declares it dynamic, read from ``qkernels.__version__``; the
installed package's metadata must say the same."""

import importlib.metadata
import os

import pytest
from conftest import require

import qkernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_metadata_version_is_qkernels_version():
    assert importlib.metadata.version("qkernels") == qkernels.__version__


def test_pyproject_reads_the_version_from_the_package():
    tomllib = require("tomllib", "tomllib")  # Python >= 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        config = tomllib.load(fh)
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "qkernels.__version__"}


def test_subpackages_are_attributes_after_import_qkernels_loaded_lazily():
    """Issue 39: qkernels.nn.CliffLoss, qkernels.data.load_dataset, ... after a plain `import qkernels`, without
    importing them at `import qkernels` (a fresh interpreter each)."""
    import json
    import subprocess
    import sys

    import qkernels

    code = (
        "import json, sys, qkernels; eager = [m for m in qkernels.SUBPACKAGES if 'qkernels.' + m in sys.modules]; "
        "qkernels.nn.CliffLoss; qkernels.data.load_dataset; qkernels.metrics; qkernels.models; qkernels.train; "
        "qkernels.compat; print(json.dumps([eager, 'qkernels.data' in sys.modules]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    eager, loaded = json.loads(res.stdout.strip().splitlines()[-1])
    assert loaded and not {"metrics", "data", "models", "train", "compat", "bench"} & set(eager)
    assert {"nn", "data", "metrics"} <= set(dir(qkernels))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        qkernels.nope  # noqa: B018
