// Torch binding of the CPU Hessian-path op finite_difference_curvature (schemas: csrc/schemas.cpp): argument
// checks, contiguous inputs, outputs; the op itself is csrc/cpu/hessian_impl.h (raw pointers, shared with the XLA
// FFI binding csrc/jax/hessian_ffi.cpp), threaded by torch::stable::parallel_for (qkernels/parallel.h).
#include "qkernels/stable.h"

#include <string_view>

#include "hessian_impl.h"
#include "qkernels/hessian_checks.h"

namespace qkernels {
namespace {

std::tuple<Tensor, Tensor> finite_difference_curvature_cpu(const Tensor& stacked_, int64_t n, int64_t k,
                                                           double eps, int64_t groups, bool unbiased,
                                                           std::string_view reduce) {
  const FdShape s = check_fd(stacked_, n, k, eps, groups, reduce, "finite_difference_curvature");
  const Tensor stacked = as_contiguous(stacked_);
  Tensor values = alloc({groups, n}, stacked.scalar_type(), stacked);
  Tensor argmax = alloc({groups, n}, ScalarType::Long, stacked);
  dispatch_floating(stacked.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::fd_curvature_forward<scalar_t, int64_t>(stacked.const_data_ptr<scalar_t>(), s, eps, unbiased,
                                                 values.mutable_data_ptr<scalar_t>(),
                                                 argmax.mutable_data_ptr<int64_t>());
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
  Tensor grad_stacked = alloc_like(stacked);
  dispatch_floating(stacked.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::fd_curvature_backward<scalar_t, int64_t>(grad.const_data_ptr<scalar_t>(), stacked.const_data_ptr<scalar_t>(),
                                                  argmax.const_data_ptr<int64_t>(), s, eps, unbiased,
                                                  grad_stacked.mutable_data_ptr<scalar_t>());
  });
  return grad_stacked;
}

}  // namespace
}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("finite_difference_curvature", TORCH_BOX(&qkernels::finite_difference_curvature_cpu));
  m.impl("finite_difference_curvature_backward", TORCH_BOX(&qkernels::finite_difference_curvature_backward_cpu));
}
