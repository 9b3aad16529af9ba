// TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the KDE kernels (klm, kde_grid; Cliff has no CUDA C++
// kernel since issue 26: it runs on the triton backend): checks, allocation,
// stream, then the raw-pointer launchers of csrc/cuda/kde.cu. Built only with CUDA torch. The O(n d)
// pre- and post-processing (y = z / std, the loss mean, the std gradient) is left to ATen.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

#include "kde.cuh"
#include "glue.h"
#include "qkernels/kde.h"
#include "qkernels/kde_checks.h"

namespace qkernels {
namespace {

using at::Tensor;

// std absent: the population std of z + 1e-6 (differentiable in z); var and mean for its backward
Tensor default_std(const Tensor& z, Tensor* mean, Tensor* var) {
  *mean = z.mean(0);
  *var = (z - *mean).square().mean(0);
  const Tensor pos = *var > 0;
  return at::where(pos, *var, 1.0).sqrt() * pos + 1e-6;
}

std::tuple<Tensor, Tensor> klm_cuda(const Tensor& z_, const std::optional<Tensor>& std_) {
  check_klm(z_, std_, "klm");
  const c10::cuda::CUDAGuard guard(z_.device());
  const int64_t n = z_.size(0), d = z_.size(1);
  Tensor mean, var;
  const Tensor s = std_.has_value() ? *std_ : default_std(z_, &mean, &var);
  const Tensor y = (z_ / s).contiguous();
  const double f = silverman_factor(double(n), double(d));
  Tensor lse = at::empty({n, d + 1}, z_.options());
  AT_DISPATCH_FLOATING_TYPES(z_.scalar_type(), "klm_cuda", [&] {
    check_cuda(cuda::klm_fwd<scalar_t>(y.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), n, d, -0.5 / (f * f),
                                       c10::cuda::getCurrentCUDAStream()),
               "klm");
  });
  const double c = double(d - 1) * std::log(double(n)) - double(d) * std::log(f);
  Tensor loss = (lse.select(1, 0) - lse.narrow(1, 1, d).sum(1)).mean() + c;
  return {loss, lse};
}

std::tuple<Tensor, Tensor> klm_backward_cuda(const Tensor& grad_loss, const Tensor& z_, const std::optional<Tensor>& std_,
                                             const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const c10::cuda::CUDAGuard guard(z_.device());
  const int64_t n = z_.size(0), d = z_.size(1);
  Tensor mean, var;
  const Tensor s = std_.has_value() ? *std_ : default_std(z_, &mean, &var);
  const Tensor y = (z_ / s).contiguous(), lse = lse_.contiguous();
  const double f = silverman_factor(double(n), double(d));
  Tensor gy = at::empty_like(y);
  AT_DISPATCH_FLOATING_TYPES(z_.scalar_type(), "klm_backward_cuda", [&] {
    check_cuda(cuda::klm_bwd<scalar_t>(y.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), gy.data_ptr<scalar_t>(),
                                       n, d, -0.5 / (f * f), 1.0 / (f * f), 1.0 / double(n),
                                       c10::cuda::getCurrentCUDAStream()),
               "klm_backward");
  });
  gy = gy * grad_loss.to(z_.scalar_type());  // device scalar: no host sync
  // z = y * std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j
  Tensor gz = gy / s, gs = -(gy * y).sum(0) / s;
  if (std_.has_value()) return {gz, gs};
  // the default std's share: dstd_j / dz_bj = (z_bj - mean_j) / (n sqrt(var_j)), 0 where var_j = 0
  const Tensor pos = var > 0;
  gz = gz + at::where(pos, gs / (double(n) * at::where(pos, var, 1.0).sqrt()), 0.0) * (z_ - mean);
  return {gz, at::empty({0}, z_.options())};
}


Tensor kde_grid_cuda(const Tensor& points_, const Tensor& samples_, double sigma, bool derivative) {
  check_kde_grid(points_, samples_, sigma, "kde_grid");
  const c10::cuda::CUDAGuard guard(points_.device());
  const Tensor points = points_.contiguous(), samples = samples_.contiguous();
  Tensor out = at::empty_like(points);
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "kde_grid_cuda", [&] {
    check_cuda(cuda::kde_grid_fwd<scalar_t>(points.data_ptr<scalar_t>(), samples.data_ptr<scalar_t>(),
                                            out.data_ptr<scalar_t>(), samples.size(0), samples.size(1),
                                            points.size(1), sigma, derivative, c10::cuda::getCurrentCUDAStream()),
               "kde_grid");
  });
  return out;
}

std::tuple<Tensor, Tensor> kde_grid_backward_cuda(const Tensor& grad_, const Tensor& points_, const Tensor& samples_,
                                                  double sigma, bool derivative) {
  check_kde_grid_backward(grad_, points_, samples_, sigma, "kde_grid_backward");
  const c10::cuda::CUDAGuard guard(points_.device());
  const Tensor points = points_.contiguous(), samples = samples_.contiguous();
  const Tensor grad = grad_.to(points.scalar_type()).contiguous();
  Tensor gp = at::empty_like(points), gs = at::empty_like(samples);
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "kde_grid_backward_cuda", [&] {
    check_cuda(cuda::kde_grid_bwd<scalar_t>(grad.data_ptr<scalar_t>(), points.data_ptr<scalar_t>(),
                                            samples.data_ptr<scalar_t>(), gp.data_ptr<scalar_t>(),
                                            gs.data_ptr<scalar_t>(), samples.size(0), samples.size(1),
                                            points.size(1), sigma, derivative, c10::cuda::getCurrentCUDAStream()),
               "kde_grid_backward");
  });
  return {gp, gs};
}


}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("kde_grid", &kde_grid_cuda);
  m.impl("kde_grid_backward", &kde_grid_backward_cuda);
  m.impl("klm", &klm_cuda);
  m.impl("klm_backward", &klm_backward_cuda);
}

}  // namespace qkernels
