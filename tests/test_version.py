"""Issue 30, item 6: one version. pyproject.toml declares it dynamic, read from ``qkernels.__version__``; the
installed package's metadata must say the same."""

import importlib.metadata
import os

import pytest

import qkernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_metadata_version_is_qkernels_version():
    assert importlib.metadata.version("qkernels") == qkernels.__version__


def test_pyproject_reads_the_version_from_the_package():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        config = tomllib.load(fh)
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "qkernels.__version__"}
