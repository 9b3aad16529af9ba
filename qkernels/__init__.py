"""qkernels: fused kernels for quantized / discrete disentangled representation learning.

``import qkernels`` imports nothing heavy (not even torch): the ops (``qkernels.cliff_loss``, ...) are loaded with
torch, their ``torch.ops.qkernels`` registrations and the native extension on first use of any of them, and
the subpackages (``qkernels.nn``, ``qkernels.data``, ...) on first use of each (PEP 562), so that the ``qkernels``
command answers ``--help`` at once. ``import qkernels.ops`` loads the ops explicitly (for raw
``torch.ops.qkernels.*`` calls before any other use).
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (statically) for the package metadata

if TYPE_CHECKING:  # what the names of _MODULES resolve to, for type checkers and documentation tools (re-exported)
    from qkernels._backend import BackendUnavailableError as BackendUnavailableError
    from qkernels._backend import available_backends as available_backends
    from qkernels._backend import current_backend as current_backend
    from qkernels._backend import use_backend as use_backend
    from qkernels.ops.hessian import finite_difference_curvature as finite_difference_curvature
    from qkernels.ops.hessian import hessian_penalty as hessian_penalty
    from qkernels.ops.hessian import normalized_hessian_penalty as normalized_hessian_penalty
    from qkernels.ops.kde import CliffTerms as CliffTerms
    from qkernels.ops.kde import cliff_loss as cliff_loss
    from qkernels.ops.kde import kde_grid as kde_grid
    from qkernels.ops.kde import klm_loss as klm_loss
    from qkernels.ops.quantize import CategoricalSample as CategoricalSample
    from qkernels.ops.quantize import GumbelQuantized as GumbelQuantized
    from qkernels.ops.quantize import Quantized as Quantized
    from qkernels.ops.quantize import categorical_latent as categorical_latent
    from qkernels.ops.quantize import fsq as fsq
    from qkernels.ops.quantize import gumbel_quantize as gumbel_quantize
    from qkernels.ops.quantize import latent_quantize as latent_quantize

# the public names of each module; importing qkernels.ops registers every op and warms backend selection
_MODULES = {
    "qkernels._backend": ("BackendUnavailableError", "available_backends", "current_backend", "use_backend"),
    "qkernels.ops.hessian": ("finite_difference_curvature", "hessian_penalty", "normalized_hessian_penalty"),
    "qkernels.ops.kde": ("CliffTerms", "cliff_loss", "kde_grid", "klm_loss"),
    "qkernels.ops.quantize": (
        "CategoricalSample",
        "GumbelQuantized",
        "Quantized",
        "categorical_latent",
        "fsq",
        "gumbel_quantize",
        "latent_quantize",
    ),
}
_OPS = {name: module for module, names in _MODULES.items() for name in names}

# subpackages reachable as attributes after a plain `import qkernels` (qkernels.nn.CliffLoss, qkernels.data...),
# imported on first use (PEP 562)
SUBPACKAGES = ("nn", "metrics", "data", "models", "train", "compat", "bench", "reference")


def __getattr__(name: str) -> object:
    import importlib

    if name in _OPS:
        importlib.import_module("qkernels.ops")
        value = getattr(importlib.import_module(_OPS[name]), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    if name in SUBPACKAGES:
        return importlib.import_module(f"qkernels.{name}")
    raise AttributeError(f"module 'qkernels' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_OPS, *SUBPACKAGES})


__all__ = list(_OPS)  # the names of _MODULES (their imports above are the type checkers' view)
