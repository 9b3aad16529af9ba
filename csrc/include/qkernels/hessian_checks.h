// Argument checks of the finite_difference_curvature ops, shared by the CPU kernels
// (csrc/cpu/hessian.cpp) and the CUDA glue (csrc/cuda/hessian_glue.cpp). Uses torch: never include
// from a .cu kernel file.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "qkernels/checks.h"

namespace qkernels {

struct FdShape {
  int64_t n, k, groups, M, offset;  // offset: center rows before the perturbed blocks (0 or n)
  bool use_max;
};

inline FdShape check_fd(const Tensor& stacked, int64_t n, int64_t k, double eps, int64_t groups,
                 c10::string_view reduce, const char* op) {
  TORCH_CHECK(stacked.dim() == 2, op, ": stacked must be (R, M), got ", stacked.sizes());
  check_floating(stacked, "stacked", op);
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

inline FdShape check_fd_backward(const Tensor& grad, const Tensor& stacked, const Tensor& argmax, int64_t n, int64_t k,
                                 double eps, int64_t groups, c10::string_view reduce, const char* op) {
  const FdShape s = check_fd(stacked, n, k, eps, groups, reduce, op);
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == groups && grad.size(1) == n, op, ": grad must be (groups, n) = (",
              groups, ", ", n, "), got ", grad.sizes());
  TORCH_CHECK(argmax.sizes() == grad.sizes(), op, ": argmax must be (groups, n), got ", argmax.sizes());
  TORCH_CHECK(grad.device() == stacked.device(), op, ": grad is on ", grad.device(), " but stacked is on ",
              stacked.device());
  check_index(argmax, "argmax", stacked, op);
  return s;
}

}  // namespace qkernels
