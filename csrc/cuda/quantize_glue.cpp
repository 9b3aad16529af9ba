// TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the quantization kernels: checks, allocation,
// stream, then the raw-pointer launchers of csrc/cuda/quantize.cu. Built only with CUDA torch.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quantize.cuh"
#include "glue.h"
#include "qkernels/quantize_checks.h"

namespace qkernels {
namespace {

using at::Tensor;

std::tuple<Tensor, Tensor, Tensor, Tensor> latent_quantize_cuda(const Tensor& z_, const Tensor& values_) {
  check_codebook(z_, values_, "latent_quantize");
  const c10::cuda::CUDAGuard guard(z_.device());
  const Tensor z = z_.contiguous(), values = values_.contiguous();
  const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
  Tensor zq = at::empty_like(z);
  Tensor idx = at::empty({N, d}, z.options().dtype(at::kLong));
  Tensor partial = at::empty({cuda::latent_quantize_num_blocks(N, d)}, z.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "latent_quantize_cuda", [&] {
    check_cuda(cuda::latent_quantize_fwd<scalar_t>(z.data_ptr<scalar_t>(), values.data_ptr<scalar_t>(),
                                                   zq.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(),
                                                   partial.data_ptr<scalar_t>(), N, d, G, nv, stream),
               "latent_quantize");
  });
  Tensor loss = partial.sum() / static_cast<double>(N * d);
  return {zq, idx, loss, loss.clone()};
}

std::tuple<Tensor, Tensor> latent_quantize_backward_cuda(const Tensor& grad_zq, const Tensor& grad_lq,
                                                         const Tensor& grad_lc, const Tensor& z_,
                                                         const Tensor& values_, const Tensor& idx_) {
  check_latent_quantize_backward(grad_zq, grad_lq, grad_lc, z_, values_, idx_, "latent_quantize_backward");
  const c10::cuda::CUDAGuard guard(z_.device());
  const Tensor z = z_.contiguous(), values = values_.contiguous(), idx = idx_.contiguous();
  const Tensor g = grad_zq.contiguous();
  const Tensor glq = grad_lq.to(z.scalar_type()).contiguous(), glc = grad_lc.to(z.scalar_type()).contiguous();
  const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
  // The kernel accumulates the codebook gradient with atomics (summation order varies run to run);
  // under torch.use_deterministic_algorithms(True) it is reduced by a deterministic index_put_.
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  Tensor grad_z = at::empty_like(z);
  Tensor grad_values = at::zeros_like(values);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "latent_quantize_backward_cuda", [&] {
    check_cuda(cuda::latent_quantize_bwd<scalar_t>(
                   g.data_ptr<scalar_t>(), glq.data_ptr<scalar_t>(), glc.data_ptr<scalar_t>(),
                   z.data_ptr<scalar_t>(), values.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(),
                   grad_z.data_ptr<scalar_t>(), deterministic ? nullptr : grad_values.data_ptr<scalar_t>(), N, d,
                   G, nv, c10::cuda::getCurrentCUDAStream()),
               "latent_quantize_backward");
  });
  if (deterministic) {
    // flat codebook slot of every element; out-of-range indices (NaN in grad_z) are clamped here
    const Tensor row = G == 1 ? at::zeros({1, d}, idx.options()) : at::arange(d, idx.options()).unsqueeze(0);
    const Tensor slot = (row * nv + idx.clamp(0, nv - 1)).reshape({-1});
    const Tensor diff = z.reshape({-1}) - values.reshape({-1}).index_select(0, slot);
    const Tensor contrib = diff * (glq * (-2.0 / static_cast<double>(N * d)));
    grad_values = at::zeros({G * nv}, values.options()).index_put_({slot}, contrib, /*accumulate=*/true).view({G, nv});
  }
  return {grad_z, grad_values};
}

std::tuple<Tensor, Tensor, Tensor> relaxed_categorical_cuda(const Tensor& logits_, const Tensor& values_,
                                                            const std::optional<Tensor>& uniform_,
                                                            double tau, double noise_scale, bool hard) {
  check_categorical(logits_, values_, uniform_, "relaxed_categorical");
  const c10::cuda::CUDAGuard guard(logits_.device());
  const Tensor logits = logits_.contiguous(), values = values_.contiguous();
  const Tensor uniform = uniform_.has_value() ? uniform_->contiguous() : Tensor();
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  Tensor z = at::empty({N, d}, logits.options()), y = at::empty_like(logits);
  Tensor kl = at::empty({N, d}, logits.options());
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "relaxed_categorical_cuda", [&] {
    check_cuda(cuda::relaxed_categorical_fwd<scalar_t>(
                   logits.data_ptr<scalar_t>(), uniform.defined() ? uniform.data_ptr<scalar_t>() : nullptr,
                   values.data_ptr<scalar_t>(), z.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                   kl.data_ptr<scalar_t>(), N * d, d, G, K, scalar_t(tau), scalar_t(noise_scale), hard,
                   c10::cuda::getCurrentCUDAStream()),
               "relaxed_categorical");
  });
  return {z, y, kl};
}

std::tuple<Tensor, Tensor> relaxed_categorical_backward_cuda(
    const Tensor& grad_z, const Tensor& grad_y, const Tensor& grad_kl, const Tensor& logits_,
    const Tensor& values_, const std::optional<Tensor>& uniform_, const Tensor& y, double tau,
    double noise_scale) {
  check_categorical_backward(grad_z, grad_y, grad_kl, logits_, values_, uniform_, y, "relaxed_categorical_backward");
  const c10::cuda::CUDAGuard guard(logits_.device());
  const Tensor logits = logits_.contiguous(), values = values_.contiguous();
  const Tensor uniform = uniform_.has_value() ? uniform_->contiguous() : Tensor();
  const Tensor gz = grad_z.contiguous(), gy = grad_y.contiguous(), gk = grad_kl.contiguous();
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  Tensor grad_logits = at::empty_like(logits);
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "relaxed_categorical_backward_cuda", [&] {
    check_cuda(cuda::relaxed_categorical_bwd<scalar_t>(
                   gz.data_ptr<scalar_t>(), gy.data_ptr<scalar_t>(), gk.data_ptr<scalar_t>(),
                   logits.data_ptr<scalar_t>(), uniform.defined() ? uniform.data_ptr<scalar_t>() : nullptr,
                   values.data_ptr<scalar_t>(), grad_logits.data_ptr<scalar_t>(), N * d, d, G, K,
                   scalar_t(tau), scalar_t(noise_scale), c10::cuda::getCurrentCUDAStream()),
               "relaxed_categorical_backward");
  });
  // codebook gradient: sum over rows of g_z * y_out, a (batched) GEMV
  Tensor grad_values = G == 1 ? at::einsum("nd,ndk->k", {gz, y}).unsqueeze(0)
                              : at::einsum("nd,ndk->dk", {gz, y});
  return {grad_logits, grad_values};
}

}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("latent_quantize", &latent_quantize_cuda);
  m.impl("latent_quantize_backward", &latent_quantize_backward_cuda);
  m.impl("relaxed_categorical", &relaxed_categorical_cuda);
  m.impl("relaxed_categorical_backward", &relaxed_categorical_backward_cuda);
}

}  // namespace qkernels
