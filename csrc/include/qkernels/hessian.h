// Math of the Hessian hot path (finite-difference curvature), shared by the CPU and CUDA kernels.
//
// The stacked activations hold, for each group g (Rademacher, then Gaussian directions) and each
// direction l < k, a "plus" block f(z + h_l) and a "minus" block f(z - h_l) of n rows each, in the
// order [g0: +h_1, -h_1, ..., +h_k, -h_k; g1: ...]. For one activation element (sample i, column c)
// the second central difference along h_l is
//     fd_l = (f(z + h_l) - 2 f(z) + f(z - h_l)) / eps^2,
// and the curvature statistic is var_l(fd_l) (population or unbiased). A variance over l is invariant
// to a shift common to every fd_l of the element, so the kernels never need f(z): they compute
//     y_l = (f(z + h_l) - f(z + h_0)) + (f(z - h_l) - f(z - h_0)) = eps^2 (fd_l - fd_0),
//     var_l(fd_l) = var_l(y_l) / eps^4
// with a two-pass (mean, then squared deviations) variance, accumulated in acc_type<T>. Shifting by
// direction 0 keeps the sums at the size of the differences: the sums f(z + h_l) + f(z - h_l) carry
// 2 f(z), and in float32 a mean over them rounds at 2 f(z)'s last bit, far above the curvature's;
// the backward's gradients of an element then no longer sum to zero over the directions, and the
// decoder's Jacobian at z (the large common part of its Jacobians at z +- h_l) leaks into the
// gradient: 4e-3 relative error in float32 on a Tripod-sized GELU decoder, against 4e-5 with the
// shift, as the authors' float32 code (tests/test_jax.py::test_nhp_float32_gradient_at_tripods_decoder).
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

// y_l of one element (the difference to direction 0, times eps^2).
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE A fd_point(const T* x, int64_t stride, int64_t l) {
  return (A(x[(2 * l) * stride]) - A(x[0])) + (A(x[(2 * l + 1) * stride]) - A(x[stride]));
}

// Mean over the k directions of y_l.
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE A fd_column_mean(const T* x, int64_t stride, int64_t k) {
  A s = 0;
  for (int64_t l = 1; l < k; ++l) s += fd_point<T, A>(x, stride, l);  // y_0 = 0
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
  const A mean = fd_column_mean<T, A>(x, stride, k);
  A m2 = 0;
  for (int64_t l = 0; l < k; ++l) {
    const A dev = (fd_point<T, A>(x, stride, l) - mean) * inv_eps2;
    m2 += dev * dev;
  }
  return m2 / fd_var_divisor<A>(k, unbiased);
}

// Backward of one element: d var / d plus_l = d var / d minus_l = 2 (y_l - mean) / eps^4 / divisor.
// `coef` is the upstream gradient of the element's variance; writes the 2k entries of g (same
// layout as x). The center's gradient is exactly zero (it cancels from the variance); so is the sum
// of the 2k entries (to rounding; exactly for k = 2, where the two deviations are negatives).
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE void fd_column_backward(const T* x, int64_t stride, int64_t k, A inv_eps2, bool unbiased,
                                       A coef, T* g) {
  const A mean = fd_column_mean<T, A>(x, stride, k);
  const A scale = coef * A(2) * inv_eps2 / fd_var_divisor<A>(k, unbiased);
  for (int64_t l = 0; l < k; ++l) {
    const T v = T(scale * ((fd_point<T, A>(x, stride, l) - mean) * inv_eps2));
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
