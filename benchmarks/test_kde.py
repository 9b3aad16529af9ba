"""KDE hot path, forward + backward (cases in qkernels/bench/kde.py): Cliff loss at (n, d, M, K) =
(64, 10, 10, 100), (1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128) (and (16384, 32, 128,
128) on a GPU) and KLM at (n, d) = (64, 12), (1024, 32), (4096, 64) (and (16384, 32) on a GPU) (float32),
for every backend on this machine, the reference (dense GEMM form) and the fully materialized formulation
where it fits (<= 2e8 elements; the dense KLM reference at (4096, 64) would need > 10 GB and is left out).
Peak memory (growth of peak RSS in a fresh subprocess) goes to extra_info["peak_mib"].

    pytest benchmarks/test_kde.py --benchmark-only
"""

import pytest

from qkernels.bench import benchmark_case, cases, short_id

PARAMS = [(c, v) for c in cases("kde") for v in c.variants]


@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[short_id(c, v) for c, v in PARAMS])
def test_kde(benchmark, case, variant):
    benchmark_case(benchmark, case, variant)
