// CPU kernels of the quantization hot path, threaded by torch::stable::parallel_for (torch's
// intra-op pool; schemas: csrc/schemas.cpp). latent_quantize is csrc/cpu/quantize_impl.h (raw pointers,
// shared with the XLA FFI binding csrc/jax/quantize_ffi.cpp); relaxed_categorical's math lives in
// csrc/include/qkernels/quantize.h, shared with csrc/cuda.
//
// Reductions (losses, codebook gradients) use a fixed row chunking whose partial sums are added in
// chunk order, so results do not depend on the number of threads.
#include "qkernels/stable.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "qkernels/quantize.h"
#include "quantize_impl.h"
#include "qkernels/quantize_checks.h"

namespace qkernels {
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
    const scalar_t* lp = logits.const_data_ptr<scalar_t>();
    const scalar_t* up = uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* vp = values.const_data_ptr<scalar_t>();
    scalar_t *zp = z.mutable_data_ptr<scalar_t>(), *yp = y.mutable_data_ptr<scalar_t>(),
             *kp = kl.mutable_data_ptr<scalar_t>();
    parallel_for(0, N * d, std::max<int64_t>(256, (int64_t(1) << 16) / (8 * K)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t g = G == 1 ? 0 : r % d;
        zp[r] = categorical_row_forward<scalar_t>(lp + r * K, up ? up + r * K : nullptr, vp + g * K,
                                                  static_cast<int>(K), scalar_t(tau),
                                                  scalar_t(noise_scale), hard, yp + r * K, kp + r);
      }
    });
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
    const scalar_t* lp = logits.const_data_ptr<scalar_t>();
    const scalar_t* up = uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* vp = values.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    const scalar_t *gzp = grad_z.const_data_ptr<scalar_t>(), *gyp = grad_y.const_data_ptr<scalar_t>(),
                   *gkp = grad_kl.const_data_ptr<scalar_t>();
    scalar_t* glp = grad_logits.mutable_data_ptr<scalar_t>();
    parallel_for(0, n_chunks, grain(n_chunks, rows * d * K * 8), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double* part = partial.data() + c * G * K;
        const int64_t i1 = std::min(N, (c + 1) * rows);
        for (int64_t r = c * rows * d; r < i1 * d; ++r) {
          const int64_t g = G == 1 ? 0 : r % d;
          categorical_row_backward<scalar_t>(lp + r * K, up ? up + r * K : nullptr, vp + g * K,
                                             static_cast<int>(K), scalar_t(tau), scalar_t(noise_scale),
                                             gzp[r], gyp + r * K, gkp[r], glp + r * K);
          for (int64_t k = 0; k < K; ++k) part[g * K + k] += static_cast<double>(gzp[r]) * yp[r * K + k];
        }
      }
    });
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
