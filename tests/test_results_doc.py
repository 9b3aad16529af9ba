"""Issue 28: the top of benchmarks/RESULTS.md (the summary table and the "Latest run" tables) is what
``benchmarks/summarize.py`` generates from the saved results under benchmarks/results/, so it cannot drift from them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from qkernels.bench import results

ROOT = Path(__file__).resolve().parent.parent


def _summarize():
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "benchmarks" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_generated_from_the_saved_results():
    summarize = _summarize()
    records = results.load([ROOT / "benchmarks" / "results"])
    assert records, "no saved results under benchmarks/results"
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    summary = "\n".join(summarize.table(records))
    details = "\n".join(summarize.details(records)).strip("\n")
    assert summary in text, "RESULTS.md's summary differs from `python benchmarks/summarize.py --markdown`"
    assert details in text, "RESULTS.md's 'Latest run' differs from `python benchmarks/summarize.py --details`"
    assert text.index(summary) < text.index(details) < text.index("## Quantization")
