"""Triton kernels of the KDE hot path and their launch functions, one module per kernel family
(registered as the ops ``qkernels::klm_triton``, ``kde_grid_triton``, ``cliff_loss_triton`` and their
``*_backward_triton`` by :mod:`qkernels.ops.kde`, which also checks their arguments):

- :mod:`~qkernels.triton.kde.klm`: Tripod's KLM, KeOps-shaped (each row held by its threads, the samples
  streamed past it);
- :mod:`~qkernels.triton.kde.grid`: ``kde_grid``, per-latent Gaussian KDEs (or derivatives) on given points;
- :mod:`~qkernels.triton.kde.cliff`: the Cliff loss, which takes one of two paths by shape:
  :mod:`~qkernels.triton.kde.cliff_fused` (small tiles, one program per latent pair) or
  :mod:`~qkernels.triton.kde.cliff_gemm` (block-sparse tensor-core products, large shapes), with the
  jit helpers both share in :mod:`~qkernels.triton.kde._cliff_common`.

Same math as csrc/include/qkernels/kde.h and csrc/cpu/kde.cpp; semantics:
:mod:`qkernels.reference.kde`. No (n, n, d) or (n, n) tensor is written to memory: KLM streams
samples past rows held in registers, kde_grid streams samples (forward and points' gradient) or points
(samples' gradient). Every reduction is owned by one program and summed in a fixed order, so results are
deterministic.
"""
