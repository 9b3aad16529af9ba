// CPU kernels of the Hessian hot path, threaded by torch::stable::parallel_for (schemas: csrc/schemas.cpp).
// Math lives in csrc/include/qkernels/hessian.h, shared with csrc/cuda.
//
// finite_difference_curvature reduces the stacked activations (R, M) of the finite-difference
// batch to per-sample statistics (groups, n): the mean (or max, with its first argmax) over the M
// activation columns of the variance over k directions of the second central differences. Work
// items are (sample, column tile); each writes its own partials, which are combined in a fixed
// order, so results do not depend on the number of threads.
#include "qkernels/stable.h"

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "qkernels/hessian.h"
#include "qkernels/hessian_checks.h"

namespace qkernels {
namespace {

constexpr int64_t kTile = 512;  // activation columns per work item

// Backward of work items [w0, w1) (sample, column tile). Everything arrives by value: called from the lambda that
// torch::stable::parallel_for runs through a function pointer, a loop reading captured references reloads them
// after every store through gp (which might alias them) and does not vectorize (2x this loop's time).
template <typename scalar_t, typename A>
void backward_items(int64_t w0, int64_t w1, const scalar_t* __restrict__ xp, const scalar_t* __restrict__ go,
                    const int64_t* __restrict__ ap, scalar_t* __restrict__ gp,
                    int64_t n, int64_t k, int64_t groups, int64_t M, int64_t n_tiles, A inv_eps2, bool unbiased,
                    bool use_max) {
  const int64_t stride = n * M;
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t i = w / n_tiles, t = w % n_tiles;
    const int64_t c0 = t * kTile, c1 = std::min(M, c0 + kTile);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t off = (g * 2 * k) * stride + i * M;
      const A gout = A(go[g * n + i]);
      const int64_t am = ap[g * n + i];
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

std::tuple<Tensor, Tensor> finite_difference_curvature_cpu(const Tensor& stacked_, int64_t n, int64_t k,
                                                           double eps, int64_t groups, bool unbiased,
                                                           std::string_view reduce) {
  const FdShape s = check_fd(stacked_, n, k, eps, groups, reduce, "finite_difference_curvature");
  const Tensor stacked = as_contiguous(stacked_);
  const int64_t M = s.M, n_tiles = (M + kTile - 1) / kTile, stride = n * M;
  const int64_t slots = groups * n * n_tiles;
  std::vector<double> part_sum(slots), part_max(slots);
  std::vector<int64_t> part_arg(slots);
  Tensor values = alloc({groups, n}, stacked.scalar_type(), stacked);
  Tensor argmax = alloc({groups, n}, ScalarType::Long, stacked);
  dispatch_floating(stacked.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    using A = typename acc_type<scalar_t>::type;
    const scalar_t* xp = stacked.const_data_ptr<scalar_t>() + s.offset * M;
    const A inv_eps2 = A(1.0 / (eps * eps));
    torch::stable::parallel_for(0, n * n_tiles, 1, [&](int64_t w0, int64_t w1) {
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
    scalar_t* vp = values.mutable_data_ptr<scalar_t>();
    int64_t* ap = argmax.mutable_data_ptr<int64_t>();
    for (int64_t gi = 0; gi < groups * n; ++gi) {
      double sum = 0, best = 0;
      int64_t best_c = -1;
      for (int64_t t = 0; t < n_tiles; ++t) {
        sum += part_sum[gi * n_tiles + t];
        max_update(part_max[gi * n_tiles + t], part_arg[gi * n_tiles + t], &best, &best_c);
      }
      vp[gi] = static_cast<scalar_t>(s.use_max ? best : sum / static_cast<double>(M));
      ap[gi] = best_c;
    }
  });
  return {values, argmax};
}

Tensor finite_difference_curvature_backward_cpu(const Tensor& grad_, const Tensor& stacked_,
                                                const Tensor& argmax_, int64_t n, int64_t k, double eps,
                                                int64_t groups, bool unbiased, std::string_view reduce) {
  const FdShape s = check_fd_backward(grad_, stacked_, argmax_, n, k, eps, groups, reduce,
                                      "finite_difference_curvature_backward");
  const Tensor stacked = as_contiguous(stacked_);
  const Tensor grad = as_contiguous(to_dtype(grad_, stacked.scalar_type())), argmax = as_contiguous(argmax_);
  const int64_t M = s.M, n_tiles = (M + kTile - 1) / kTile;
  Tensor grad_stacked = alloc_like(stacked);
  dispatch_floating(stacked.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    using A = typename acc_type<scalar_t>::type;
    const scalar_t* xp = stacked.const_data_ptr<scalar_t>() + s.offset * M;
    scalar_t* gp = grad_stacked.mutable_data_ptr<scalar_t>() + s.offset * M;
    std::fill(gp - s.offset * M, gp, scalar_t(0));  // the center rows cancel
    const scalar_t* go = grad.const_data_ptr<scalar_t>();
    const int64_t* ap = argmax.const_data_ptr<int64_t>();
    const A inv_eps2 = A(1.0 / (eps * eps));
    torch::stable::parallel_for(0, n * n_tiles, 1, [&](int64_t w0, int64_t w1) {
      backward_items<scalar_t, A>(w0, w1, xp, go, ap, gp, n, k, groups, M, n_tiles, inv_eps2, unbiased, s.use_max);
    });
  });
  return grad_stacked;
}

}  // namespace

}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("finite_difference_curvature", TORCH_BOX(&qkernels::finite_difference_curvature_cpu));
  m.impl("finite_difference_curvature_backward", TORCH_BOX(&qkernels::finite_difference_curvature_backward_cpu));
}
