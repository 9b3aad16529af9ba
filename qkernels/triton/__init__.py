"""Triton kernels and their launch functions (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).
The modules define kernels only: :mod:`qkernels.ops` registers them as ``qkernels::*_triton`` ops
where Triton can run, so importing qkernels never requires triton."""
