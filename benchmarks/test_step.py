"""End-to-end training step (cases in qkernels/bench/step.py): one ``Trainer.train_step`` of tripod, cliff_vae,
qlae and factorqvae at their default CPU configuration, with qkernels' ``auto`` backends, the ``reference``
backend eager (the baseline) and ``reference_compiled`` (torch.compile of the model's loss; ``reference_compiled_ro``
too on CUDA). Peak memory (growth of peak RSS in a fresh subprocess, after a warm step) goes to extra_info.

    pytest benchmarks/test_step.py --benchmark-only --benchmark-group-by=param:case
"""

import pytest

from qkernels.bench import benchmark_case, cases, short_id

pytestmark = pytest.mark.bench_all  # minutes of torch.compile per method: only with --bench-all

PARAMS = [(c, v) for c in cases("step") for v in c.variants]


@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[short_id(c, v) for c, v in PARAMS])
def test_step(benchmark, case, variant):
    benchmark_case(benchmark, case, variant)
