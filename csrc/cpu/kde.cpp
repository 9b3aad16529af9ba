// CPU (OpenMP via at::parallel_for) entry points of the KDE hot path (schemas: csrc/schemas.cpp).
// The kernels (csrc/cpu/kde_kernels.h) are compiled twice, for baseline x86-64 and for AVX+FMA,
// and the entry points pick the copy the CPU supports at run time (csrc/cpu/isa.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "isa.h"
#include "qkernels/kde.h"
#include "qkernels/kde_checks.h"

namespace qkernels {
namespace {
constexpr double kSqrt2Pi = 2.5066282746310002;
}  // namespace

// 32-byte vector types in the baseline copy are emulated with SSE pairs: no ABI concern here (all
// of it is internal to this file).
#pragma GCC diagnostic ignored "-Wpsabi"
namespace isa_base {
#include "kde_kernels.h"
}  // namespace isa_base
#if QK_AVX_COPY
#pragma GCC push_options
#pragma GCC target("avx,fma")
namespace isa_avx {
#include "kde_kernels.h"
}  // namespace isa_avx
#pragma GCC pop_options
#endif

namespace {

using at::Tensor;

Tensor kde_grid_cpu(const Tensor& points_, const Tensor& samples_, double sigma, bool derivative) {
  check_kde_grid(points_, samples_, sigma, "kde_grid");
  const Tensor points = points_.contiguous(), samples = samples_.contiguous();
  Tensor out = at::empty_like(points);
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "kde_grid_cpu", [&] {
    QK_ISA_CALL(kde_grid_kernel<scalar_t>)(points.data_ptr<scalar_t>(), samples.data_ptr<scalar_t>(), samples.size(0),
                              samples.size(1), points.size(1), sigma, derivative, out.data_ptr<scalar_t>(),
                              nullptr, nullptr, nullptr);
  });
  return out;
}

std::tuple<Tensor, Tensor> kde_grid_backward_cpu(const Tensor& grad_, const Tensor& points_, const Tensor& samples_,
                                                 double sigma, bool derivative) {
  check_kde_grid_backward(grad_, points_, samples_, sigma, "kde_grid_backward");
  const Tensor points = points_.contiguous(), samples = samples_.contiguous();
  const Tensor grad = grad_.to(points.scalar_type()).contiguous();
  Tensor gp = at::empty_like(points), gs = at::empty_like(samples);
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "kde_grid_backward_cpu", [&] {
    QK_ISA_CALL(kde_grid_kernel<scalar_t>)(points.data_ptr<scalar_t>(), samples.data_ptr<scalar_t>(), samples.size(0),
                              samples.size(1), points.size(1), sigma, derivative, nullptr,
                              grad.data_ptr<scalar_t>(), gp.data_ptr<scalar_t>(), gs.data_ptr<scalar_t>());
  });
  return {gp, gs};
}

std::tuple<Tensor, Tensor, Tensor> cliff_terms_cpu(const Tensor& x_, const Tensor& grid_, const Tensor& uni_points_,
                                                   const Tensor& cond_, double sigma, double step) {
  check_cliff(x_, grid_, uni_points_, cond_, sigma, step, "cliff_terms");
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  std::vector<double> terms;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_terms_cpu", [&] {
    QK_ISA_CALL(cliff_kernel<scalar_t>)(x.data_ptr<scalar_t>(), x.size(0), x.size(1), grid.data_ptr<scalar_t>(), grid.size(0),
                           vp.data_ptr<scalar_t>(), vp.size(0), cond.data_ptr<int64_t>(), cond.size(1), sigma, step,
                           0.0, 0.0, 0.0, &terms, nullptr);
  });
  return {at::scalar_tensor(terms[0], x.options()), at::scalar_tensor(terms[1], x.options()),
          at::scalar_tensor(terms[2], x.options())};
}

Tensor cliff_terms_backward_cpu(const Tensor& g_uni, const Tensor& g_biv, const Tensor& g_kl, const Tensor& x_,
                                const Tensor& grid_, const Tensor& uni_points_, const Tensor& cond_, double sigma,
                                double step) {
  check_cliff_backward(g_uni, g_biv, g_kl, x_, grid_, uni_points_, cond_, sigma, step, "cliff_terms_backward");
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  Tensor gx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_terms_backward_cpu", [&] {
    QK_ISA_CALL(cliff_kernel<scalar_t>)(x.data_ptr<scalar_t>(), x.size(0), x.size(1), grid.data_ptr<scalar_t>(), grid.size(0),
                           vp.data_ptr<scalar_t>(), vp.size(0), cond.data_ptr<int64_t>(), cond.size(1), sigma, step,
                           g_uni.item<double>(), g_biv.item<double>(), g_kl.item<double>(), nullptr,
                           gx.data_ptr<scalar_t>());
  });
  return gx;
}

// ============================================================================ klm

std::tuple<Tensor, Tensor> klm_cpu(const Tensor& z_, const Tensor& std_) {
  check_klm(z_, std_, "klm");
  const Tensor z = z_.contiguous(), std = std_.contiguous();
  const int64_t n = z.size(0), d = z.size(1);
  Tensor lse = at::empty({n, d + 1}, z.options());
  double loss = 0.0;
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "klm_cpu", [&] {
    loss = QK_ISA_CALL(klm_forward_kernel<scalar_t>)(z.data_ptr<scalar_t>(), std.data_ptr<scalar_t>(), n, d,
                                        lse.data_ptr<scalar_t>());
  });
  return {at::scalar_tensor(loss, z.options()), lse};
}

std::tuple<Tensor, Tensor> klm_backward_cpu(const Tensor& grad_loss, const Tensor& z_, const Tensor& std_,
                                            const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const Tensor z = z_.contiguous(), std = std_.contiguous(), lse = lse_.contiguous();
  Tensor gz = at::empty_like(z), gs = at::empty_like(std);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "klm_backward_cpu", [&] {
    QK_ISA_CALL(klm_backward_kernel<scalar_t>)(grad_loss.item<double>(), z.data_ptr<scalar_t>(), std.data_ptr<scalar_t>(),
                                  lse.data_ptr<scalar_t>(), z.size(0), z.size(1), gz.data_ptr<scalar_t>(),
                                  gs.data_ptr<scalar_t>());
  });
  return {gz, gs};
}

}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("kde_grid", &kde_grid_cpu);
  m.impl("kde_grid_backward", &kde_grid_backward_cpu);
  m.impl("cliff_terms", &cliff_terms_cpu);
  m.impl("cliff_terms_backward", &cliff_terms_backward_cpu);
  m.impl("klm", &klm_cpu);
  m.impl("klm_backward", &klm_backward_cpu);
}

}  // namespace qkernels
