"""Op definition (schema, fake, autograd, every backend: :mod:`qkernels.ops._library`) and the
functional API, one module per hot path.

Importing this package (directly, or through any op or module of qkernels that uses one) registers every op
(``torch.ops.qkernels.*``) and probes every backend once, so that backend selection is a table lookup, also while
torch.compile traces."""

from qkernels import _backend
from qkernels.ops import hessian, kde, quantize  # noqa: F401 - registers the ops of every hot path

_backend.warm()
