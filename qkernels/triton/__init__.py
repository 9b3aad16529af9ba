"""Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1). Importing this package
registers the ``*_triton`` ops and the ``triton`` backend of every functional op."""

from qkernels.triton import hessian, kde, quantize  # noqa: F401
