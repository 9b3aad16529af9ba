// Argument checks of the finite_difference_curvature ops, shared by the CPU kernels (csrc/cpu/hessian.cpp), the
// CUDA glue (csrc/cuda/hessian_glue.cpp) and the XLA FFI handlers (csrc/jax/hessian_ffi.cpp): templates over the
// front-end's tensor type (qkernels/check_core.h). Never include from a .cu kernel file.
#pragma once

#include <string>
#include <string_view>

#include "qkernels/checks.h"
#include "qkernels/hessian.h"

namespace qkernels {

template <typename X>
FdShape check_fd(const X& stacked, int64_t n, int64_t k, double eps, int64_t groups, std::string_view reduce,
                 const char* op) {
  QK_CHECK(stacked.dim() == 2, op, ": stacked must be (R, M), got ", shape(stacked));
  check_floating(stacked, "stacked", op);
  QK_CHECK(n >= 1, op, ": n must be >= 1, got ", n);
  QK_CHECK(k >= 2, op, ": num_perturbations must be >= 2, got ", k);
  QK_CHECK(groups == 1 || groups == 2, op, ": groups must be 1 or 2, got ", groups);
  QK_CHECK(eps > 0, op, ": eps must be > 0, got ", eps);
  QK_CHECK(reduce == "mean" || reduce == "max", op, ": reduce must be 'mean' or 'max', got '",
           std::string(reduce), "'");
  const int64_t R = stacked.size(0), P = 2 * k * groups * n;
  QK_CHECK(R == P || R == P + n, op, ": stacked must have n * 2k * groups = ", P,
           " rows (or ", P + n, " with the n center rows first), got ", R);
  QK_CHECK(stacked.size(1) >= 1, op, ": stacked must have at least one column");
  return {n, k, groups, stacked.size(1), R - P, reduce == "max"};
}

// int32_index: argmax may be int32 (JAX without x64), else int64.
template <typename X>
FdShape check_fd_backward(const X& grad, const X& stacked, const X& argmax, int64_t n, int64_t k, double eps,
                          int64_t groups, std::string_view reduce, const char* op, bool int32_index = false) {
  const FdShape s = check_fd(stacked, n, k, eps, groups, reduce, op);
  QK_CHECK(grad.dim() == 2 && grad.size(0) == groups && grad.size(1) == n, op, ": grad must be (groups, n) = (",
           groups, ", ", n, "), got ", shape(grad));
  QK_CHECK(same_shape(argmax, grad), op, ": argmax must be (groups, n), got ", shape(argmax));
  QK_CHECK(device_of(grad) == device_of(stacked), op, ": grad is on ", device_of(grad), " but stacked is on ",
           device_of(stacked));
  check_index(argmax, "argmax", stacked, op, int32_index);
  return s;
}

}  // namespace qkernels
