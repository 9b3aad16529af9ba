"""MkDocs hooks: pages generated from the code so they cannot drift from it.

- ``<!-- cli-reference -->``: the ``qkernels`` command's argparse parser, every subcommand and flag;
- ``<!-- api-reference -->``: one section per public module (:data:`API_MODULES`): its docstring, then one
  mkdocstrings block per name in its ``__all__``;
- the math renderer, served by the site itself (equations render offline): MathJax from the installed
  ``sphinx-mathjax-offline`` package (the ``docs`` extra), copied to :data:`MATHJAX` (mkdocs.yml's ``extra_javascript``
  loads its entry point ``tex-mml-chtml.js`` from there).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
from pathlib import Path

# the public modules, in the order of the API page; tests/test_docs.py and tests/test_docstrings.py check them
API_MODULES = (
    "qkernels",
    "qkernels.nn",
    "qkernels.metrics",
    "qkernels.train",
    "qkernels.models",
    "qkernels.data",
    "qkernels.compat.vector_quantize_pytorch",
)


MATHJAX = "assets/mathjax"  # where the site serves MathJax from


def _mathjax_files() -> Path:
    """The folder of MathJax's browser build that ``sphinx-mathjax-offline`` installs."""
    from mkdocs.exceptions import PluginError  # mkdocs imports: the tests read API_MODULES without mkdocs

    try:
        dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    except importlib.metadata.PackageNotFoundError as err:
        raise PluginError('MathJax for the docs comes from sphinx-mathjax-offline: pip install -e ".[docs]"') from err
    return Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))


def _cli_markdown() -> str:
    from qkernels.cli import parser

    top = parser()
    out = ["```text", top.format_help().rstrip(), "```", ""]
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for name, sub in action.choices.items():
            out += [f"## qkernels {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _api_block(module: str, name: str) -> str:
    """The mkdocstrings block of ``module.name``. Where a submodule of the same name shadows that path for griffe
    (``qkernels.metrics.dci`` the function vs the module ``qkernels/metrics/dci.py``), the object is documented
    at its defining path under the public name, with an anchor of the public path."""
    public = f"{module}.{name}"
    obj = getattr(importlib.import_module(module), name)
    mod = importlib.import_module(module)
    if not callable(obj) or not hasattr(mod, "__path__") or importlib.util.find_spec(public) is None:
        return f"::: {public}\n"
    return (
        f'<a id="{public}"></a>\n\n::: {obj.__module__}.{obj.__qualname__}\n    options:\n'
        f"      heading: {public}\n      toc_label: {public}\n"
    )


def _api_markdown() -> str:
    out = []
    for module in API_MODULES:
        names = importlib.import_module(module).__all__
        out += [
            f"## {module}",
            "",
            f"::: {module}",
            "    options:",
            "      members: false",
            "      show_root_heading: false",
            "",
        ]
        out += [_api_block(module, name) for name in names]
    return "\n".join(out)


def on_files(files, config):
    """Serve MathJax with the site: all of its browser build, since it loads its parts from its own folder at run time
    (the fonts always, TeX extensions when a page uses them, the menu's renderers and accessibility tools on demand)."""
    from mkdocs.structure.files import File

    root = _mathjax_files()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        files.append(File.generated(config, f"{MATHJAX}/{path.relative_to(root).as_posix()}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", _cli_markdown())
    if "<!-- api-reference -->" in markdown:
        markdown = markdown.replace("<!-- api-reference -->", _api_markdown())
    return markdown
