"""qkernels: fused kernels for quantized / discrete disentangled representation learning."""

from qkernels._backend import (
    BackendUnavailableError,
    available_backends,
    current_backend,
    use_backend,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "available_backends",
    "current_backend",
    "use_backend",
]
