"""KDE hot path: the backends of its ops and the functional API (:func:`kde_grid`, :func:`cliff_loss`,
:func:`klm_loss`).

The ops (``torch.ops.qkernels.kde_grid``, ``cliff_loss``, ``klm``, each with a ``*_backward`` op, and their
``*_triton`` twins) are declared in :mod:`qkernels.decl.kde`; how an op is put together: :mod:`qkernels.ops._library`;
semantics: :mod:`qkernels.reference.kde`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple, overload

import torch

from qkernels._args import (
    check_cond_index,
    check_grid,
    check_latents,
    check_num_cond,
    check_numbers,
    check_points_and_samples,
    check_sigma,
)
from qkernels._backend import SELF_CHECKING, select
from qkernels._precision import compute_dtype, no_autocast, upcast
from qkernels._validation import check_finite, check_same, check_std, check_tensor, in_range, value_checks
from qkernels.decl import kde as decl
from qkernels.distributed import gather_rows
from qkernels.ops import _library as lib
from qkernels.reference import kde as ref

if TYPE_CHECKING or torch.distributed.is_available():  # typing.get_type_hints resolves it at run time
    from torch.distributed import ProcessGroup


class CliffTerms(NamedTuple):
    """The terms of :func:`cliff_loss` (``return_terms=True``), a named tuple of scalars.

    total = lambda_uni * uni + lambda_biv * biv + lambda_kl * kl (Cliff eq. 8).

    Attributes:
        total: the weighted sum.
        uni: l_uni, the univariate term.
        biv: l_biv, the bivariate JSD term (0 with d = 1).
        kl: l_KL-uni, the KL to the uniform.

    Examples:
        >>> import torch
        >>> import qkernels
        >>> _ = torch.manual_seed(0)
        >>> t = qkernels.cliff_loss(torch.randn(64, 3), return_terms=True)
        >>> t._fields
        ('total', 'uni', 'biv', 'kl')
        >>> torch.allclose(t.total, 0.5 * t.uni + 1.0 * t.biv + 0.7 * t.kl)
        True
    """

    total: torch.Tensor
    uni: torch.Tensor
    biv: torch.Tensor
    kl: torch.Tensor


# ----------------------------------------------------------------------------- backends
# (signatures, fake implementations, autograd and raw-argument checks: the declarations in qkernels.decl.kde)

_grid, _cliff, _klm = (lib.triton_kernels(m) for m in ("kde.grid", "kde.cliff", "kde.klm"))
lib.define_backends(
    decl.KDE_GRID, reference=ref.kde_grid, triton=None if _grid is None else (_grid.kde_grid, _grid.kde_grid_backward)
)
lib.define_backends(
    decl.CLIFF_LOSS,
    reference=ref.cliff_loss,
    triton=None if _cliff is None else (_cliff.cliff_loss, _cliff.cliff_loss_backward),
)
lib.define_backends(decl.KLM, reference=ref.klm, triton=None if _klm is None else (_klm.klm, _klm.klm_backward))


# ----------------------------------------------------------------------------- functional API


def kde_grid(points: torch.Tensor, samples: torch.Tensor, sigma: float, *, derivative: bool = False) -> torch.Tensor:
    """Per-latent Gaussian KDE (or its derivative d/dt) evaluated on per-latent points.

    Args:
        points: (d, K) evaluation points, K per latent.
        samples: (n, d) samples; column j is latent j's KDE.
        sigma: the bandwidth (> 0).
        derivative: return d/dt of the KDE instead of the density.

    Returns:
        (d, K): out[j, k] = 1/n sum_s N(points[j, k]; samples[s, j], sigma^2) (or its d/dt).
        Differentiable in points and samples. The fused backends drop kernel terms more than
        ``10 sigma`` from an evaluation point (relative size < 2e-22 of a term's peak). Half-precision
        inputs: computed and returned in float32 (:mod:`qkernels._precision`), otherwise points' dtype.

    Raises:
        ValueError: samples' d not points' d, sigma <= 0, devices that differ or NaN / inf values.

    Examples:
        One sample at 0, bandwidth 1: the standard normal density, 1 / sqrt(2 pi) at 0, slope 0.

        >>> import torch
        >>> import math, qkernels
        >>> qkernels.kde_grid(torch.zeros(1, 1), torch.zeros(1, 1), 1.0)
        tensor([[0.3989]])
        >>> out = qkernels.kde_grid(torch.tensor([[-1.0, 0.0, 1.0]]), torch.zeros(1, 1), 1.0)
        >>> torch.allclose(out, torch.exp(-torch.tensor([1.0, 0.0, 1.0]) / 2) / math.sqrt(2 * math.pi))
        True
        >>> qkernels.kde_grid(torch.zeros(1, 1), torch.zeros(1, 1), 1.0, derivative=True).abs()
        tensor([[0.]])
    """
    check_tensor("points", points, ndim=2, finite=False)
    check_tensor("samples", samples, ndim=2, finite=False)
    check_same("points", points, "samples", samples, dtype=False)
    check_points_and_samples(points.shape, samples.shape)
    sigma = check_sigma(sigma)
    dt = compute_dtype(points=points, samples=samples)
    backend, impl = select("kde_grid", points.device, dt, samples.numel() * points.shape[1])
    if backend not in SELF_CHECKING:
        check_finite("points", points)
        check_finite("samples", samples)
    with no_autocast(points.device):
        grid: torch.Tensor = impl(upcast(points, dt), upcast(samples, dt), sigma, bool(derivative))
    return grid


def _cond_index(
    cond_index: torch.Tensor | None,
    num_cond: int,
    generator: torch.Generator | None,
    n: int,
    d: int,
    device: torch.device,
) -> torch.Tensor:
    """(d, M) conditioning rows: drawn, or the user's (metadata checked here, values by the caller)."""
    if cond_index is None:
        check_num_cond(num_cond, n)
        # every latent's own M rows without replacement: the M smallest of n uniform keys per latent
        # (a uniformly random M-subset, as randperm(n)[:M]), two launches for all latents.
        # No generator=None keyword: it fails torch.compile with dynamic shapes
        kw = {"device": device} if generator is None else {"device": generator.device, "generator": generator}
        keys = torch.rand((d, n), **kw)
        rows = keys.topk(num_cond, dim=1, largest=False, sorted=False).indices
        return rows.to(device, non_blocking=True)  # a CPU generator: no host sync
    if not isinstance(cond_index, torch.Tensor):
        raise TypeError(f"cond_index must be a torch.Tensor or None, got {type(cond_index).__name__}")
    if cond_index.dtype != torch.long:
        raise TypeError(f"cond_index must be an int64 tensor, got dtype {cond_index.dtype}")
    check_cond_index(cond_index.shape, d)
    if cond_index.device != device:
        raise ValueError(f"cond_index is on {cond_index.device} but z is on {device}")
    return cond_index.contiguous()


def _check_latents(z: torch.Tensor) -> None:
    """z (n, d), n >= 2, d >= 1 (metadata; its values are checked once the backend is known)."""
    check_tensor("z", z, ndim=2, finite=False)
    check_latents(z.shape)


@overload
def cliff_loss(
    z: torch.Tensor,
    *,
    sigma: float = 0.1,
    grid: tuple[float, float, int] = (-5.0, 5.0, 100),
    num_cond: int = 10,
    cond_index: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    lambda_uni: float = 0.5,
    lambda_biv: float = 1.0,
    lambda_kl: float = 0.7,
    return_terms: Literal[False] = False,
    group: ProcessGroup | None = None,
) -> torch.Tensor: ...


@overload
def cliff_loss(
    z: torch.Tensor,
    *,
    sigma: float = 0.1,
    grid: tuple[float, float, int] = (-5.0, 5.0, 100),
    num_cond: int = 10,
    cond_index: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    lambda_uni: float = 0.5,
    lambda_biv: float = 1.0,
    lambda_kl: float = 0.7,
    return_terms: Literal[True],
    group: ProcessGroup | None = None,
) -> CliffTerms: ...


@overload
def cliff_loss(
    z: torch.Tensor,
    *,
    sigma: float = 0.1,
    grid: tuple[float, float, int] = (-5.0, 5.0, 100),
    num_cond: int = 10,
    cond_index: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    lambda_uni: float = 0.5,
    lambda_biv: float = 1.0,
    lambda_kl: float = 0.7,
    return_terms: bool = False,
    group: ProcessGroup | None = None,
) -> torch.Tensor | CliffTerms: ...


def cliff_loss(
    z: torch.Tensor,
    *,
    sigma: float = 0.1,
    grid: tuple[float, float, int] = (-5.0, 5.0, 100),
    num_cond: int = 10,
    cond_index: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    lambda_uni: float = 0.5,
    lambda_biv: float = 1.0,
    lambda_kl: float = 0.7,
    return_terms: bool = False,
    group: ProcessGroup | None = None,
) -> torch.Tensor | CliffTerms:
    """The Cliff criterion (Barin-Pacela et al., ICML 2025, eq. 8) of a batch of latents.

    z (n, d) is standardized per column (population variance clamped to >= 1e-12, so std >= 1e-6; a
    collapsed or constant latent is (z - mean) * 1e6 with the clamped std a constant: no gradient through it;
    every backend returns the same value and gradient there, tests/test_kde.py); then
    l_uni = sum_i H(|p_i'| / c) (eqs. 1-2), l_biv = sum_{i != j} JSD over the M conditioning values
    of the normalized |dp(z_i | z_j = zeta) / dz_i| (eqs. 3-6) and l_KL-uni = sum_i
    KL(U(-sqrt 3, sqrt 3) || p_i) (eq. 7, constant -log(2 sqrt 3), expectation over K points of
    linspace(-sqrt 3, sqrt 3, K)); densities are Gaussian KDEs of bandwidth ``sigma`` (eqs. 11-14),
    integrals (b - a)/K times sums over linspace(a, b, K) (eq. 15). With d = 1, l_biv is 0.

    Args:
        z: (n, d) float latents, n >= 2.
        sigma: the KDE bandwidth (> 0), in standardized units.
        grid: the integration grid (a, b, K): K points of linspace(a, b, K), a < b, K >= 2.
        num_cond: M conditioning rows per latent, drawn without replacement from ``generator``
            when ``cond_index`` is None (M <= n).
        cond_index: (d, M) int64 rows of z whose z_j values are latent j's conditioning values;
            None: drawn (``num_cond``, ``generator``).
        generator: the source of the drawn conditioning rows (None: the global RNG); unused with
            ``cond_index``.
        lambda_uni: weight of l_uni (the default is the paper's Shapes3D optimum, as for the others).
        lambda_biv: weight of l_biv.
        lambda_kl: weight of l_KL-uni.
        return_terms: return :class:`CliffTerms` instead of the total.
        group: a ``torch.distributed`` process group (e.g. ``torch.distributed.group.WORLD``): the loss
            of the GLOBAL batch, every rank's z gathered in rank order (n = the global batch size;
            ``cond_index`` / ``num_cond`` index it), the same value on every rank; averaged over
            ranks (as DistributedDataParallel does), the gradients are the single-process ones
            (:mod:`qkernels.distributed`). The conditioning rows must be drawn identically on every
            rank: pass ``cond_index`` or a ``generator`` seeded alike.

    Returns:
        The scalar total, or ``CliffTerms(total, uni, biv, kl)``; float32 for half-precision z
        (computed in float32 whatever autocast says: :mod:`qkernels._precision`).

    Drawn conditioning rows: latent j's rows are the M smallest of n uniform keys drawn from
    ``generator`` (a (d, n) ``torch.rand``, then ``topk``): a uniformly random subset of M rows per
    latent, as ``randperm(n)[:M]`` would give, in two launches for all latents.

    Backends: ``cpu`` drops Gaussian terms beyond 7.5 sigma in float32 / 10 sigma in float64 (below
    5e-12 / 2e-21 of a term's peak; csrc/include/qkernels/kde.h). ``triton`` computes the
    bivariate term as matrix products on the tensor cores (``tl.dot``: per pair and chunk of samples on
    the fused path, tiles up to 128 x 128; block-sparse over the samples sorted per latent on the GEMM
    path for larger tiles, which skips the derivative kernel's terms beyond 10 sigma). Their float32
    precision follows ``torch.get_float32_matmul_precision()`` as ``torch.matmul`` does on CUDA:
    "highest" 3xTF32 (about float32's own error; exact FMA products below 2^28 multiply-adds), "high"
    and "medium" TF32 (docs/design/precision.md). float64 stays float64 and exact.
    Launches per forward + backward on ``triton``: 2 for the draw, 6 for the loss (fused path). There
    is no CUDA C++ Cliff (the ``cuda`` backend does not implement it).

    Raises:
        ValueError: z not (n, d) with n >= 2, sigma <= 0, a bad grid, num_cond > n, a misshaped
            ``cond_index`` or one outside [0, n).
        TypeError: a non-int64 ``cond_index`` or a non-number lambda.

    Examples:
        >>> import torch
        >>> import qkernels
        >>> _ = torch.manual_seed(0)
        >>> z = torch.randn(64, 3, requires_grad=True)  # (n, d) float32
        >>> loss = qkernels.cliff_loss(z)
        >>> loss.shape, loss.dtype
        (torch.Size([]), torch.float32)
        >>> loss.backward(); z.grad.shape
        torch.Size([64, 3])
        >>> qkernels.cliff_loss(z[:, :1].detach(), return_terms=True).biv  # d = 1: no pairs
        tensor(0.)
    """
    if group is not None:
        z = gather_rows(z, group)
    _check_latents(z)
    n, d = z.shape
    sigma = check_sigma(sigma)
    a, b, k = check_grid(grid)
    check_numbers(lambda_uni=lambda_uni, lambda_biv=lambda_biv, lambda_kl=lambda_kl)
    idx = _cond_index(cond_index, num_cond, generator, n, d, z.device)
    dt = compute_dtype(z=z)
    backend, impl = select("cliff_loss", z.device, dt, d * d * n * idx.shape[1] * k)
    if backend not in SELF_CHECKING:
        check_finite("z", z)
        if cond_index is not None and value_checks(idx) and not in_range(idx, n):
            raise ValueError(f"cond_index must hold row indices in [0, {n}), got values outside")
    with no_autocast(z.device):
        total, uni, biv, kl = impl(
            upcast(z, dt), idx, sigma, a, b, k, float(lambda_uni), float(lambda_biv), float(lambda_kl)
        )
    return CliffTerms(total, uni, biv, kl) if return_terms else total


def klm_loss(
    z: torch.Tensor, *, std: torch.Tensor | float | None = None, group: ProcessGroup | None = None
) -> torch.Tensor:
    """Tripod's kernel latent multiinformation (Hsu et al., ICML 2024, eqs. 11-14).

    mean_b [log q(z_b) - sum_j log q_j(z_bj)] with Gaussian KDEs over the batch (no
    leave-one-out): joint bandwidth^2 = std^2 * ((4/(d+2))^(1/(d+4)) n^(-1/(d+4)))^2 (Silverman),
    marginal bandwidth = std.

    Args:
        z: (n, d) latents (Tripod: the quantized ones), n >= 2.
        std: (d,) positive scales, or one scale (a number or 0-d tensor) for every latent;
            differentiable. Default: the population std of z itself, z.std(0, correction=0) + 1e-6
            (differentiable in z); Tripod passes the std of the continuous (pre-quantization)
            latents plus 1e-6 instead (under ``group``: of the gathered batch,
            :func:`qkernels.distributed.gather_rows`).
        group: a ``torch.distributed`` process group: the KLM of the GLOBAL batch (every rank's z
            gathered in rank order; the default std is then the global one), as in :func:`cliff_loss`.

    Returns:
        Scalar loss (>= about 0 for independent latents, growing with dependence); float32 for
        half-precision z or std (:mod:`qkernels._precision`), otherwise z's dtype.

    Raises:
        ValueError: z not (n, d) with n >= 2, NaN / inf z, or a misshaped or non-positive ``std``.

    Examples:
        A copied latent is more dependent than an independent one:

        >>> import torch
        >>> import qkernels
        >>> _ = torch.manual_seed(0)
        >>> a, b = torch.randn(256, 1), torch.randn(256, 1)
        >>> qkernels.klm_loss(torch.cat([a, b], 1)).shape
        torch.Size([])
        >>> bool(qkernels.klm_loss(torch.cat([a, a], 1)) > qkernels.klm_loss(torch.cat([a, b], 1)))
        True
    """
    if group is not None:
        z = gather_rows(z, group)
    _check_latents(z)
    dt = compute_dtype(z=z, std=std if isinstance(std, torch.Tensor) else None)
    backend, impl = select("klm", z.device, dt, z.shape[0] * z.numel())
    checked = backend not in SELF_CHECKING
    if checked:
        check_finite("z", z)
    if std is not None:
        std = check_std(std, z, values=checked)
    with no_autocast(z.device):  # std None: the op computes the default std (from z in dt)
        loss: torch.Tensor = impl(upcast(z, dt), None if std is None else upcast(std, dt))[0]
    return loss
