// STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the quantization kernels: checks, allocation,
// stream, then the raw-pointer launchers of csrc/cuda/quantize.cu (which also reduce the losses and the
// codebook gradients: no torch op here). Built only with CUDA torch.
#include "glue.h"
#include "quantize.cuh"
#include "qkernels/quantize_checks.h"

namespace qkernels {
namespace {

std::tuple<Tensor, Tensor, Tensor, Tensor> latent_quantize_cuda(const Tensor& z_, const Tensor& values_) {
  check_codebook(z_, values_, "latent_quantize");
  const OnDevice on(z_);
  const Tensor z = as_contiguous(z_), values = as_contiguous(values_);
  const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
  const ScalarType dtype = z.scalar_type();
  Tensor zq = alloc_like(z);
  Tensor idx = alloc({N, d}, ScalarType::Long, z);
  Tensor partial = alloc({cuda::latent_quantize_num_blocks(N, d)}, dtype, z);
  Tensor loss = alloc({}, dtype, z), loss_commit = alloc({}, dtype, z);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::latent_quantize_fwd<scalar_t>(z.const_data_ptr<scalar_t>(), values.const_data_ptr<scalar_t>(),
                                                   zq.mutable_data_ptr<scalar_t>(), idx.mutable_data_ptr<int64_t>(),
                                                   partial.mutable_data_ptr<scalar_t>(),
                                                   loss.mutable_data_ptr<scalar_t>(),
                                                   loss_commit.mutable_data_ptr<scalar_t>(), N, d, G, nv, on.stream()),
               "latent_quantize");
  });
  return {zq, idx, loss, loss_commit};
}

std::tuple<Tensor, Tensor> latent_quantize_backward_cuda(const Tensor& grad_zq, const Tensor& grad_lq,
                                                         const Tensor& grad_lc, const Tensor& z_,
                                                         const Tensor& values_, const Tensor& idx_) {
  check_latent_quantize_backward(grad_zq, grad_lq, grad_lc, z_, values_, idx_, "latent_quantize_backward");
  const OnDevice on(z_);
  const Tensor z = as_contiguous(z_), values = as_contiguous(values_), idx = as_contiguous(idx_);
  const Tensor g = as_contiguous(grad_zq);
  const ScalarType dtype = z.scalar_type();
  const Tensor glq = as_contiguous(to_dtype(grad_lq, dtype)), glc = as_contiguous(to_dtype(grad_lc, dtype));
  const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
  Tensor grad_z = alloc_like(z), grad_values = alloc_like(values);
  Tensor workspace = alloc({cuda::latent_quantize_workspace(N, d, G, nv, dtype == ScalarType::Double)}, dtype, z);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::latent_quantize_bwd<scalar_t>(
                   g.const_data_ptr<scalar_t>(), glq.const_data_ptr<scalar_t>(), glc.const_data_ptr<scalar_t>(),
                   z.const_data_ptr<scalar_t>(), values.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(),
                   grad_z.mutable_data_ptr<scalar_t>(), grad_values.mutable_data_ptr<scalar_t>(),
                   workspace.mutable_data_ptr<scalar_t>(), N, d, G, nv, on.stream()),
               "latent_quantize_backward");
  });
  return {grad_z, grad_values};
}

std::tuple<Tensor, Tensor, Tensor> relaxed_categorical_cuda(const Tensor& logits_, const Tensor& values_,
                                                            const std::optional<Tensor>& uniform_,
                                                            double tau, double noise_scale, bool hard) {
  check_categorical(logits_, values_, uniform_, "relaxed_categorical");
  const OnDevice on(logits_);
  const Tensor logits = as_contiguous(logits_), values = as_contiguous(values_);
  const std::optional<Tensor> uniform = uniform_.has_value() ? std::optional(as_contiguous(*uniform_)) : std::nullopt;
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  const ScalarType dtype = logits.scalar_type();
  Tensor z = alloc({N, d}, dtype, logits), y = alloc_like(logits), kl = alloc({N, d}, dtype, logits);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::relaxed_categorical_fwd<scalar_t>(
                   logits.const_data_ptr<scalar_t>(), uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr,
                   values.const_data_ptr<scalar_t>(), z.mutable_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(),
                   kl.mutable_data_ptr<scalar_t>(), N * d, d, G, K, scalar_t(tau), scalar_t(noise_scale), hard,
                   on.stream()),
               "relaxed_categorical");
  });
  return {z, y, kl};
}

std::tuple<Tensor, Tensor> relaxed_categorical_backward_cuda(
    const Tensor& grad_z, const Tensor& grad_y, const Tensor& grad_kl, const Tensor& logits_,
    const Tensor& values_, const std::optional<Tensor>& uniform_, const Tensor& y_, double tau,
    double noise_scale) {
  check_categorical_backward(grad_z, grad_y, grad_kl, logits_, values_, uniform_, y_, "relaxed_categorical_backward");
  const OnDevice on(logits_);
  const Tensor logits = as_contiguous(logits_), values = as_contiguous(values_), y = as_contiguous(y_);
  const std::optional<Tensor> uniform = uniform_.has_value() ? std::optional(as_contiguous(*uniform_)) : std::nullopt;
  const Tensor gz = as_contiguous(grad_z), gy = as_contiguous(grad_y), gk = as_contiguous(grad_kl);
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  const ScalarType dtype = logits.scalar_type();
  Tensor grad_logits = alloc_like(logits), grad_values = alloc_like(values);
  Tensor workspace = alloc({cuda::categorical_workspace(N, d, K)}, dtype, logits);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::relaxed_categorical_bwd<scalar_t>(
                   gz.const_data_ptr<scalar_t>(), gy.const_data_ptr<scalar_t>(), gk.const_data_ptr<scalar_t>(),
                   logits.const_data_ptr<scalar_t>(), uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr,
                   values.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
                   grad_logits.mutable_data_ptr<scalar_t>(), grad_values.mutable_data_ptr<scalar_t>(),
                   workspace.mutable_data_ptr<scalar_t>(), N * d, d, G, K, scalar_t(tau), scalar_t(noise_scale),
                   on.stream()),
               "relaxed_categorical_backward");
  });
  return {grad_logits, grad_values};
}

}  // namespace
}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("latent_quantize", TORCH_BOX(&qkernels::latent_quantize_cuda));
  m.impl("latent_quantize_backward", TORCH_BOX(&qkernels::latent_quantize_backward_cuda));
  m.impl("relaxed_categorical", TORCH_BOX(&qkernels::relaxed_categorical_cuda));
  m.impl("relaxed_categorical_backward", TORCH_BOX(&qkernels::relaxed_categorical_backward_cuda));
}
