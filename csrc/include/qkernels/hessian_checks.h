// Argument checks of the finite_difference_curvature ops, shared by the CPU kernels
// (csrc/cpu/hessian.cpp) and the CUDA glue (csrc/cuda/hessian_glue.cpp). Uses torch: never include
// from a .cu kernel file.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace qkernels {

using at::Tensor;

struct FdShape {
  int64_t n, k, groups, M, offset;  // offset: center rows before the perturbed blocks (0 or n)
  bool use_max;
};

inline FdShape check_fd(const Tensor& stacked, int64_t n, int64_t k, double eps, int64_t groups,
                 c10::string_view reduce, const char* op) {
  TORCH_CHECK(stacked.dim() == 2, op, ": stacked must be (R, M), got ", stacked.sizes());
  TORCH_CHECK(at::isFloatingType(stacked.scalar_type()), op, ": stacked must be floating point");
  TORCH_CHECK(n >= 1, op, ": n must be >= 1, got ", n);
  TORCH_CHECK(k >= 2, op, ": num_perturbations must be >= 2, got ", k);
  TORCH_CHECK(groups == 1 || groups == 2, op, ": groups must be 1 or 2, got ", groups);
  TORCH_CHECK(eps > 0, op, ": eps must be > 0, got ", eps);
  TORCH_CHECK(reduce == "mean" || reduce == "max", op, ": reduce must be 'mean' or 'max', got '",
              std::string(reduce), "'");
  const int64_t R = stacked.size(0), P = 2 * k * groups * n;
  TORCH_CHECK(R == P || R == P + n, op, ": stacked must have n * 2k * groups = ", P,
              " rows (or ", P + n, " with the n center rows first), got ", R);
  TORCH_CHECK(stacked.size(1) >= 1, op, ": stacked must have at least one column");
  return {n, k, groups, stacked.size(1), R - P, reduce == "max"};
}

}  // namespace qkernels
