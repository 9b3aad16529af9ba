"""User code over the public API, type-checked by ``mypy --strict`` (tests/test_typing.py) and also run.

Each annotated assignment states the type a user's checker must infer from qkernels' hints (py.typed): a wrong or
missing hint in qkernels makes mypy fail here. Tiny shapes: the test executes the file too.
"""

from __future__ import annotations

import torch

import qkernels
from qkernels import nn as qnn


def decoder(z: torch.Tensor) -> list[torch.Tensor]:
    return [torch.tanh(z @ torch.ones(z.shape[1], 3, dtype=z.dtype)), z.sin()]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(16, 3, generator=gen)

    backends: list[str] = qkernels.available_backends()
    with qkernels.use_backend("reference"):
        current: str = qkernels.current_backend()
    assert "reference" in backends and current == "reference"
    error: type[RuntimeError] = qkernels.BackendUnavailableError

    loss: torch.Tensor = qkernels.cliff_loss(z, grid=(-3.0, 3.0, 16), num_cond=4, generator=gen)
    terms: qkernels.CliffTerms = qkernels.cliff_loss(z, grid=(-3.0, 3.0, 16), num_cond=4, return_terms=True)
    total: torch.Tensor = terms.total
    density: torch.Tensor = qkernels.kde_grid(torch.linspace(-1, 1, 5).repeat(3, 1), z, 0.5)
    klm: torch.Tensor = qkernels.klm_loss(z, std=1.0)

    q: qkernels.Quantized = qkernels.latent_quantize(z, torch.linspace(-1, 1, 4))
    f: qkernels.Quantized = qkernels.fsq(z, [3, 5, 5])
    g: qkernels.GumbelQuantized = qkernels.gumbel_quantize(z, torch.linspace(-1, 1, 4), 0.5, generator=gen)
    c: qkernels.CategoricalSample = qkernels.categorical_latent(torch.randn(16, 3, 4, generator=gen))
    codes: torch.Tensor = q.indices + f.indices
    weights: torch.Tensor = g.weights
    kl: torch.Tensor = c.kl

    nhp = qkernels.normalized_hessian_penalty(decoder, z, generator=gen)
    hp = qkernels.hessian_penalty(decoder, z, generator=gen, reduction="none")
    curvature: torch.Tensor = qkernels.finite_difference_curvature(torch.randn(16 * 8, 4), 16, 2, 0.1)
    assert isinstance(nhp, torch.Tensor) and isinstance(hp, list)

    module_loss = qnn.CliffLoss(grid=(-3.0, 3.0, 16), num_cond=4)(z, generator=gen)
    klm_module: torch.Tensor = qnn.KLMLoss()(z)
    quantized: qkernels.Quantized = qnn.LatentQuantizer(3, 4)(z)
    levels: qkernels.Quantized = qnn.FSQ(5)(z)
    gumbel: qkernels.GumbelQuantized = qnn.GumbelQuantizer(4)(z, 0.5, generator=gen)
    sample: qkernels.CategoricalSample = qnn.CategoricalLatent(3, 4)(torch.randn(16, 3, 4))
    penalty = qnn.NormalizedHessianPenalty()(decoder, z, generator=gen) + qnn.HessianPenalty()(decoder, z)
    assert isinstance(module_loss, torch.Tensor) and isinstance(penalty, torch.Tensor)

    for t in (
        loss,
        total,
        density,
        klm,
        codes,
        weights,
        kl,
        curvature,
        klm_module,
        quantized.z_q,
        levels.z_q,
        gumbel.z_q,
        sample.z,
    ):
        assert isinstance(t, torch.Tensor)
    assert issubclass(error, RuntimeError)


if __name__ == "__main__":
    main()
