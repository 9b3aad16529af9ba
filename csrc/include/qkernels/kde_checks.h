// Argument checks of the KDE ops, shared by the CPU kernels (csrc/cpu/kde.cpp), the CUDA glue
// (csrc/cuda/kde_glue.cpp) and the XLA FFI handlers (csrc/jax/kde_ffi.cpp): templates over the front-end's
// tensor type (qkernels/check_core.h). Never include from a .cu kernel file.
#pragma once

#include <optional>

#include "qkernels/checks.h"

namespace qkernels {

template <typename X>
void check_klm(const X& z, const std::optional<X>& std, const char* op) {
  QK_CHECK(z.dim() == 2 && z.size(0) >= 1 && z.size(1) >= 1, op, ": z must be (n, d), got ", shape(z));
  check_floating(z, "z", op);
  if (!std.has_value()) return;
  QK_CHECK(std->dim() == 1 && std->size(0) == z.size(1), op, ": std must be (d,), got ", shape(*std));
  check_like(*std, "std", z, "z", op);
}

template <typename X>
void check_klm_backward(const X& grad_loss, const X& z, const std::optional<X>& std, const X& lse, const char* op) {
  check_klm(z, std, op);
  check_scalar_grad(grad_loss, "grad_loss", z, op);
  QK_CHECK(lse.dim() == 2 && lse.size(0) == z.size(0) && lse.size(1) == z.size(1) + 1, op,
           ": lse must be (n, d + 1) = (", z.size(0), ", ", z.size(1) + 1, "), got ", shape(lse));
  check_like(lse, "lse", z, "z", op);
}

template <typename X>
void check_kde_grid(const X& points, const X& samples, double sigma, const char* op) {
  QK_CHECK(points.dim() == 2 && samples.dim() == 2 && samples.size(1) == points.size(0), op,
           ": points must be (d, K) and samples (n, d), got ", shape(points), " and ", shape(samples));
  check_floating(points, "points", op);
  check_like(samples, "samples", points, "points", op);
  QK_CHECK(samples.size(0) >= 1 && points.numel() >= 1, op, ": empty points or samples");
  QK_CHECK(sigma > 0, op, ": sigma must be > 0");
}

template <typename X>
void check_kde_grid_backward(const X& grad, const X& points, const X& samples, double sigma, const char* op) {
  check_kde_grid(points, samples, sigma, op);
  QK_CHECK(same_shape(grad, points), op, ": grad must be shaped like points ", shape(points), ", got ",
           shape(grad));
  QK_CHECK(device_of(grad) == device_of(points), op, ": grad is on ", device_of(grad), " but points is on ",
           device_of(points));
}

// int32_index: cond_index may be int32 (JAX without x64), else int64.
template <typename X>
void check_cliff_loss(const X& z, const X& cond, double sigma, double a, double b, int64_t num_points, const char* op,
                      bool int32_index = false) {
  QK_CHECK(z.dim() == 2 && z.size(0) >= 1 && z.size(1) >= 1, op, ": z must be (n, d), got ", shape(z));
  check_floating(z, "z", op);
  QK_CHECK(cond.dim() == 2 && cond.size(0) == z.size(1) && cond.size(1) >= 1, op,
           ": cond_index must be (d, M), got ", shape(cond));
  check_index(cond, "cond_index", z, op, int32_index);
  check_index_range(cond, z.size(0), "cond_index", op);
  QK_CHECK(sigma > 0 && a < b && num_points >= 2, op, ": need sigma > 0, a < b and num_points >= 2, got sigma ",
           sigma, ", a ", a, ", b ", b, ", num_points ", num_points);
}

// The one-element upstream gradients of (total, uni, biv, kl), each optional (absent: 0).
template <typename X>
void check_cliff_loss_backward(const std::optional<X>* grads, const X& z, const X& cond, double sigma, double a,
                               double b, int64_t num_points, const char* op, bool int32_index = false) {
  check_cliff_loss(z, cond, sigma, a, b, num_points, op, int32_index);
  const char* names[4] = {"grad_total", "grad_uni", "grad_biv", "grad_kl"};
  for (int i = 0; i < 4; ++i) {
    if (grads[i].has_value()) check_scalar_grad(*grads[i], names[i], z, op);
  }
}

}  // namespace qkernels
