// STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the Hessian-path kernels: checks, allocation,
// stream, then the raw-pointer launchers of csrc/cuda/hessian.cu. Built only with CUDA torch.
// Schemas: csrc/schemas.cpp.
#include "glue.h"
#include "hessian.cuh"
#include "qkernels/hessian_checks.h"

#include <string_view>

namespace qkernels {
namespace {

std::tuple<Tensor, Tensor> finite_difference_curvature_cuda(const Tensor& stacked_, int64_t n, int64_t k,
                                                            double eps, int64_t groups, bool unbiased,
                                                            std::string_view reduce) {
  const int64_t offset = check_fd(stacked_, n, k, eps, groups, reduce, "finite_difference_curvature").offset;
  const OnDevice on(stacked_);
  const Tensor stacked = as_contiguous(stacked_);
  const int64_t M = stacked.size(1), cbs = cuda::fd_curvature_col_blocks(M);
  const ScalarType dtype = stacked.scalar_type();
  Tensor part_sum = alloc({groups, n, cbs}, dtype, stacked);
  Tensor part_max = alloc_like(part_sum);
  Tensor part_arg = alloc({groups, n, cbs}, ScalarType::Long, stacked);
  Tensor values = alloc({groups, n}, dtype, stacked);
  Tensor argmax = alloc({groups, n}, ScalarType::Long, stacked);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::fd_curvature_fwd<scalar_t>(
                   stacked.const_data_ptr<scalar_t>(), part_sum.mutable_data_ptr<scalar_t>(),
                   part_max.mutable_data_ptr<scalar_t>(), part_arg.mutable_data_ptr<int64_t>(),
                   values.mutable_data_ptr<scalar_t>(), argmax.mutable_data_ptr<int64_t>(), n, M, k, groups, offset,
                   eps, unbiased, reduce == "max", on.stream()),
               "finite_difference_curvature");
  });
  return {values, argmax};
}

Tensor finite_difference_curvature_backward_cuda(const Tensor& grad_, const Tensor& stacked_,
                                                 const Tensor& argmax_, int64_t n, int64_t k, double eps,
                                                 int64_t groups, bool unbiased, std::string_view reduce) {
  const int64_t offset = check_fd_backward(grad_, stacked_, argmax_, n, k, eps, groups, reduce,
                                           "finite_difference_curvature_backward").offset;
  const OnDevice on(stacked_);
  const Tensor stacked = as_contiguous(stacked_);
  const Tensor grad = as_contiguous(to_dtype(grad_, stacked.scalar_type())), argmax = as_contiguous(argmax_);
  const int64_t M = stacked.size(1);
  Tensor grad_stacked = alloc_like(stacked);
  if (offset > 0) {  // the center cancels
    Tensor center = torch::stable::narrow(grad_stacked, 0, 0, offset);
    torch::stable::zero_(center);
  }
  dispatch_floating(stacked.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::fd_curvature_bwd<scalar_t>(
                   grad.const_data_ptr<scalar_t>(), stacked.const_data_ptr<scalar_t>(),
                   argmax.const_data_ptr<int64_t>(), grad_stacked.mutable_data_ptr<scalar_t>(), n, M, k, groups,
                   offset, eps, unbiased, reduce == "max", on.stream()),
               "finite_difference_curvature_backward");
  });
  return grad_stacked;
}

}  // namespace
}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("finite_difference_curvature", TORCH_BOX(&qkernels::finite_difference_curvature_cuda));
  m.impl("finite_difference_curvature_backward", TORCH_BOX(&qkernels::finite_difference_curvature_backward_cuda));
}
