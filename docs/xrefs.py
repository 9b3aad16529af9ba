"""Griffe extension (mkdocs.yml, the python handler's ``extensions``): the docstrings' Sphinx-style roles
(``:func:`cliff_loss```, ``:class:`~qkernels.Quantized```, ``:mod:`qkernels.ops```, ...) become cross-references
on the site, while the docstrings keep the roles that read well in a terminal (``help()``).

A role's target is resolved as Python resolves the name where the docstring stands (a short name: the object's
own scope, then its parents', imports included; a dotted path from a package: as written), followed to its
canonical path, then mapped to its public name (``qkernels.ops.kde.cliff_loss`` -> ``qkernels.cliff_loss``, the
heading of the API page; a method follows its class). It is written as an optional mkdocs-autorefs reference: a
link where the site documents the target, plain inline code elsewhere (private helpers, modules without a section),
so that ``mkdocs build --strict`` never warns about it. ``~`` shows the last component only, as in Sphinx.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc|obj|const):`(~?)([\w.]+)`")


def _api_modules() -> tuple[str, ...]:
    """``API_MODULES`` of docs/hooks.py: the sections of the API page."""
    spec = importlib.util.spec_from_file_location("docs_hooks", Path(__file__).with_name("hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.API_MODULES


def _canonical(collection: griffe.ModulesCollection, path: str) -> str | None:
    """The canonical path of the object at ``path`` (import aliases followed), None if griffe does not know it."""
    try:
        return collection.get_member(path).canonical_path
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring of a package once griffe has loaded all of it."""

    def __init__(self) -> None:
        self.public: dict[str, str] = {}  # canonical path -> public path (a module section or an API heading)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: object) -> None:
        collection = loader.modules_collection
        for module in _api_modules():
            if module.split(".")[0] != pkg.name:
                continue
            self.public.setdefault(module, module)
            for name in importlib.import_module(module).__all__:
                canonical = _canonical(collection, f"{module}.{name}")
                if canonical:
                    self.public.setdefault(canonical, f"{module}.{name}")
        self._rewrite(pkg, collection)

    def _rewrite(self, obj: griffe.Object, collection: griffe.ModulesCollection) -> None:
        if obj.docstring is not None and ":`" in obj.docstring.value:
            obj.docstring.value = ROLE.sub(lambda m: self._reference(obj, collection, m), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member, collection)

    def _reference(self, obj: griffe.Object, collection: griffe.ModulesCollection, match: re.Match) -> str:
        short, name = match[1], match[2]
        text = name.rsplit(".", 1)[-1] if short else name
        target = self.target(obj, collection, name)
        if target is None:  # not a Python path: a link would go to any heading of that name
            return f"`{text}`"
        return f'<autoref identifier="{target}" optional><code>{text}</code></autoref>'

    def target(self, obj: griffe.Object, collection: griffe.ModulesCollection, name: str) -> str | None:
        """The identifier a role's ``name`` refers to from ``obj``'s docstring: its public path where it has one,
        else its canonical path; None when the name resolves to nothing."""
        first, _, rest = name.partition(".")
        if first in collection:  # a dotted path from a loaded package
            path = _canonical(collection, name) or name
        else:
            try:
                path = obj.resolve(first)
            except griffe.NameResolutionError:  # a class's inherited member (``:meth:`x``` of a subclass)?
                cls = next((o for o in (obj, obj.parent) if o is not None and o.is_class), None)
                if cls is None or first not in cls.all_members:
                    return None
                path = cls.all_members[first].canonical_path
            path += f".{rest}" if rest else ""
            path = _canonical(collection, path) or path
        parts = path.split(".")
        for i in range(len(parts), 0, -1):  # the longest public prefix: a method follows its class
            head = ".".join(parts[:i])
            if head in self.public:
                return ".".join([self.public[head], *parts[i:]])
        return path if "." in path else None
