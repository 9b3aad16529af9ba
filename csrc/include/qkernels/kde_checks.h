// Argument checks of the KDE ops, shared by the CPU kernels (csrc/cpu/kde.cpp) and the CUDA glue
// (csrc/cuda/kde_glue.cpp). Uses torch: never include from a .cu kernel file.
#pragma once

#include <ATen/ATen.h>

namespace qkernels {

using at::Tensor;

inline void check_klm(const Tensor& z, const Tensor& std, const char* op) {
  TORCH_CHECK(z.dim() == 2 && z.size(0) >= 1 && z.size(1) >= 1, op, ": z must be (n, d), got ", z.sizes());
  TORCH_CHECK(std.dim() == 1 && std.size(0) == z.size(1), op, ": std must be (d,), got ", std.sizes());
  TORCH_CHECK(std.scalar_type() == z.scalar_type(), op, ": dtype mismatch");
}

inline void check_kde_grid(const Tensor& points, const Tensor& samples, double sigma, const char* op) {
  TORCH_CHECK(points.dim() == 2 && samples.dim() == 2 && samples.size(1) == points.size(0), op,
              ": points must be (d, K) and samples (n, d), got ", points.sizes(), " and ", samples.sizes());
  TORCH_CHECK(points.scalar_type() == samples.scalar_type(), op, ": dtype mismatch");
  TORCH_CHECK(samples.size(0) >= 1, op, ": empty samples");
  TORCH_CHECK(sigma > 0, op, ": sigma must be > 0");
}

inline void check_cliff(const Tensor& x, const Tensor& grid, const Tensor& uni_points, const Tensor& cond, double sigma,
                 double step, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(1) >= 1, op, ": x must be (n, d), got ", x.sizes());
  TORCH_CHECK(grid.dim() == 1 && grid.size(0) >= 2, op, ": grid must be (K,), K >= 2, got ", grid.sizes());
  TORCH_CHECK(uni_points.dim() == 1 && uni_points.size(0) >= 1, op, ": uni_points must be (K_u,)");
  TORCH_CHECK(cond.dim() == 2 && cond.size(0) == x.size(1) && cond.size(1) >= 1 && cond.scalar_type() == at::kLong,
              op, ": cond_index must be int64 (d, M), got ", cond.sizes());
  TORCH_CHECK(grid.scalar_type() == x.scalar_type() && uni_points.scalar_type() == x.scalar_type(), op,
              ": dtype mismatch");
  TORCH_CHECK(grid.device() == x.device() && uni_points.device() == x.device() && cond.device() == x.device(), op,
              ": all tensors must be on the same device");
  TORCH_CHECK(sigma > 0 && step > 0, op, ": sigma and step must be > 0");
}

}  // namespace qkernels
