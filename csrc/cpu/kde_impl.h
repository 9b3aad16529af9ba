// The CPU KDE ops on raw pointers (contiguous row-major data, float32 or float64): what the torch binding
// (csrc/cpu/kde.cpp) and the XLA FFI binding (csrc/jax/kde_ffi.cpp) both call, neither copying the other.
// No torch and no XLA here: threads through qkernels::parallel_for (qkernels/parallel.h). Include once per
// library (it instantiates the kernels of csrc/cpu/kde_kernels.h for baseline x86-64 and for AVX+FMA, and
// picks the copy the CPU supports at run time: csrc/cpu/isa.h).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "isa.h"
#include "qkernels/kde.h"
#include "qkernels/parallel.h"

namespace qkernels {
namespace {
constexpr double kSqrt2Pi = 2.5066282746310002;
}  // namespace

#define QK_KERNELS_FILE "kde_kernels.h"
#include "isa_copies.h"

namespace cpu {

// ============================================================================ kde_grid
// points (d, K), samples (n, d) -> out (d, K); backward: grad (d, K) -> grad_points (d, K), grad_samples (n, d).

template <typename T>
void kde_grid_forward(const T* points, const T* samples, int64_t n, int64_t d, int64_t K, double sigma,
                      bool derivative, T* out) {
  QK_ISA_CALL(kde_grid_kernel<T>)(points, samples, n, d, K, sigma, derivative, out, nullptr, nullptr, nullptr);
}

template <typename T>
void kde_grid_backward(const T* grad, const T* points, const T* samples, int64_t n, int64_t d, int64_t K,
                       double sigma, bool derivative, T* grad_points, T* grad_samples) {
  QK_ISA_CALL(kde_grid_kernel<T>)(points, samples, n, d, K, sigma, derivative, nullptr, grad, grad_points,
                                  grad_samples);
}

// ============================================================================ cliff_loss
// The set-up around the kernel (qkernels/reference/kde.py cliff_loss), in plain loops: the
// standardization x = (z - mean) / std with std = sqrt(max(var, kMinVar)) per column, the grids
// linspace(a, b, K) and linspace(-sqrt 3, sqrt 3, K) (torch.linspace's formula), the lambdas; and the
// backward through the standardization.

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

struct CliffArgs {
  double sigma, a, b;
  int64_t K;
  double lambda_uni, lambda_biv, lambda_kl;
};

// z (n, d), cond (d, M) row indices -> {total, uni, biv, kl}.
template <typename T>
std::array<T, 4> cliff_loss_forward(const T* z, int64_t n, int64_t d, const int64_t* cond, int64_t M,
                                    const CliffArgs& c) {
  const Standardized<T> s = standardize(z, n, d);
  const std::vector<T> t = linspace<T>(c.a, c.b, c.K), v = linspace<T>(-std::sqrt(3.0), std::sqrt(3.0), c.K);
  std::vector<double> terms;
  QK_ISA_CALL(cliff_kernel<T>)(s.x.data(), n, d, t.data(), c.K, v.data(), c.K, cond, M, c.sigma,
                               (c.b - c.a) / double(c.K), 0.0, 0.0, 0.0, &terms, nullptr);
  const T uni = static_cast<T>(terms[0]), biv = static_cast<T>(terms[1]), kl = static_cast<T>(terms[2]);
  const T total = static_cast<T>(c.lambda_uni) * uni + static_cast<T>(c.lambda_biv) * biv +
                  static_cast<T>(c.lambda_kl) * kl;
  return {total, uni, biv, kl};
}

// grads: the upstream gradients of {total, uni, biv, kl} -> grad_z (n, d).
template <typename T>
void cliff_loss_backward(const double grads[4], const T* z, int64_t n, int64_t d, const int64_t* cond, int64_t M,
                         const CliffArgs& c, T* grad_z) {
  const Standardized<T> s = standardize(z, n, d);
  const std::vector<T> t = linspace<T>(c.a, c.b, c.K), v = linspace<T>(-std::sqrt(3.0), std::sqrt(3.0), c.K);
  std::vector<T> gx(n * d);
  const double gt = grads[0];
  QK_ISA_CALL(cliff_kernel<T>)(s.x.data(), n, d, t.data(), c.K, v.data(), c.K, cond, M, c.sigma,
                               (c.b - c.a) / double(c.K), c.lambda_uni * gt + grads[1], c.lambda_biv * gt + grads[2],
                               c.lambda_kl * gt + grads[3], nullptr, gx.data());
  // x = (z - mean) / std: dz = (gx - mean(gx) - x mean(gx x)) / std (no last term where std is clamped)
  std::vector<double> mg(d, 0.0), mgx(d, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) {
      mg[j] += gx[r * d + j];
      mgx[j] += double(gx[r * d + j]) * double(s.x[r * d + j]);
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) {
      const double proj = s.unclamped[j] ? mgx[j] / double(n) : 0.0;
      grad_z[r * d + j] = static_cast<T>((double(gx[r * d + j]) - mg[j] / double(n) - double(s.x[r * d + j]) * proj) /
                                         double(s.std[j]));
    }
}

// ============================================================================ klm
// std null: the population std of z + 1e-6 per column (differentiable in z), computed here.

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

// z (n, d), std (d,) or null -> the loss; lse (n, d + 1) the per-sample log-sum-exps the backward reuses.
template <typename T>
double klm_forward(const T* z, const T* std, int64_t n, int64_t d, T* lse) {
  std::vector<double> mean, var;
  const std::vector<T> own = std != nullptr ? std::vector<T>() : default_std(z, n, d, &mean, &var);
  return QK_ISA_CALL(klm_forward_kernel<T>)(z, std != nullptr ? std : own.data(), n, d, lse);
}

// grad: the loss's upstream gradient -> grad_z (n, d) and, with std given, grad_std (d,) (std null: the
// default std's share goes to grad_z; grad_std unused).
template <typename T>
void klm_backward(double grad, const T* z, const T* std, const T* lse, int64_t n, int64_t d, T* grad_z, T* grad_std) {
  std::vector<double> mean, var;
  const std::vector<T> own = std != nullptr ? std::vector<T>() : default_std(z, n, d, &mean, &var);
  std::vector<T> gstd(d);
  QK_ISA_CALL(klm_backward_kernel<T>)(grad, z, std != nullptr ? std : own.data(), lse, n, d, grad_z, gstd.data());
  if (std != nullptr) {
    std::copy(gstd.begin(), gstd.end(), grad_std);
    return;
  }
  // the default std's share: dstd_j / dz_rj = (z_rj - mean_j) / (n sqrt(var_j)), 0 where var_j = 0
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j)
      if (var[j] > 0)
        grad_z[r * d + j] += static_cast<T>(double(gstd[j]) * (double(z[r * d + j]) - mean[j]) /
                                            (double(n) * std::sqrt(var[j])));
}

}  // namespace cpu
}  // namespace qkernels
