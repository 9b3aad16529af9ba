// Argument checks of the quantization ops, shared by the CPU kernels (csrc/cpu/quantize.cpp) and
// the CUDA glue (csrc/cuda/quantize_glue.cpp). Uses torch's stable ABI: never include from a .cu kernel file.
#pragma once

#include <optional>

#include "qkernels/checks.h"

namespace qkernels {

// z (N, d) and a codebook values (1, n_v) or (d, n_v) of z's dtype and device.
inline void check_codebook(const Tensor& z, const Tensor& values, const char* op) {
  QK_CHECK(z.dim() == 2 && z.size(0) >= 1 && z.size(1) >= 1, op, ": z must be a non-empty (N, d), got ",
           shape(z));
  check_floating(z, "z", op);
  QK_CHECK(values.dim() == 2 && (values.size(0) == 1 || values.size(0) == z.size(1)) && values.size(1) >= 1, op,
           ": values must be (1, n_v) or (d, n_v) with d = ", z.size(1), ", n_v >= 1, got ", shape(values));
  check_like(values, "values", z, "z", op);
}

inline void check_latent_quantize_backward(const Tensor& grad_zq, const Tensor& grad_lq, const Tensor& grad_lc,
                                           const Tensor& z, const Tensor& values, const Tensor& idx,
                                           const char* op) {
  check_codebook(z, values, op);
  QK_CHECK(grad_zq.sizes().equals(z.sizes()), op, ": grad_zq must be shaped like z ", shape(z), ", got ",
           shape(grad_zq));
  check_like(grad_zq, "grad_zq", z, "z", op);
  check_scalar_grad(grad_lq, "grad_loss_quantize", z, op);
  check_scalar_grad(grad_lc, "grad_loss_commit", z, op);
  QK_CHECK(idx.sizes().equals(z.sizes()), op, ": indices must be shaped like z ", shape(z), ", got ", shape(idx));
  check_index(idx, "indices", z, op);
  check_index_range(idx, values.size(1), "indices", op);
}

// logits (N, d, K), values (1, K) or (d, K), uniform (N, d, K) or none.
inline void check_categorical(const Tensor& logits, const Tensor& values, const std::optional<Tensor>& uniform,
                              const char* op) {
  QK_CHECK(logits.dim() == 3 && logits.numel() > 0, op, ": logits must be a non-empty (N, d, K), got ",
           shape(logits));
  check_floating(logits, "logits", op);
  QK_CHECK(values.dim() == 2 && (values.size(0) == 1 || values.size(0) == logits.size(1)) &&
               values.size(1) == logits.size(2),
           op, ": values must be (1, K) or (d, K) with d = ", logits.size(1), ", K = ", logits.size(2), ", got ",
           shape(values));
  check_like(values, "values", logits, "logits", op);
  if (uniform.has_value()) {
    QK_CHECK(uniform->sizes().equals(logits.sizes()), op, ": uniform must be shaped like logits ", shape(logits),
             ", got ", shape(*uniform));
    check_like(*uniform, "uniform", logits, "logits", op);
  }
}

inline void check_categorical_backward(const Tensor& grad_z, const Tensor& grad_y, const Tensor& grad_kl,
                                       const Tensor& logits, const Tensor& values,
                                       const std::optional<Tensor>& uniform, const Tensor& y, const char* op) {
  check_categorical(logits, values, uniform, op);
  const torch::headeronly::IntHeaderOnlyArrayRef nd = logits.sizes().slice(0, 2);
  QK_CHECK(grad_z.sizes().equals(nd) && grad_kl.sizes().equals(nd), op, ": grad_z and grad_kl must be (N, d) = ",
           Shape{nd});
  QK_CHECK(grad_y.sizes().equals(logits.sizes()) && y.sizes().equals(logits.sizes()), op,
           ": grad_y and y must be shaped like logits ", shape(logits));
  check_like(grad_z, "grad_z", logits, "logits", op);
  check_like(grad_kl, "grad_kl", logits, "logits", op);
  check_like(grad_y, "grad_y", logits, "logits", op);
  check_like(y, "y", logits, "logits", op);
}

}  // namespace qkernels
