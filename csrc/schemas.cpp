// Schemas of every qkernels:: op, in one place. Kernels register per dispatch key next to their
// code: csrc/cpu/<hotpath>.cpp (CPU), csrc/cuda/<hotpath>_glue.cpp (CUDA, built with CUDA torch);
// the Triton twins (qkernels::<op>_triton) are Python custom ops (qkernels/ops/_library.py).
// Argument checks: csrc/include/qkernels/<hotpath>_checks.h, shared by both dispatch keys. Registered
// through the LibTorch stable ABI (csrc/include/qkernels/stable.h).
#include "qkernels/stable.h"

STABLE_TORCH_LIBRARY(qkernels, m) {
  // quantize
  m.def("latent_quantize(Tensor z, Tensor values) -> (Tensor z_q, Tensor indices, Tensor loss_quantize, Tensor loss_commit)");
  m.def("latent_quantize_backward(Tensor grad_z_q, Tensor grad_loss_quantize, Tensor grad_loss_commit, Tensor z, Tensor values, Tensor indices) -> (Tensor grad_z, Tensor grad_values)");
  m.def("relaxed_categorical(Tensor logits, Tensor values, Tensor? uniform, float tau, float noise_scale, bool hard) -> (Tensor z, Tensor y, Tensor kl)");
  m.def("relaxed_categorical_backward(Tensor grad_z, Tensor grad_y, Tensor grad_kl, Tensor logits, Tensor values, Tensor? uniform, Tensor y, float tau, float noise_scale) -> (Tensor grad_logits, Tensor grad_values)");
  // kde
  m.def("kde_grid(Tensor points, Tensor samples, float sigma, bool derivative) -> Tensor");
  m.def("kde_grid_backward(Tensor grad, Tensor points, Tensor samples, float sigma, bool derivative) -> (Tensor grad_points, Tensor grad_samples)");
  m.def("cliff_loss(Tensor z, Tensor cond_index, float sigma, float a, float b, int num_points, float lambda_uni, float lambda_biv, float lambda_kl) -> (Tensor total, Tensor uni, Tensor biv, Tensor kl)");
  m.def("cliff_loss_backward(Tensor? grad_total, Tensor? grad_uni, Tensor? grad_biv, Tensor? grad_kl, Tensor z, Tensor cond_index, float sigma, float a, float b, int num_points, float lambda_uni, float lambda_biv, float lambda_kl) -> Tensor grad_z");
  m.def("klm(Tensor z, Tensor? std) -> (Tensor loss, Tensor lse)");
  m.def("klm_backward(Tensor grad_loss, Tensor z, Tensor? std, Tensor lse) -> (Tensor grad_z, Tensor grad_std)");
  // hessian
  m.def("finite_difference_curvature(Tensor stacked, SymInt n, int num_perturbations, float eps, int groups, bool unbiased, str reduce) -> (Tensor values, Tensor argmax)");
  m.def("finite_difference_curvature_backward(Tensor grad, Tensor stacked, Tensor argmax, SymInt n, int num_perturbations, float eps, int groups, bool unbiased, str reduce) -> Tensor");
}
