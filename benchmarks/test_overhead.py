"""Per-call overhead of the functional API at tiny shapes (cases in qkernels/bench/overhead.py):
forward + backward of every op through its public function (``<backend>``) and through the backend
implementation called directly (``<backend> raw``); the difference is what validation, backend
selection and autograd wiring add per call. ``add``: one bare torch.add forward + backward.

    pytest benchmarks/test_overhead.py --benchmark-only --benchmark-group-by=param:case
"""

import pytest

from qkernels.bench import benchmark_case, cases, short_id

PARAMS = [(c, v) for c in cases("overhead") for v in c.variants]


@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[short_id(c, v) for c, v in PARAMS])
def test_overhead(benchmark, case, variant):
    benchmark_case(benchmark, case, variant)
