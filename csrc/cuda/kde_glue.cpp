// TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the KDE kernels (klm, kde_grid, cliff_terms): checks, allocation,
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

std::tuple<Tensor, Tensor> klm_cuda(const Tensor& z_, const Tensor& std_) {
  check_klm(z_, std_, "klm");
  const c10::cuda::CUDAGuard guard(z_.device());
  const int64_t n = z_.size(0), d = z_.size(1);
  const Tensor y = (z_ / std_).contiguous();
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

std::tuple<Tensor, Tensor> klm_backward_cuda(const Tensor& grad_loss, const Tensor& z_, const Tensor& std_,
                                             const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const c10::cuda::CUDAGuard guard(z_.device());
  const int64_t n = z_.size(0), d = z_.size(1);
  const Tensor y = (z_ / std_).contiguous(), lse = lse_.contiguous();
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
  return {gy / std_, -(gy * y).sum(0) / std_};
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


std::tuple<Tensor, Tensor, Tensor> cliff_terms_cuda(const Tensor& x_, const Tensor& grid_, const Tensor& uni_points_,
                                                    const Tensor& cond_, double sigma, double step) {
  check_cliff(x_, grid_, uni_points_, cond_, sigma, step, "cliff_terms");
  const c10::cuda::CUDAGuard guard(x_.device());
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  const int64_t n = x.size(0), d = x.size(1), K = grid.size(0), Ku = vp.size(0), M = cond.size(1);
  Tensor uni = at::empty({d}, x.options()), kl = at::empty({d}, x.options());
  Tensor jsd = at::zeros({d > 1 ? d * (d - 1) : 1}, x.options());
  Tensor ws = at::empty({cuda::cliff_fwd_workspace(d, K, Ku, M)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_terms_cuda", [&] {
    check_cuda(cuda::cliff_fwd<scalar_t>(x.data_ptr<scalar_t>(), grid.data_ptr<scalar_t>(), vp.data_ptr<scalar_t>(),
                                         cond.data_ptr<int64_t>(), uni.data_ptr<scalar_t>(), kl.data_ptr<scalar_t>(),
                                         jsd.data_ptr<scalar_t>(), ws.data_ptr<scalar_t>(), n, d, K, Ku, M, sigma,
                                         step, c10::cuda::getCurrentCUDAStream()),
               "cliff_terms");
  });
  return {uni.sum(), jsd.sum(), kl.sum()};
}

Tensor cliff_terms_backward_cuda(const Tensor& g_uni, const Tensor& g_biv, const Tensor& g_kl, const Tensor& x_,
                                 const Tensor& grid_, const Tensor& uni_points_, const Tensor& cond_, double sigma,
                                 double step) {
  check_cliff_backward(g_uni, g_biv, g_kl, x_, grid_, uni_points_, cond_, sigma, step, "cliff_terms_backward");
  const c10::cuda::CUDAGuard guard(x_.device());
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  const int64_t n = x.size(0), d = x.size(1), K = grid.size(0), Ku = vp.size(0), M = cond.size(1);
  // (g_uni, g_biv, g_kl) on the device: no host sync
  const Tensor g3 = at::stack({g_uni.reshape({}).to(x.options()), g_biv.reshape({}).to(x.options()),
                                g_kl.reshape({}).to(x.options())});
  Tensor gx = at::empty_like(x);
  Tensor ws = at::empty({cuda::cliff_bwd_workspace(d, K, Ku, M)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_terms_backward_cuda", [&] {
    check_cuda(cuda::cliff_bwd<scalar_t>(g3.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), grid.data_ptr<scalar_t>(),
                                         vp.data_ptr<scalar_t>(), cond.data_ptr<int64_t>(), gx.data_ptr<scalar_t>(),
                                         ws.data_ptr<scalar_t>(), n, d, K, Ku, M, sigma, step,
                                         c10::cuda::getCurrentCUDAStream()),
               "cliff_terms_backward");
  });
  return gx;
}

}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("kde_grid", &kde_grid_cuda);
  m.impl("kde_grid_backward", &kde_grid_backward_cuda);
  m.impl("klm", &klm_cuda);
  m.impl("klm_backward", &klm_backward_cuda);
  m.impl("cliff_terms", &cliff_terms_cuda);
  m.impl("cliff_terms_backward", &cliff_terms_backward_cuda);
}

}  // namespace qkernels
