// TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the KDE kernels (klm, kde_grid, cliff_loss): checks, allocation,
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


// The three terms of standardized latents x (the kernels of csrc/cuda/kde.cu).
std::tuple<Tensor, Tensor, Tensor> cliff_terms(const Tensor& x_, const Tensor& grid_, const Tensor& uni_points_,
                                               const Tensor& cond_, double sigma, double step) {
  const c10::cuda::CUDAGuard guard(x_.device());
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  const int64_t n = x.size(0), d = x.size(1), K = grid.size(0), Ku = vp.size(0), M = cond.size(1);
  Tensor uni = at::empty({d}, x.options()), kl = at::empty({d}, x.options());
  Tensor jsd = at::zeros({d > 1 ? d * (d - 1) : 1}, x.options());
  Tensor ws = at::empty({cuda::cliff_fwd_workspace(d, K, Ku, M)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_loss_cuda", [&] {
    check_cuda(cuda::cliff_fwd<scalar_t>(x.data_ptr<scalar_t>(), grid.data_ptr<scalar_t>(), vp.data_ptr<scalar_t>(),
                                         cond.data_ptr<int64_t>(), uni.data_ptr<scalar_t>(), kl.data_ptr<scalar_t>(),
                                         jsd.data_ptr<scalar_t>(), ws.data_ptr<scalar_t>(), n, d, K, Ku, M, sigma,
                                         step, c10::cuda::getCurrentCUDAStream()),
               "cliff_loss");
  });
  return {uni.sum(), jsd.sum(), kl.sum()};
}

// d(g_uni uni + g_biv biv + g_kl kl)/dx with g3 = (g_uni, g_biv, g_kl) on the device.
Tensor cliff_terms_backward(const Tensor& g3, const Tensor& x_, const Tensor& grid_, const Tensor& uni_points_,
                            const Tensor& cond_, double sigma, double step) {
  const c10::cuda::CUDAGuard guard(x_.device());
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  const int64_t n = x.size(0), d = x.size(1), K = grid.size(0), Ku = vp.size(0), M = cond.size(1);
  Tensor gx = at::empty_like(x);
  Tensor ws = at::empty({cuda::cliff_bwd_workspace(d, K, Ku, M)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_loss_backward_cuda", [&] {
    check_cuda(cuda::cliff_bwd<scalar_t>(g3.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), grid.data_ptr<scalar_t>(),
                                         vp.data_ptr<scalar_t>(), cond.data_ptr<int64_t>(), gx.data_ptr<scalar_t>(),
                                         ws.data_ptr<scalar_t>(), n, d, K, Ku, M, sigma, step,
                                         c10::cuda::getCurrentCUDAStream()),
               "cliff_loss_backward");
  });
  return gx;
}

// Cliff's set-up around the terms (qkernels/reference/kde.py cliff_loss), left to ATen: the
// standardization, the grids, the lambdas, and the standardization's backward.
constexpr double kMinVar = 1e-12;  // variance clamp of the standardization (std >= 1e-6)

struct Standardized {
  Tensor x, std, unclamped;
};

Standardized standardize(const Tensor& z) {
  const Tensor mean = z.mean(0), var = (z - mean).square().mean(0);
  const Tensor std = var.clamp_min(kMinVar).sqrt();
  return {((z - mean) / std).contiguous(), std, var >= kMinVar};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> cliff_loss_cuda(const Tensor& z, const Tensor& cond, double sigma, double a,
                                                           double b, int64_t K, double lu, double lb, double lk) {
  check_cliff_loss(z, cond, sigma, a, b, K, "cliff_loss");
  const c10::cuda::CUDAGuard guard(z.device());
  const Standardized s = standardize(z);
  const Tensor t = at::linspace(a, b, K, z.options()), v = at::linspace(-std::sqrt(3.0), std::sqrt(3.0), K, z.options());
  auto [uni, biv, kl] = cliff_terms(s.x, t, v, cond, sigma, (b - a) / double(K));
  return {lu * uni + lb * biv + lk * kl, uni, biv, kl};
}

Tensor cliff_loss_backward_cuda(const std::optional<Tensor>& g_total, const std::optional<Tensor>& g_uni,
                                const std::optional<Tensor>& g_biv, const std::optional<Tensor>& g_kl, const Tensor& z,
                                const Tensor& cond, double sigma, double a, double b, int64_t K, double lu, double lb,
                                double lk) {
  const std::optional<Tensor> grads[4] = {g_total, g_uni, g_biv, g_kl};
  check_cliff_loss_backward(grads, z, cond, sigma, a, b, K, "cliff_loss_backward");
  const c10::cuda::CUDAGuard guard(z.device());
  const Tensor zero = at::zeros({}, z.options());
  const auto value = [&](const std::optional<Tensor>& g) { return g.has_value() ? g->reshape({}).to(z.options()) : zero; };
  const Tensor gt = value(g_total);  // device scalars: no host sync
  const Tensor g3 = at::stack({lu * gt + value(g_uni), lb * gt + value(g_biv), lk * gt + value(g_kl)});
  const Standardized s = standardize(z);
  const Tensor t = at::linspace(a, b, K, z.options()), v = at::linspace(-std::sqrt(3.0), std::sqrt(3.0), K, z.options());
  const Tensor gx = cliff_terms_backward(g3, s.x, t, v, cond, sigma, (b - a) / double(K));
  // x = (z - mean) / std: dz = (gx - mean(gx) - x mean(gx x)) / std (no last term where std is clamped)
  const Tensor proj = at::where(s.unclamped, (gx * s.x).mean(0), 0.0);
  return (gx - gx.mean(0) - s.x * proj) / s.std;
}

}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("kde_grid", &kde_grid_cuda);
  m.impl("kde_grid_backward", &kde_grid_backward_cuda);
  m.impl("klm", &klm_cuda);
  m.impl("klm_backward", &klm_backward_cuda);
  m.impl("cliff_loss", &cliff_loss_cuda);
  m.impl("cliff_loss_backward", &cliff_loss_backward_cuda);
}

}  // namespace qkernels
