"""Disentanglement and reconstruction metrics.

``sources`` ``(N, n_s)`` integer factor classes, ``latents`` ``(N, n_z)`` float or integer codes
(tensors or arrays); each disentanglement metric returns a plain dict, matrices oriented
``(n_s, n_z)``. ``evaluate`` samples a ground-truth dataset, encodes it and runs the metrics
registered in ``METRICS``, with a paper's own settings by name (``PROTOCOLS``: ``protocol="tripod"``...).

Each name is imported on first use (PEP 562), so that a name whose module needs the ``metrics`` extra (scipy,
scikit-learn: ``dci``, ``infomec``, ``sap``, ``mcc``, ``evaluate`` and ``METRICS``) fails alone, with one line
naming it ("qkernels.metrics.dci needs scikit-learn: pip install 'qkernels[metrics]'"), while ``psnr``,
``psnr_uint8``, ``mse``, ``mig``, ``modularity`` and the protocols need torch and numpy only.

Constants (plain data, no docstrings of their own):

- ``METRICS``: ``{name: function}`` of the metrics :func:`evaluate` runs by name ("infomec", "dci", "mig",
  "sap", "modularity", "mcc").
- ``PROTOCOLS``: ``{name: Protocol}`` of the papers' evaluations ("qlae", "tripod", "factorqvae", "dlib",
  "fast").
- ``METHOD_PROTOCOL``: ``{method name: protocol name}``, each method's authors' protocol (``qkernels train``'s
  default), e.g. ``METHOD_PROTOCOL["tripod"] == "tripod"``.
"""

import sys
import types
from typing import TYPE_CHECKING

from qkernels.metrics.protocols import METHOD_PROTOCOL, PROTOCOLS, Protocol, get_protocol

if TYPE_CHECKING:  # what the names below resolve to (type checkers and documentation tools read these)
    from qkernels.metrics.dci import dci, disentanglement_completeness
    from qkernels.metrics.evaluate import METRICS, evaluate
    from qkernels.metrics.image import mse, psnr, psnr_uint8
    from qkernels.metrics.infomec import infomec
    from qkernels.metrics.mcc import mcc
    from qkernels.metrics.mig import mig
    from qkernels.metrics.modularity import modularity
    from qkernels.metrics.sap import sap

# public name -> the module that defines it (imported on first use)
_LAZY = {
    "dci": "qkernels.metrics.dci",
    "disentanglement_completeness": "qkernels.metrics.dci",
    "METRICS": "qkernels.metrics.evaluate",
    "evaluate": "qkernels.metrics.evaluate",
    "mse": "qkernels.metrics.image",
    "psnr": "qkernels.metrics.image",
    "psnr_uint8": "qkernels.metrics.image",
    "infomec": "qkernels.metrics.infomec",
    "mcc": "qkernels.metrics.mcc",
    "mig": "qkernels.metrics.mig",
    "modularity": "qkernels.metrics.modularity",
    "sap": "qkernels.metrics.sap",
}


def __getattr__(name: str) -> object:
    import importlib

    from qkernels._extras import DISTRIBUTIONS, MissingExtraError

    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(_LAZY[name])
    except MissingExtraError as err:  # worded for the module that needed it: name what was asked for
        dist = DISTRIBUTIONS.get((err.name or "").partition(".")[0], err.name)
        raise MissingExtraError(
            f"{__name__}.{name} needs {dist}: pip install 'qkernels[metrics]'", name=err.name
        ) from None
    value = getattr(module, name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """This package, whose functions share their names with the modules that define them (``dci`` in dci.py):
    when the import system binds such a module to the package (``setattr(package, "dci", module)``, on its first
    import from anywhere), the function keeps the name, as an eager ``from qkernels.metrics.dci import dci`` here
    would leave it."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "METHOD_PROTOCOL",
    "METRICS",
    "PROTOCOLS",
    "Protocol",
    "dci",
    "disentanglement_completeness",
    "evaluate",
    "get_protocol",
    "infomec",
    "mcc",
    "mig",
    "modularity",
    "mse",
    "psnr",
    "psnr_uint8",
    "sap",
]
