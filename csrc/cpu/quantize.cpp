// CPU kernels of the quantization hot path, threaded by torch::stable::parallel_for (torch's
// intra-op pool; schemas: csrc/schemas.cpp). latent_quantize is csrc/cpu/quantize_impl.h (raw pointers,
// shared with the XLA FFI binding csrc/jax/quantize_ffi.cpp); the relaxed categorical kernels
// (csrc/cpu/quantize_kernels.h, vectorized) are compiled twice, for baseline x86-64 and for AVX+FMA, and the
// entry points pick the copy the CPU supports at run time (csrc/cpu/isa.h). Their equations are those of
// csrc/include/qkernels/quantize.h, which the CUDA kernels use.
//
// Reductions (losses, codebook gradients) use a fixed row chunking whose partial sums are added in
// chunk order, so results do not depend on the number of threads.
#include "qkernels/stable.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "isa.h"
#include "qkernels/common.h"
#include "quantize_impl.h"
#include "qkernels/quantize_checks.h"

namespace qkernels {

#define QK_KERNELS_FILE "quantize_kernels.h"
#include "isa_copies.h"

namespace {

using cpu::chunk_rows;
using cpu::grain;

// The per-chunk partials summed in chunk order, times scale, as a (G, n) tensor.
Tensor sum_partials(const std::vector<double>& partial, int64_t n_chunks, int64_t G, int64_t n, double scale,
                    const Tensor& like) {
  Tensor out = alloc({G, n}, like.scalar_type(), like);
  dispatch_floating(out.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::sum_partials(partial, n_chunks, G * n, scale, out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> latent_quantize_cpu(const Tensor& z_, const Tensor& values_) {
  check_codebook(z_, values_, "latent_quantize");
  const Tensor z = as_contiguous(z_), values = as_contiguous(values_);
  check_finite(z, "z", "latent_quantize");
  check_finite(values, "values", "latent_quantize");
  const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
  Tensor zq = alloc_like(z);
  Tensor idx = alloc({N, d}, ScalarType::Long, z);
  double loss = 0.0;
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    loss = cpu::latent_quantize_forward<scalar_t, int64_t>(z.const_data_ptr<scalar_t>(),
                                                           values.const_data_ptr<scalar_t>(), N, d, G, nv,
                                                           zq.mutable_data_ptr<scalar_t>(),
                                                           idx.mutable_data_ptr<int64_t>());
  });
  return {zq, idx, cpu_scalar_tensor(loss, z.scalar_type(), z), cpu_scalar_tensor(loss, z.scalar_type(), z)};
}

std::tuple<Tensor, Tensor> latent_quantize_backward_cpu(const Tensor& grad_zq_, const Tensor& grad_lq,
                                                        const Tensor& grad_lc, const Tensor& z_,
                                                        const Tensor& values_, const Tensor& idx_) {
  const Tensor z = as_contiguous(z_), values = as_contiguous(values_), idx = as_contiguous(idx_);
  check_latent_quantize_backward(grad_zq_, grad_lq, grad_lc, z, values, idx, "latent_quantize_backward");
  const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
  const Tensor grad_zq = as_contiguous(grad_zq_);
  Tensor grad_z = alloc_like(z), grad_values = alloc_like(values);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::latent_quantize_backward<scalar_t, int64_t>(
        grad_zq.const_data_ptr<scalar_t>(), cpu_scalar(grad_lq), cpu_scalar(grad_lc), z.const_data_ptr<scalar_t>(),
        values.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(), N, d, G, nv,
        grad_z.mutable_data_ptr<scalar_t>(), grad_values.mutable_data_ptr<scalar_t>());
  });
  return {grad_z, grad_values};
}

std::tuple<Tensor, Tensor, Tensor> relaxed_categorical_cpu(const Tensor& logits_, const Tensor& values_,
                                                           const std::optional<Tensor>& uniform_,
                                                           double tau, double noise_scale, bool hard) {
  check_categorical(logits_, values_, uniform_, "relaxed_categorical");
  check_finite(logits_, "logits", "relaxed_categorical");
  check_finite(values_, "values", "relaxed_categorical");
  if (uniform_.has_value()) check_unit_interval(*uniform_, "uniform", "relaxed_categorical");
  const Tensor logits = as_contiguous(logits_), values = as_contiguous(values_);
  const std::optional<Tensor> uniform = uniform_.has_value() ? std::optional(as_contiguous(*uniform_)) : std::nullopt;
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  Tensor z = alloc({N, d}, logits.scalar_type(), logits);
  Tensor y = alloc_like(logits);
  Tensor kl = alloc({N, d}, logits.scalar_type(), logits);
  dispatch_floating(logits.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    QK_ISA_CALL(categorical_forward_kernel<scalar_t>)(
        logits.const_data_ptr<scalar_t>(), uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr,
        values.const_data_ptr<scalar_t>(), N * d, d, G, K, tau, noise_scale, hard, z.mutable_data_ptr<scalar_t>(),
        y.mutable_data_ptr<scalar_t>(), kl.mutable_data_ptr<scalar_t>());
  });
  return {z, y, kl};
}

std::tuple<Tensor, Tensor> relaxed_categorical_backward_cpu(
    const Tensor& grad_z_, const Tensor& grad_y_, const Tensor& grad_kl_, const Tensor& logits_,
    const Tensor& values_, const std::optional<Tensor>& uniform_, const Tensor& y_, double tau,
    double noise_scale) {
  check_categorical_backward(grad_z_, grad_y_, grad_kl_, logits_, values_, uniform_, y_, "relaxed_categorical_backward");
  const Tensor logits = as_contiguous(logits_), values = as_contiguous(values_), y = as_contiguous(y_);
  const std::optional<Tensor> uniform = uniform_.has_value() ? std::optional(as_contiguous(*uniform_)) : std::nullopt;
  const Tensor grad_z = as_contiguous(grad_z_), grad_y = as_contiguous(grad_y_), grad_kl = as_contiguous(grad_kl_);
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  Tensor grad_logits = alloc_like(logits);
  const int64_t rows = chunk_rows(N), n_chunks = (N + rows - 1) / rows;
  std::vector<double> partial(n_chunks * G * K, 0.0);
  dispatch_floating(logits.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    QK_ISA_CALL(categorical_backward_kernel<scalar_t>)(
        logits.const_data_ptr<scalar_t>(), uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr,
        values.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(), grad_z.const_data_ptr<scalar_t>(),
        grad_y.const_data_ptr<scalar_t>(), grad_kl.const_data_ptr<scalar_t>(), N * d, d, G, K, tau, noise_scale,
        rows * d, grad_logits.mutable_data_ptr<scalar_t>(), partial.data());
  });
  Tensor grad_values = sum_partials(partial, n_chunks, G, K, 1.0, values);
  return {grad_logits, grad_values};
}

}  // namespace

}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("latent_quantize", TORCH_BOX(&qkernels::latent_quantize_cpu));
  m.impl("latent_quantize_backward", TORCH_BOX(&qkernels::latent_quantize_backward_cpu));
  m.impl("relaxed_categorical", TORCH_BOX(&qkernels::relaxed_categorical_cpu));
  m.impl("relaxed_categorical_backward", TORCH_BOX(&qkernels::relaxed_categorical_backward_cpu));
}
