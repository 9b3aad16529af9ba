"""Quantization forward + backward (cases in qkernels/bench/quantize.py): latent_quantize on every
backend, the reference and the materialized formulation, at (n, d, n_v) = (128, 12, 10),
(4096, 64, 64), (65536, 64, 64), per-dim and global codebooks; categorical_latent and gumbel_quantize on every
backend.
Peak memory (growth of peak RSS in a fresh subprocess) goes to extra_info.

    pytest benchmarks/test_quantize.py --benchmark-only --benchmark-group-by=param:case
"""

import pytest

from qkernels.bench import benchmark_case, cases, short_id

PARAMS = [(c, v) for c in cases("quantize") for v in c.variants]


@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[short_id(c, v) for c, v in PARAMS])
def test_quantize(benchmark, case, variant):
    benchmark_case(benchmark, case, variant)
