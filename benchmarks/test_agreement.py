"""The two tools agree: pytest-benchmark (:func:`qkernels.bench.pedantic`, the ``benchmark`` fixture) and
``qkernels bench``'s own measurement (:func:`qkernels.bench.time_variants`) time the same variant of one
shared case, in this process, one after the other; their interquartile ranges [q1, q3], each widened by
:data:`TOLERANCE` of its median, must overlap.

A case of a few ms with steady times: the eager reference of the Cliff loss at (n, d, M, K) = (64, 10, 10, 100)
(many small ops, a few ms per run), on one thread: with two, every op's OpenMP region waits for a thread
that another process may hold (tens of ms per op on a busy 2-core machine; see the load warnings), and the
two measurements, seconds apart, would compare machine load rather than the tools.

    pytest benchmarks/test_agreement.py --benchmark-only
"""

import pytest
import torch

from qkernels import bench

CASE = ("kde", "cliff n=64 d=10 M=10 K=100")
VARIANT = "reference"
TOLERANCE = 0.10  # each interval widened by 10% of its median: two runs of a loaded 2-core machine drift


def widened(q1: float, median: float, q3: float) -> tuple[float, float]:
    return q1 - TOLERANCE * median, q3 + TOLERANCE * median


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_pytest_benchmark_and_qkernels_bench_agree(benchmark, one_thread):
    case = bench.find_case(*CASE)
    bench.benchmark_case(benchmark, case, VARIANT, memory=False)
    if getattr(benchmark, "disabled", False):
        return
    s = benchmark.stats.stats
    ours = bench.summarize(case, bench.time_variants(case, [VARIANT], min_time=0.8))[0]
    benchmark.extra_info["qkernels_bench_median_s"] = ours["median_s"]
    a = widened(s.q1, s.median, s.q3)
    b = widened(ours["q1_s"], ours["median_s"], ours["q3_s"])
    text = (
        f"pytest-benchmark median {s.median * 1e3:.3f} ms [q1 {s.q1 * 1e3:.3f}, q3 {s.q3 * 1e3:.3f}], qkernels "
        f"bench median {ours['median_s'] * 1e3:.3f} ms [q1 {ours['q1_s'] * 1e3:.3f}, q3 {ours['q3_s'] * 1e3:.3f}]"
    )
    print(f"\n{CASE[1]} {VARIANT}: {text}")
    assert a[0] <= b[1] and b[0] <= a[1], f"the IQRs (widened by {TOLERANCE:.0%} of the median) do not overlap: {text}"
