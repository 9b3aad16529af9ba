"""Issue 30: every public name (the ``__all__`` of each public module) has a docstring with a ``>>>`` example, and
those examples run as doctests (one case per name, so a failure names it). Data constants (dicts, tuples, strings)
cannot carry a docstring; their module's docstring documents them."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import re

import pytest
import torch
from conftest import require
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
        MODULES
    )


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


# ----------------------------------------------------------------------------- Args sections (issue 39 item 2)
# The API page renders each Google-style "Args:" entry as one row of a parameter table (with the signature's default):
# an entry that names several parameters ("a, b: ...") or one parameter's description that starts the next
# ("z: (n, d). sigma: ...") folds rows together. NamedTuple results list their fields under "Attributes:".
ARGS_MODULES = ("qkernels", "qkernels.nn")  # every parameter documented; the other modules: nothing folded
CALLABLES = [(m, n) for m, n in PUBLIC if callable(getattr(importlib.import_module(m), n))]


def _parameters(obj: object) -> list[str]:
    """The signature's parameters a caller passes (a class: its constructor's), less *args / **kwargs."""
    try:
        sig = inspect.signature(obj)
    except ValueError:  # a builtin constructor (an exception class): nothing to document
        return []
    return [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _is_named_tuple(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")


def _entries(obj: object) -> list[tuple[str, str]]:
    """(name, description) of each entry of the docstring's "Args:" ("Attributes:" for a NamedTuple) sections, as
    griffe's Google parser (the one mkdocstrings renders with) reads them."""
    griffe = require("griffe", "docs")
    doc = griffe.Docstring(inspect.cleandoc(obj.__doc__ or ""))
    kind = "attributes" if _is_named_tuple(obj) else "parameters"
    sections = griffe.parse_google(doc, warn_unknown_params=False, warn_missing_types=False, warnings=False)
    return [(e.name, e.description) for s in sections if s.kind.value == kind for e in s.value]


@pytest.mark.parametrize(
    ("mod_name", "name"),
    [c for c in CALLABLES if c[0] in ARGS_MODULES],
    ids=[f"{m}.{n}" for m, n in CALLABLES if m in ARGS_MODULES],
)
def test_every_parameter_has_its_own_args_entry(mod_name, name):
    obj = getattr(importlib.import_module(mod_name), name)
    names = [n for n, _ in _entries(obj)]
    for param in _parameters(obj):
        assert names.count(param) == 1, f"{mod_name}.{name}: {names.count(param)} Args entries for {param!r}: {names}"


@pytest.mark.parametrize(("mod_name", "name"), CALLABLES, ids=[f"{m}.{n}" for m, n in CALLABLES])
def test_no_args_entry_folds_several_parameters(mod_name, name):
    obj = getattr(importlib.import_module(mod_name), name)
    params = _parameters(obj)
    for entry, description in _entries(obj):
        assert entry.isidentifier(), f"{mod_name}.{name}: the entry {entry!r} names several parameters"
        for other in params:  # "z: (n, d). sigma: ..." reads as one row for z
            starts = re.search(rf"(^|[.;]\s+){re.escape(other)}:", description, re.M)
            assert other == entry or not starts, f"{mod_name}.{name}: {other!r} is folded into {entry!r}'s entry"
