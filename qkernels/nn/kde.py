"""Loss modules of the KDE hot path: Cliff (axis-aligned density cliffs) and Tripod's KLM."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from qkernels._args import check_grid, check_sigma
from qkernels.ops.kde import CliffTerms, cliff_loss, klm_loss

if TYPE_CHECKING or torch.distributed.is_available():  # typing.get_type_hints resolves it at run time
    from torch.distributed import ProcessGroup


class CliffLoss(nn.Module):
    """The Cliff criterion (eq. 8) with fixed hyper-parameters; see :func:`qkernels.cliff_loss`.

    forward(z (n, d), cond_index=None, generator=None, group=None) -> scalar (or CliffTerms when
    ``return_terms``). Defaults: the paper's Shapes3D optimum (sigma 0.1, grid (-5, 5, 100),
    lambdas 0.5 / 1.0 / 0.7) and M = 10 conditioning rows per latent. z: float32 / float64
    (half precision computed in float32).

    Args:
        sigma: the KDE bandwidth (> 0), in standardized units.
        grid: the integration grid (a, b, K), a < b, K >= 2.
        num_cond: M conditioning rows per latent, drawn in each forward without ``cond_index``.
        lambda_uni: weight of the univariate term.
        lambda_biv: weight of the bivariate term.
        lambda_kl: weight of the KL-to-uniform term.
        return_terms: forward returns :class:`~qkernels.CliffTerms` instead of the total.

    Raises:
        ValueError: sigma <= 0 or a bad grid (at construction); forward: as :func:`qkernels.cliff_loss`.

    Examples:
        >>> import torch
        >>> from qkernels.nn import CliffLoss
        >>> _ = torch.manual_seed(0)
        >>> loss = CliffLoss(sigma=0.2)(torch.randn(64, 3))
        >>> loss.shape
        torch.Size([])
        >>> CliffLoss(return_terms=True)(torch.randn(64, 3))._fields
        ('total', 'uni', 'biv', 'kl')
    """

    def __init__(
        self,
        *,
        sigma: float = 0.1,
        grid: tuple[float, float, int] = (-5.0, 5.0, 100),
        num_cond: int = 10,
        lambda_uni: float = 0.5,
        lambda_biv: float = 1.0,
        lambda_kl: float = 0.7,
        return_terms: bool = False,
    ) -> None:
        super().__init__()
        self.sigma = check_sigma(sigma)
        self.grid = check_grid(grid)
        self.num_cond = num_cond
        self.lambda_uni, self.lambda_biv, self.lambda_kl = lambda_uni, lambda_biv, lambda_kl
        self.return_terms = return_terms

    def forward(
        self,
        z: torch.Tensor,
        cond_index: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        group: ProcessGroup | None = None,
    ) -> torch.Tensor | CliffTerms:
        return cliff_loss(
            z,
            sigma=self.sigma,
            grid=self.grid,
            num_cond=self.num_cond,
            cond_index=cond_index,
            generator=generator,
            lambda_uni=self.lambda_uni,
            lambda_biv=self.lambda_biv,
            lambda_kl=self.lambda_kl,
            return_terms=self.return_terms,
            group=group,
        )

    def extra_repr(self) -> str:
        return (
            f"sigma={self.sigma}, grid={self.grid}, num_cond={self.num_cond}, lambda_uni={self.lambda_uni}, "
            f"lambda_biv={self.lambda_biv}, lambda_kl={self.lambda_kl}"
        )


class KLMLoss(nn.Module):
    """Tripod's kernel latent multiinformation; see :func:`qkernels.klm_loss`.

    forward(z (n, d), std=None, group=None) -> scalar; ``std``: (d,) scales or one number, default the
    population std of z + 1e-6. Tripod passes the std of the continuous pre-quantization latents
    (plus 1e-6) as ``std`` while z is quantized. ``group``: the global-batch loss under
    ``torch.distributed``. z: (n, d) float, n >= 2.

    Examples:
        >>> import torch
        >>> from qkernels.nn import KLMLoss
        >>> _ = torch.manual_seed(0)
        >>> z = torch.randn(128, 4)
        >>> KLMLoss()(z).shape
        torch.Size([])
        >>> bool(KLMLoss()(z, std=z.std(0) + 1e-6).isfinite())
        True
    """

    def __init__(self) -> None:
        super().__init__()

    def forward(
        self, z: torch.Tensor, std: torch.Tensor | float | None = None, group: ProcessGroup | None = None
    ) -> torch.Tensor:
        return klm_loss(z, std=std, group=group)
