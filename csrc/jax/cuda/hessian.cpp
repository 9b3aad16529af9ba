// CUDA XLA FFI handlers of finite_difference_curvature: the checks of qkernels/hessian_checks.h and the launchers
// of csrc/cuda/hessian.cu, as the torch glue csrc/cuda/hessian_glue.cpp calls them. argmax is int64 in the kernels:
// an int32 one (JAX without x64) goes through an int64 copy in scratch memory.
#include <string_view>

#include "../../cuda/hessian.cuh"
#include "common.h"
#include "qkernels/hessian_checks.h"

namespace qkernels {
namespace jaxffi {
namespace gpu {
namespace {

ffi::Error fd_curvature_fwd(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator alloc,
                            ffi::AnyBuffer stacked_, int64_t n, int64_t k, double eps, int64_t groups, bool unbiased,
                            std::string_view reduce, ffi::Result<ffi::AnyBuffer> values_,
                            ffi::Result<ffi::AnyBuffer> argmax_) {
  return run(ordinal, [&] {
    const Buffer stacked = view(stacked_, ordinal), values = view(values_, ordinal), argmax = view(argmax_, ordinal);
    const FdShape s = check_fd(stacked, n, k, eps, groups, reduce, "finite_difference_curvature");
    const int64_t M = s.M, cbs = cuda::fd_curvature_col_blocks(M);
    int64_t* argmax64 = indices64(argmax, alloc, stream, /*copy_in=*/false, "finite_difference_curvature");
    int64_t* part_arg = scratch<int64_t>(alloc, groups * n * cbs, "finite_difference_curvature");
    dispatch_floating(stacked.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* part_sum = scratch<T>(alloc, groups * n * cbs, "finite_difference_curvature");
      T* part_max = scratch<T>(alloc, groups * n * cbs, "finite_difference_curvature");
      check_cuda(cuda::fd_curvature_fwd<T>(stacked.const_data_ptr<T>(), part_sum, part_max, part_arg,
                                           values.mutable_data_ptr<T>(), argmax64, n, M, k, groups, s.offset, eps,
                                           unbiased, s.use_max, stream),
                 "finite_difference_curvature");
    });
    indices_out(argmax64, argmax, stream, "finite_difference_curvature");
  });
}

ffi::Error fd_curvature_bwd(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator alloc, ffi::AnyBuffer grad_,
                            ffi::AnyBuffer stacked_, ffi::AnyBuffer argmax_, int64_t n, int64_t k, double eps,
                            int64_t groups, bool unbiased, std::string_view reduce,
                            ffi::Result<ffi::AnyBuffer> out_) {
  return run(ordinal, [&] {
    const Buffer grad = view(grad_, ordinal), stacked = view(stacked_, ordinal), argmax = view(argmax_, ordinal),
                 out = view(out_, ordinal);
    const FdShape s = check_fd_backward(grad, stacked, argmax, n, k, eps, groups, reduce,
                                        "finite_difference_curvature_backward", /*int32_index=*/true);
    check_like(grad, "grad", stacked, "stacked", "finite_difference_curvature_backward");
    const int64_t* argmax64 = indices64(argmax, alloc, stream, /*copy_in=*/true, "finite_difference_curvature_backward");
    dispatch_floating(stacked.dtype, [&](auto zero) {
      using T = decltype(zero);
      if (s.offset > 0)  // the center rows cancel: their gradient is zero
        check_cuda(cudaMemsetAsync(out.data, 0, static_cast<size_t>(s.offset * s.M) * sizeof(T), stream),
                   "finite_difference_curvature_backward");
      check_cuda(cuda::fd_curvature_bwd<T>(grad.const_data_ptr<T>(), stacked.const_data_ptr<T>(), argmax64,
                                           out.mutable_data_ptr<T>(), n, s.M, k, groups, s.offset, eps, unbiased,
                                           s.use_max, stream),
                 "finite_difference_curvature_backward");
    });
  });
}

}  // namespace
}  // namespace gpu
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qg = qkernels::jaxffi::gpu;

QK_FFI_CUDA_TARGET("finite_difference_curvature", qk_fd_curvature_fwd_cuda, qg::fd_curvature_fwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Ctx<ffi::ScratchAllocator>()
                       .Arg<ffi::AnyBuffer>()
                       .Attr<int64_t>("n")
                       .Attr<int64_t>("num_perturbations")
                       .Attr<double>("eps")
                       .Attr<int64_t>("groups")
                       .Attr<bool>("unbiased")
                       .Attr<std::string_view>("reduce")
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>());
QK_FFI_CUDA_TARGET("finite_difference_curvature_backward", qk_fd_curvature_bwd_cuda, qg::fd_curvature_bwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Ctx<ffi::ScratchAllocator>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Attr<int64_t>("n")
                       .Attr<int64_t>("num_perturbations")
                       .Attr<double>("eps")
                       .Attr<int64_t>("groups")
                       .Attr<bool>("unbiased")
                       .Attr<std::string_view>("reduce")
                       .Ret<ffi::AnyBuffer>());
