"""``torch.library`` op registration, autograd wiring and backend dispatch, one module per hot path."""

# C++ ops (qkernels::<name>) with CPU and, when built, CUDA kernels.
NATIVE_OPS = ("latent_quantize", "relaxed_categorical", "finite_difference_curvature")
