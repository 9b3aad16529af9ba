"""Issue 30: every public name (the ``__all__`` of each public module) has a docstring with a ``>>>`` example, and
those examples run as doctests (one case per name, so a failure names it). Data constants (dicts, tuples, strings)
cannot carry a docstring; their module's docstring documents them."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect

import pytest
import torch
from test_docs import api_modules

MODULES = api_modules()  # the API page's sections (docs/hooks.py)
# data constants: documented in their module's docstring
EXEMPT = {
    "qkernels.metrics": {"METHOD_PROTOCOL", "METRICS", "PROTOCOLS"},
    "qkernels.models": {"METHODS", "TRIPOD_LAMBDAS"},
    "qkernels.data": {"DATASETS", "ENV_VAR", "FILE_DATASETS", "PROCEDURAL_DATASETS"},
}
PUBLIC = [(m, n) for m in MODULES for n in importlib.import_module(m).__all__ if n not in EXEMPT.get(m, ())]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_public_modules_include_the_package_and_its_layers():
    assert {"qkernels", "qkernels.nn", "qkernels.metrics", "qkernels.train", "qkernels.models", "qkernels.data"} <= set(
        MODULES)


def test_exempt_names_are_constants_documented_by_their_module():
    for mod_name, names in EXEMPT.items():
        mod = importlib.import_module(mod_name)
        for name in names:
            assert name in mod.__all__, name
            assert not callable(getattr(mod, name)), name
            assert name in (mod.__doc__ or ""), f"{mod_name}'s docstring does not document {name}"


def _examples(mod_name: str, name: str) -> list[doctest.DocTest]:
    obj = getattr(importlib.import_module(mod_name), name)
    # empty globals: an example runs as pasted into a fresh interpreter (it imports what it uses, torch too)
    tests = doctest.DocTestFinder(exclude_empty=True).find(obj, f"{mod_name}.{name}", globs={})
    return [t for t in tests if t.examples]


@pytest.mark.parametrize(("mod_name", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_public_name_has_a_running_example(mod_name, name, tmp_path, monkeypatch):
    obj = getattr(importlib.import_module(mod_name), name)
    doc = inspect.getdoc(obj) or ""
    assert ">>>" in (obj.__doc__ or ""), f"{mod_name}.{name} has no >>> example in its own docstring"
    assert doc.splitlines()[0].strip(), f"{mod_name}.{name}: no one-line summary"
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    torch.manual_seed(0)
    for test in _examples(mod_name, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{mod_name}.{name}: no example ran"
    assert result.failed == 0, f"{mod_name}.{name}: {result.failed} of {result.attempted} example lines failed"
