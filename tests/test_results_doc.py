"""benchmarks/RESULTS.md is the generated summary: its summary table and its "Latest run" tables are what
``benchmarks/summarize.py`` makes of the saved results under benchmarks/results/, so they cannot drift from them (issue
28). The logs live in benchmarks/HISTORY.md and the design notes in docs/design/ (issue 54); RESULTS.md links both."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from qkernels.bench import results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def _summarize():
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "benchmarks" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_generated_from_the_saved_results():
    summarize = _summarize()
    records = results.load([ROOT / "benchmarks" / "results"])
    assert records, "no saved results under benchmarks/results"
    text = RESULTS.read_text()
    summary = "\n".join(summarize.table(records))
    details = "\n".join(summarize.details(records)).strip("\n")
    assert summary in text, "RESULTS.md's summary differs from `python benchmarks/summarize.py --markdown`"
    assert details in text, "RESULTS.md's 'Latest run' differs from `python benchmarks/summarize.py --details`"
    assert text.index(summary) < text.index(details) < text.index("## Design notes and logs")


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings (lower case, punctuation but - and _ dropped, spaces -)."""
    heads = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_results_md_links_reach_their_files_and_sections():
    """Every relative link of RESULTS.md and HISTORY.md names a file that exists, and an anchor a heading there."""
    for page in (RESULTS, ROOT / "benchmarks" / "HISTORY.md"):
        links = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text())
        assert links, page
        for target, anchor in links:
            if target.startswith(("http://", "https://")):
                continue
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.name}: link to {target} (missing)"
            if anchor:
                assert anchor in _anchors(path.read_text()), f"{page.name}: #{anchor} is no heading of {path.name}"
