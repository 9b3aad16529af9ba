"""Disentanglement and reconstruction metrics.

``sources`` ``(N, n_s)`` integer factor classes, ``latents`` ``(N, n_z)`` float or integer codes
(tensors or arrays); each disentanglement metric returns a plain dict, matrices oriented
``(n_s, n_z)``. ``evaluate`` samples a ground-truth dataset, encodes it and runs the metrics
registered in ``METRICS``, with a paper's own settings by name (``PROTOCOLS``: ``protocol="tripod"``...).

Everything here imports with torch and numpy alone: the metrics that need the ``metrics`` extra (scipy,
scikit-learn: ``infomec``, ``dci``, ``sap``, ``mcc``) check for it when called, and fail alone, in one line naming
themselves ("qkernels.metrics.dci needs scikit-learn: pip install 'qkernels[metrics]'"; ``evaluate`` checks the
metrics it will run before it encodes anything); ``psnr``, ``psnr_uint8``, ``mse``, ``mig``, ``modularity`` and the
protocols need nothing more.

Constants (plain data, no docstrings of their own):

- ``METRICS``: ``{name: function}`` of the metrics :func:`evaluate` runs by name ("infomec", "dci", "mig",
  "sap", "modularity", "mcc").
- ``PROTOCOLS``: ``{name: Protocol}`` of the papers' evaluations ("qlae", "tripod", "factorqvae", "dlib",
  "fast").
- ``METHOD_PROTOCOL``: ``{method name: protocol name}``, each method's authors' protocol (``qkernels train``'s
  default), e.g. ``METHOD_PROTOCOL["tripod"] == "tripod"``.
"""

from qkernels.metrics.dci import dci, disentanglement_completeness
from qkernels.metrics.evaluate import METRICS, evaluate
from qkernels.metrics.image import mse, psnr, psnr_uint8
from qkernels.metrics.infomec import infomec
from qkernels.metrics.mcc import mcc
from qkernels.metrics.mig import mig
from qkernels.metrics.modularity import modularity
from qkernels.metrics.protocols import METHOD_PROTOCOL, PROTOCOLS, Protocol, get_protocol
from qkernels.metrics.sap import sap

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
