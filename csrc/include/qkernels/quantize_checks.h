// Argument checks of the quantization ops, shared by the CPU kernels (csrc/cpu/quantize.cpp), the CUDA glue
// (csrc/cuda/quantize_glue.cpp) and the XLA FFI handlers (csrc/jax/quantize_ffi.cpp): templates over the
// front-end's tensor type (qkernels/check_core.h). Never include from a .cu kernel file.
#pragma once

#include <optional>

#include "qkernels/checks.h"

namespace qkernels {

// z (N, d) and a codebook values (1, n_v) or (d, n_v) of z's dtype and device.
template <typename X>
void check_codebook(const X& z, const X& values, const char* op) {
  QK_CHECK(z.dim() == 2 && z.size(0) >= 1 && z.size(1) >= 1, op, ": z must be a non-empty (N, d), got ",
           shape(z));
  check_floating(z, "z", op);
  QK_CHECK(values.dim() == 2 && (values.size(0) == 1 || values.size(0) == z.size(1)) && values.size(1) >= 1, op,
           ": values must be (1, n_v) or (d, n_v) with d = ", z.size(1), ", n_v >= 1, got ", shape(values));
  check_like(values, "values", z, "z", op);
}

// int32_index: the indices may be int32 (JAX without x64), else int64.
template <typename X>
void check_latent_quantize_backward(const X& grad_zq, const X& grad_lq, const X& grad_lc, const X& z, const X& values,
                                    const X& idx, const char* op, bool int32_index = false) {
  check_codebook(z, values, op);
  QK_CHECK(same_shape(grad_zq, z), op, ": grad_zq must be shaped like z ", shape(z), ", got ",
           shape(grad_zq));
  check_like(grad_zq, "grad_zq", z, "z", op);
  check_scalar_grad(grad_lq, "grad_loss_quantize", z, op);
  check_scalar_grad(grad_lc, "grad_loss_commit", z, op);
  QK_CHECK(same_shape(idx, z), op, ": indices must be shaped like z ", shape(z), ", got ", shape(idx));
  check_index(idx, "indices", z, op, int32_index);
  check_index_range(idx, values.size(1), "indices", op);
}

// logits (N, d, K), values (1, K) or (d, K), uniform (N, d, K) or none.
template <typename X>
void check_categorical(const X& logits, const X& values, const std::optional<X>& uniform, const char* op) {
  QK_CHECK(logits.dim() == 3 && logits.numel() > 0, op, ": logits must be a non-empty (N, d, K), got ",
           shape(logits));
  check_floating(logits, "logits", op);
  QK_CHECK(values.dim() == 2 && (values.size(0) == 1 || values.size(0) == logits.size(1)) &&
               values.size(1) == logits.size(2),
           op, ": values must be (1, K) or (d, K) with d = ", logits.size(1), ", K = ", logits.size(2), ", got ",
           shape(values));
  check_like(values, "values", logits, "logits", op);
  if (uniform.has_value()) {
    QK_CHECK(same_shape(*uniform, logits), op, ": uniform must be shaped like logits ", shape(logits),
             ", got ", shape(*uniform));
    check_like(*uniform, "uniform", logits, "logits", op);
  }
}

template <typename X>
void check_categorical_backward(const X& grad_z, const X& grad_y, const X& grad_kl, const X& logits, const X& values,
                                const std::optional<X>& uniform, const X& y, const char* op) {
  check_categorical(logits, values, uniform, op);
  const auto is_nd = [&](const X& t) { return t.dim() == 2 && t.size(0) == logits.size(0) && t.size(1) == logits.size(1); };
  QK_CHECK(is_nd(grad_z) && is_nd(grad_kl), op, ": grad_z and grad_kl must be (N, d) = ",
           Shape{{logits.size(0), logits.size(1)}, 2});
  QK_CHECK(same_shape(grad_y, logits) && same_shape(y, logits), op,
           ": grad_y and y must be shaped like logits ", shape(logits));
  check_like(grad_z, "grad_z", logits, "logits", op);
  check_like(grad_kl, "grad_kl", logits, "logits", op);
  check_like(grad_y, "grad_y", logits, "logits", op);
  check_like(y, "y", logits, "logits", op);
}

}  // namespace qkernels
