// CPU entry points of the KDE hot path, threaded by torch::stable::parallel_for (schemas: csrc/schemas.cpp).
// The kernels (csrc/cpu/kde_kernels.h) are compiled twice, for baseline x86-64 and for AVX+FMA,
// and the entry points pick the copy the CPU supports at run time (csrc/cpu/isa.h).
#include "qkernels/stable.h"

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

Tensor kde_grid_cpu(const Tensor& points_, const Tensor& samples_, double sigma, bool derivative) {
  check_kde_grid(points_, samples_, sigma, "kde_grid");
  check_finite(points_, "points", "kde_grid");
  check_finite(samples_, "samples", "kde_grid");
  const Tensor points = as_contiguous(points_), samples = as_contiguous(samples_);
  Tensor out = alloc_like(points);
  dispatch_floating(points.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    QK_ISA_CALL(kde_grid_kernel<scalar_t>)(points.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(),
                                           samples.size(0), samples.size(1), points.size(1), sigma, derivative,
                                           out.mutable_data_ptr<scalar_t>(), nullptr, nullptr, nullptr);
  });
  return out;
}

std::tuple<Tensor, Tensor> kde_grid_backward_cpu(const Tensor& grad_, const Tensor& points_, const Tensor& samples_,
                                                 double sigma, bool derivative) {
  check_kde_grid_backward(grad_, points_, samples_, sigma, "kde_grid_backward");
  const Tensor points = as_contiguous(points_), samples = as_contiguous(samples_);
  const Tensor grad = as_contiguous(to_dtype(grad_, points.scalar_type()));
  Tensor gp = alloc_like(points), gs = alloc_like(samples);
  dispatch_floating(points.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    QK_ISA_CALL(kde_grid_kernel<scalar_t>)(points.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(),
                                           samples.size(0), samples.size(1), points.size(1), sigma, derivative,
                                           nullptr, grad.const_data_ptr<scalar_t>(), gp.mutable_data_ptr<scalar_t>(),
                                           gs.mutable_data_ptr<scalar_t>());
  });
  return {gp, gs};
}

// ============================================================================ cliff_loss
// The set-up around the kernel (qkernels/reference/kde.py cliff_loss), in plain loops: the
// standardization x = (z - mean) / std with std = sqrt(max(var, kMinVar)) per column, the grids
// linspace(a, b, K) and linspace(-sqrt 3, sqrt 3, K) (torch.linspace's formula), the lambdas; and the
// backward through the standardization. No torch op per call beyond the outputs.

constexpr double kMinVar = 1e-12;  // variance clamp of the standardization (std >= 1e-6)

template <typename T>
struct Standardized {
  std::vector<T> x, mean, std;
  std::vector<char> unclamped;  // var >= kMinVar: the std depends on z
};

