"""qkernels: fused kernels for quantized / discrete disentangled representation learning."""

from qkernels._backend import (
    BackendUnavailableError,
    available_backends,
    current_backend,
    use_backend,
)
from qkernels.ops.hessian import finite_difference_curvature, hessian_penalty, normalized_hessian_penalty
from qkernels.ops.quantize import (
    CategoricalSample,
    GumbelQuantized,
    Quantized,
    categorical_latent,
    fsq,
    gumbel_quantize,
    latent_quantize,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "CategoricalSample",
    "GumbelQuantized",
    "Quantized",
    "available_backends",
    "finite_difference_curvature",
    "hessian_penalty",
    "normalized_hessian_penalty",
    "categorical_latent",
    "current_backend",
    "fsq",
    "gumbel_quantize",
    "latent_quantize",
    "use_backend",
]
