// TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the Hessian-path kernels: checks, allocation,
// stream, then the raw-pointer launchers of csrc/cuda/hessian.cu. Built only with CUDA torch.
// Schemas: csrc/schemas.cpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "hessian.cuh"
#include "glue.h"
#include "qkernels/hessian_checks.h"

namespace qkernels {
namespace {

using at::Tensor;

std::tuple<Tensor, Tensor> finite_difference_curvature_cuda(const Tensor& stacked_, int64_t n, int64_t k,
                                                            double eps, int64_t groups, bool unbiased,
                                                            c10::string_view reduce) {
  const int64_t offset = check_fd(stacked_, n, k, eps, groups, reduce, "finite_difference_curvature").offset;
  const c10::cuda::CUDAGuard guard(stacked_.device());
  const Tensor stacked = stacked_.contiguous();
  const int64_t M = stacked.size(1), cbs = cuda::fd_curvature_col_blocks(M);
  Tensor part_sum = at::empty({groups, n, cbs}, stacked.options());
  Tensor part_max = at::empty_like(part_sum);
  Tensor part_arg = at::empty({groups, n, cbs}, stacked.options().dtype(at::kLong));
  Tensor values = at::empty({groups, n}, stacked.options());
  Tensor argmax = at::empty({groups, n}, stacked.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(stacked.scalar_type(), "finite_difference_curvature_cuda", [&] {
    check_cuda(cuda::fd_curvature_fwd<scalar_t>(
                   stacked.data_ptr<scalar_t>(), part_sum.data_ptr<scalar_t>(), part_max.data_ptr<scalar_t>(),
                   part_arg.data_ptr<int64_t>(), values.data_ptr<scalar_t>(), argmax.data_ptr<int64_t>(), n,
                   M, k, groups, offset, eps, unbiased, reduce == "max", c10::cuda::getCurrentCUDAStream()),
               "finite_difference_curvature");
  });
  return {values, argmax};
}

Tensor finite_difference_curvature_backward_cuda(const Tensor& grad_, const Tensor& stacked_,
                                                 const Tensor& argmax_, int64_t n, int64_t k, double eps,
                                                 int64_t groups, bool unbiased, c10::string_view reduce) {
  const int64_t offset = check_fd_backward(grad_, stacked_, argmax_, n, k, eps, groups, reduce,
                                           "finite_difference_curvature_backward").offset;
  const c10::cuda::CUDAGuard guard(stacked_.device());
  const Tensor stacked = stacked_.contiguous();
  const Tensor grad = grad_.to(stacked.scalar_type()).contiguous(), argmax = argmax_.contiguous();
  const int64_t M = stacked.size(1);
  Tensor grad_stacked = at::empty_like(stacked);
  if (offset > 0) grad_stacked.narrow(0, 0, offset).zero_();  // the center cancels
  AT_DISPATCH_FLOATING_TYPES(stacked.scalar_type(), "finite_difference_curvature_backward_cuda", [&] {
    check_cuda(cuda::fd_curvature_bwd<scalar_t>(
                   grad.data_ptr<scalar_t>(), stacked.data_ptr<scalar_t>(), argmax.data_ptr<int64_t>(),
                   grad_stacked.data_ptr<scalar_t>(), n, M, k, groups, offset, eps, unbiased,
                   reduce == "max", c10::cuda::getCurrentCUDAStream()),
               "finite_difference_curvature_backward");
  });
  return grad_stacked;
}

}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("finite_difference_curvature", &finite_difference_curvature_cuda);
  m.impl("finite_difference_curvature_backward", &finite_difference_curvature_backward_cuda);
}

}  // namespace qkernels