template <typename T>
Standardized<T> standardize(const T* z, int64_t n, int64_t d) {
  Standardized<T> s{std::vector<T>(n * d), std::vector<T>(d), std::vector<T>(d), std::vector<char>(d)};
  std::vector<double> sum(d, 0.0), sq(d, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) sum[j] += z[r * d + j];
  for (int64_t j = 0; j < d; ++j) s.mean[j] = static_cast<T>(sum[j] / double(n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) {
      const double dev = double(z[r * d + j]) - sum[j] / double(n);
      sq[j] += dev * dev;
    }
  for (int64_t j = 0; j < d; ++j) {
    const double var = sq[j] / double(n);
    s.std[j] = static_cast<T>(std::sqrt(std::max(var, kMinVar)));
    s.unclamped[j] = var >= kMinVar;
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) s.x[r * d + j] = (z[r * d + j] - s.mean[j]) / s.std[j];
  return s;
}

template <typename T>
std::vector<T> linspace(double lo_, double hi_, int64_t K) {
  const T lo = static_cast<T>(lo_), hi = static_cast<T>(hi_), step = (hi - lo) / static_cast<T>(K - 1);
  std::vector<T> out(K);
  for (int64_t k = 0; k < K; ++k) out[k] = k < K / 2 ? lo + step * static_cast<T>(k) : hi - step * static_cast<T>(K - 1 - k);
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> cliff_loss_cpu(const Tensor& z_, const Tensor& cond_, double sigma, double a,
                                                          double b, int64_t K, double lu, double lb, double lk) {
  check_cliff_loss(z_, cond_, sigma, a, b, K, "cliff_loss");
  check_finite(z_, "z", "cliff_loss");
  const Tensor z = as_contiguous(z_), cond = as_contiguous(cond_);
  const int64_t n = z.size(0), d = z.size(1);
  std::vector<double> terms;
  std::vector<Tensor> out;
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const Standardized<scalar_t> s = standardize(z.const_data_ptr<scalar_t>(), n, d);
    const std::vector<scalar_t> t = linspace<scalar_t>(a, b, K), v = linspace<scalar_t>(-std::sqrt(3.0), std::sqrt(3.0), K);
    QK_ISA_CALL(cliff_kernel<scalar_t>)(s.x.data(), n, d, t.data(), K, v.data(), K, cond.const_data_ptr<int64_t>(),
                                        cond.size(1), sigma, (b - a) / double(K), 0.0, 0.0, 0.0, &terms, nullptr);
    const scalar_t uni = static_cast<scalar_t>(terms[0]), biv = static_cast<scalar_t>(terms[1]),
                   kl = static_cast<scalar_t>(terms[2]);
    const scalar_t total = static_cast<scalar_t>(lu) * uni + static_cast<scalar_t>(lb) * biv + static_cast<scalar_t>(lk) * kl;
    for (const scalar_t value : {total, uni, biv, kl}) out.push_back(cpu_scalar_tensor(value, z.scalar_type(), z));
  });
  return {out[0], out[1], out[2], out[3]};
}

Tensor cliff_loss_backward_cpu(const std::optional<Tensor>& g_total, const std::optional<Tensor>& g_uni,
                               const std::optional<Tensor>& g_biv, const std::optional<Tensor>& g_kl, const Tensor& z_,
                               const Tensor& cond_, double sigma, double a, double b, int64_t K, double lu, double lb,
                               double lk) {
  const std::optional<Tensor> grads[4] = {g_total, g_uni, g_biv, g_kl};
  check_cliff_loss_backward(grads, z_, cond_, sigma, a, b, K, "cliff_loss_backward");
  const auto value = [](const std::optional<Tensor>& g) { return g.has_value() ? cpu_scalar(*g) : 0.0; };
  const double gt = value(g_total);
  const Tensor z = as_contiguous(z_), cond = as_contiguous(cond_);
  const int64_t n = z.size(0), d = z.size(1);
  Tensor gz = alloc_like(z);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const Standardized<scalar_t> s = standardize(z.const_data_ptr<scalar_t>(), n, d);
    const std::vector<scalar_t> t = linspace<scalar_t>(a, b, K), v = linspace<scalar_t>(-std::sqrt(3.0), std::sqrt(3.0), K);
    std::vector<scalar_t> gx(n * d);
    QK_ISA_CALL(cliff_kernel<scalar_t>)(s.x.data(), n, d, t.data(), K, v.data(), K, cond.const_data_ptr<int64_t>(),
                                        cond.size(1), sigma, (b - a) / double(K), lu * gt + value(g_uni),
                                        lb * gt + value(g_biv), lk * gt + value(g_kl), nullptr, gx.data());
    // x = (z - mean) / std: dz = (gx - mean(gx) - x mean(gx x)) / std (no last term where std is clamped)
    std::vector<double> mg(d, 0.0), mgx(d, 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < d; ++j) {
        mg[j] += gx[r * d + j];
        mgx[j] += double(gx[r * d + j]) * double(s.x[r * d + j]);
      }
    scalar_t* out = gz.mutable_data_ptr<scalar_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < d; ++j) {
        const double proj = s.unclamped[j] ? mgx[j] / double(n) : 0.0;
        out[r * d + j] = static_cast<scalar_t>((double(gx[r * d + j]) - mg[j] / double(n) - double(s.x[r * d + j]) * proj) /
                                               double(s.std[j]));
      }
  });
  return gz;
}

// ============================================================================ klm
// std absent: the population std of z + 1e-6 per column (differentiable in z), computed here.

