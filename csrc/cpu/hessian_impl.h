// The CPU finite_difference_curvature op on raw pointers (contiguous row-major data, float32 or float64; int64 or
// int32 argmax): what the torch binding (csrc/cpu/hessian.cpp) and the XLA FFI binding (csrc/jax/hessian_ffi.cpp)
// both call. Math lives in csrc/include/qkernels/hessian.h, shared with csrc/cuda. No torch and no XLA here:
// threads through qkernels::parallel_for (qkernels/parallel.h).
//
// It reduces the stacked activations (R, M) of the finite-difference batch to per-sample statistics
// (groups, n): the mean (or max, with its first argmax) over the M activation columns of the variance over k
// directions of the second central differences. Work items are (sample, column tile); each writes its own
// partials, which are combined in a fixed order, so results do not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "qkernels/hessian.h"
#include "qkernels/parallel.h"

namespace qkernels {
namespace cpu {

constexpr int64_t kTile = 512;  // activation columns per work item

// Backward of work items [w0, w1) (sample, column tile). Everything arrives by value: called from the lambda that
// torch::stable::parallel_for runs through a function pointer, a loop reading captured references reloads them
// after every store through gp (which might alias them) and does not vectorize (2x this loop's time).
template <typename scalar_t, typename A, typename index_t>
void backward_items(int64_t w0, int64_t w1, const scalar_t* __restrict__ xp, const scalar_t* __restrict__ go,
                    const index_t* __restrict__ ap, scalar_t* __restrict__ gp,
                    int64_t n, int64_t k, int64_t groups, int64_t M, int64_t n_tiles, A inv_eps2, bool unbiased,
                    bool use_max) {
  const int64_t stride = n * M;
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t i = w / n_tiles, t = w % n_tiles;
    const int64_t c0 = t * kTile, c1 = std::min(M, c0 + kTile);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t off = (g * 2 * k) * stride + i * M;
      const A gout = A(go[g * n + i]);
      const int64_t am = static_cast<int64_t>(ap[g * n + i]);
      for (int64_t c = c0; c < c1; ++c) {
        if (use_max && c != am) {
          for (int64_t r = 0; r < 2 * k; ++r) gp[off + r * stride + c] = scalar_t(0);
          continue;
        }
        const A coef = use_max ? gout : gout / A(M);
        fd_column_backward<scalar_t, A>(xp + off + c, stride, k, inv_eps2, unbiased, coef, gp + off + c);
      }
    }
  }
}

// stacked (offset + 2 k groups n, M) (its shape: FdShape, qkernels/hessian.h) -> values (groups, n), argmax
// (groups, n).
template <typename scalar_t, typename index_t>
void fd_curvature_forward(const scalar_t* stacked, const FdShape& s, double eps, bool unbiased, scalar_t* vp,
                          index_t* ap) {
  using A = typename acc_type<scalar_t>::type;
  const int64_t n = s.n, k = s.k, groups = s.groups, M = s.M, n_tiles = (M + kTile - 1) / kTile, stride = n * M;
  const int64_t slots = groups * n * n_tiles;
  std::vector<double> part_sum(slots), part_max(slots);
  std::vector<int64_t> part_arg(slots);
  const scalar_t* xp = stacked + s.offset * M;
  const A inv_eps2 = A(1.0 / (eps * eps));
  parallel_for(0, n * n_tiles, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t i = w / n_tiles, t = w % n_tiles;
      const int64_t c0 = t * kTile, c1 = std::min(M, c0 + kTile);
      for (int64_t g = 0; g < groups; ++g) {
        const scalar_t* base = xp + (g * 2 * k) * stride + i * M;
        A sum = 0, best = 0;
        int64_t best_c = -1;
        for (int64_t c = c0; c < c1; ++c) {
          const A v = fd_column_var<scalar_t, A>(base + c, stride, k, inv_eps2, unbiased);
          sum += v;
          max_update(v, c, &best, &best_c);
        }
        const int64_t slot = (g * n + i) * n_tiles + t;
        part_sum[slot] = sum;
        part_max[slot] = best;
        part_arg[slot] = best_c;
      }
    }
  });
  for (int64_t gi = 0; gi < groups * n; ++gi) {
    double sum = 0, best = 0;
    int64_t best_c = -1;
    for (int64_t t = 0; t < n_tiles; ++t) {
      sum += part_sum[gi * n_tiles + t];
      max_update(part_max[gi * n_tiles + t], part_arg[gi * n_tiles + t], &best, &best_c);
    }
    vp[gi] = static_cast<scalar_t>(s.use_max ? best : sum / static_cast<double>(M));
    ap[gi] = static_cast<index_t>(best_c);
  }
}

// grad (groups, n), stacked, argmax -> grad_stacked (like stacked; the center rows get 0).
template <typename scalar_t, typename index_t>
void fd_curvature_backward(const scalar_t* grad, const scalar_t* stacked, const index_t* argmax, const FdShape& s,
                           double eps, bool unbiased, scalar_t* grad_stacked) {
  using A = typename acc_type<scalar_t>::type;
  const int64_t M = s.M, n_tiles = (M + kTile - 1) / kTile;
  const scalar_t* xp = stacked + s.offset * M;
  scalar_t* gp = grad_stacked + s.offset * M;
  std::fill(grad_stacked, gp, scalar_t(0));  // the center rows cancel
  const A inv_eps2 = A(1.0 / (eps * eps));
  const int64_t n = s.n, k = s.k, groups = s.groups;
  const bool use_max = s.use_max;
  parallel_for(0, n * n_tiles, 1, [&](int64_t w0, int64_t w1) {
    backward_items<scalar_t, A, index_t>(w0, w1, xp, grad, argmax, gp, n, k, groups, M, n_tiles, inv_eps2, unbiased,
                                         use_max);
  });
}

}  // namespace cpu
}  // namespace qkernels
