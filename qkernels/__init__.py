"""qkernels: fused kernels for quantized / discrete disentangled representation learning."""

from qkernels import _backend
from qkernels._backend import (
    BackendUnavailableError,
    available_backends,
    current_backend,
    use_backend,
)
from qkernels.ops.hessian import finite_difference_curvature, hessian_penalty, normalized_hessian_penalty
from qkernels.ops.kde import CliffTerms, cliff_loss, kde_grid, klm_loss
from qkernels.ops.quantize import (
    CategoricalSample,
    GumbelQuantized,
    Quantized,
    categorical_latent,
    fsq,
    gumbel_quantize,
    latent_quantize,
)

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (statically) for the package metadata

_backend.warm()  # backend selection becomes a table lookup (torch.compile traces through it)

# subpackages reachable as attributes after a plain `import qkernels` (qkernels.nn.CliffLoss, qkernels.data...),
# imported on first use (PEP 562) so that `import qkernels` stays as fast as the ops alone
SUBPACKAGES = ("nn", "metrics", "data", "models", "train", "compat", "bench", "reference")


def __getattr__(name: str) -> object:
    if name in SUBPACKAGES:
        import importlib

        return importlib.import_module(f"qkernels.{name}")
    raise AttributeError(f"module 'qkernels' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *SUBPACKAGES})

__all__ = [
    "available_backends",
    "BackendUnavailableError",
    "categorical_latent",
    "CategoricalSample",
    "cliff_loss",
    "CliffTerms",
    "current_backend",
    "finite_difference_curvature",
    "fsq",
    "gumbel_quantize",
    "GumbelQuantized",
    "hessian_penalty",
    "kde_grid",
    "klm_loss",
    "latent_quantize",
    "normalized_hessian_penalty",
    "Quantized",
    "use_backend",
]