template <typename T>
std::vector<T> default_std(const T* z, int64_t n, int64_t d, std::vector<double>* mean, std::vector<double>* var) {
  mean->assign(d, 0.0);
  var->assign(d, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) (*mean)[j] += z[r * d + j];
  for (int64_t j = 0; j < d; ++j) (*mean)[j] /= double(n);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) {
      const double dev = double(z[r * d + j]) - (*mean)[j];
      (*var)[j] += dev * dev;
    }
  std::vector<T> std(d);
  for (int64_t j = 0; j < d; ++j) {
    (*var)[j] /= double(n);
    std[j] = static_cast<T>(std::sqrt((*var)[j])) + static_cast<T>(1e-6);
  }
  return std;
}

std::tuple<Tensor, Tensor> klm_cpu(const Tensor& z_, const std::optional<Tensor>& std_) {
  check_klm(z_, std_, "klm");
  check_finite(z_, "z", "klm");
  if (std_.has_value()) check_finite(*std_, "std", "klm", /*positive=*/true);
  const Tensor z = as_contiguous(z_);
  const int64_t n = z.size(0), d = z.size(1);
  Tensor lse = alloc({n, d + 1}, z.scalar_type(), z);
  double loss = 0.0;
  const std::optional<Tensor> given = std_.has_value() ? std::optional(as_contiguous(*std_)) : std::nullopt;
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    std::vector<double> mean, var;
    const std::vector<scalar_t> own = given.has_value() ? std::vector<scalar_t>() :
                                      default_std(z.const_data_ptr<scalar_t>(), n, d, &mean, &var);
    const scalar_t* s = given.has_value() ? given->const_data_ptr<scalar_t>() : own.data();
    loss = QK_ISA_CALL(klm_forward_kernel<scalar_t>)(z.const_data_ptr<scalar_t>(), s, n, d,
                                                     lse.mutable_data_ptr<scalar_t>());
  });
  return {cpu_scalar_tensor(loss, z.scalar_type(), z), lse};
}

std::tuple<Tensor, Tensor> klm_backward_cpu(const Tensor& grad_loss, const Tensor& z_, const std::optional<Tensor>& std_,
                                            const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const Tensor z = as_contiguous(z_), lse = as_contiguous(lse_);
  const int64_t n = z.size(0), d = z.size(1);
  Tensor gz = alloc_like(z), gs = alloc({std_.has_value() ? d : 0}, z.scalar_type(), z);
  const std::optional<Tensor> given = std_.has_value() ? std::optional(as_contiguous(*std_)) : std::nullopt;
  const double grad = cpu_scalar(grad_loss);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    std::vector<double> mean, var;
    const std::vector<scalar_t> own = given.has_value() ? std::vector<scalar_t>() :
                                      default_std(z.const_data_ptr<scalar_t>(), n, d, &mean, &var);
    const scalar_t* s = given.has_value() ? given->const_data_ptr<scalar_t>() : own.data();
    std::vector<scalar_t> gstd(d);
    scalar_t* out = gz.mutable_data_ptr<scalar_t>();
    QK_ISA_CALL(klm_backward_kernel<scalar_t>)(grad, z.const_data_ptr<scalar_t>(), s,
                                               lse.const_data_ptr<scalar_t>(), n, d, out, gstd.data());
    if (given.has_value()) {
      std::copy(gstd.begin(), gstd.end(), gs.mutable_data_ptr<scalar_t>());
      return;
    }
    // the default std's share: dstd_j / dz_rj = (z_rj - mean_j) / (n sqrt(var_j)), 0 where var_j = 0
    const scalar_t* zz = z.const_data_ptr<scalar_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < d; ++j)
        if (var[j] > 0)
          out[r * d + j] += static_cast<scalar_t>(double(gstd[j]) * (double(zz[r * d + j]) - mean[j]) /
                                                  (double(n) * std::sqrt(var[j])));
  });
  return {gz, gs};
}

}  // namespace

}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("kde_grid", TORCH_BOX(&qkernels::kde_grid_cpu));
  m.impl("kde_grid_backward", TORCH_BOX(&qkernels::kde_grid_backward_cpu));
  m.impl("cliff_loss", TORCH_BOX(&qkernels::cliff_loss_cpu));
  m.impl("cliff_loss_backward", TORCH_BOX(&qkernels::cliff_loss_backward_cpu));
  m.impl("klm", TORCH_BOX(&qkernels::klm_cpu));
  m.impl("klm_backward", TORCH_BOX(&qkernels::klm_backward_cpu));
}
