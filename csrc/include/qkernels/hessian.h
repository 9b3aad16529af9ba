// Math of the Hessian hot path (finite-difference curvature), shared by the CPU and CUDA kernels.
//
// The stacked activations hold, for each group g (Rademacher, then Gaussian directions) and each
// direction l < k, a "plus" block f(z + h_l) and a "minus" block f(z - h_l) of n rows each, in the
// order [g0: +h_1, -h_1, ..., +h_k, -h_k; g1: ...]. For one activation element (sample i, column c)
// the second central difference along h_l is
//     fd_l = (f(z + h_l) - 2 f(z) + f(z - h_l)) / eps^2,
// and the curvature statistic is var_l(fd_l) (population or unbiased). The center f(z) is common
// to every fd_l of the element, so it cancels exactly from the variance: the kernels compute
//     x_l = (f(z + h_l) + f(z - h_l)) / eps^2,   var_l(fd_l) = var_l(x_l)
// with a two-pass (mean, then squared deviations) variance, accumulated in acc_type<T>.
//
// Pointers: x points at the element in the plus block of direction 0 of a group; the plus and
// minus blocks of direction l are at x + (2 l) * stride and x + (2 l + 1) * stride, stride = n * M.
#pragma once

#include <stdint.h>

#include "qkernels/common.h"

namespace qkernels {

// The shape of a stacked batch (what check_fd returns, the CPU kernels take): n samples, k directions, groups,
// M columns, `offset` center rows before the perturbed blocks (0 or n; they cancel), the "max" reduction.
struct FdShape {
  int64_t n, k, groups, M, offset;
  bool use_max;
};

// x_l of one element: (plus + minus) / eps^2.
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE A fd_point(const T* x, int64_t stride, int64_t l, A inv_eps2) {
  return (A(x[(2 * l) * stride]) + A(x[(2 * l + 1) * stride])) * inv_eps2;
}

// Mean over the k directions of x_l.
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE A fd_column_mean(const T* x, int64_t stride, int64_t k, A inv_eps2) {
  A s = 0;
  for (int64_t l = 0; l < k; ++l) s += fd_point<T, A>(x, stride, l, inv_eps2);
  return s / A(k);
}

// Divisor of the variance: k (population) or k - 1 (unbiased).
template <typename A>
QK_HOST_DEVICE A fd_var_divisor(int64_t k, bool unbiased) {
  return A(unbiased ? k - 1 : k);
}

// Variance over the k directions of the second differences of one element (two-pass).
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE A fd_column_var(const T* x, int64_t stride, int64_t k, A inv_eps2, bool unbiased) {
  const A mean = fd_column_mean<T, A>(x, stride, k, inv_eps2);
  A m2 = 0;
  for (int64_t l = 0; l < k; ++l) {
    const A dev = fd_point<T, A>(x, stride, l, inv_eps2) - mean;
    m2 += dev * dev;
  }
  return m2 / fd_var_divisor<A>(k, unbiased);
}

// Backward of one element: d var / d plus_l = d var / d minus_l = 2 (x_l - mean) / divisor / eps^2.
// `coef` is the upstream gradient of the element's variance; writes the 2k entries of g (same
// layout as x). The center's gradient is exactly zero (it cancels from the variance).
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE void fd_column_backward(const T* x, int64_t stride, int64_t k, A inv_eps2, bool unbiased,
                                       A coef, T* g) {
  const A mean = fd_column_mean<T, A>(x, stride, k, inv_eps2);
  const A scale = coef * A(2) * inv_eps2 / fd_var_divisor<A>(k, unbiased);
  for (int64_t l = 0; l < k; ++l) {
    const T v = T(scale * (fd_point<T, A>(x, stride, l, inv_eps2) - mean));
    g[(2 * l) * stride] = v;
    g[(2 * l + 1) * stride] = v;
  }
}

// Running (max, first argmax) update; *best_c < 0 means empty. Keeps the earlier index on ties.
template <typename A>
QK_HOST_DEVICE void max_update(A v, int64_t c, A* best, int64_t* best_c) {
  if (*best_c < 0 || v > *best || (v == *best && c < *best_c)) {
    *best = v;
    *best_c = c;
  }
}

}  // namespace qkernels
