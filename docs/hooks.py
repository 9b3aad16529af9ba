"""MkDocs hooks: pages generated from the code so they cannot drift from it.

- ``<!-- cli-reference -->``: the ``qkernels`` command's argparse parser, every subcommand and flag;
- ``<!-- api-reference -->``: one mkdocstrings block per name in ``qkernels.__all__`` and ``qkernels.nn.__all__``.
"""

from __future__ import annotations

import argparse


def _cli_markdown() -> str:
    from qkernels.cli import parser

    top = parser()
    out = ["```text", top.format_help().rstrip(), "```", ""]
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for name, sub in action.choices.items():
            out += [f"## qkernels {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _api_markdown() -> str:
    import qkernels
    import qkernels.nn

    out = ["## qkernels", ""]
    out += [f"::: qkernels.{name}\n" for name in qkernels.__all__]
    out += ["## qkernels.nn", ""]
    out += [f"::: qkernels.nn.{name}\n" for name in qkernels.nn.__all__]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", _cli_markdown())
    if "<!-- api-reference -->" in markdown:
        markdown = markdown.replace("<!-- api-reference -->", _api_markdown())
    return markdown
