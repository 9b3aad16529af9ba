// CUDA XLA FFI handlers of latent_quantize: the checks of qkernels/quantize_checks.h and the launchers of
// csrc/cuda/quantize.cu, as the torch glue csrc/cuda/quantize_glue.cpp calls them. The kernels write and read int64
// indices: int32 ones (JAX without x64) go through an int64 copy in scratch memory.
#include <type_traits>

#include "../../cuda/quantize.cuh"
#include "common.h"
#include "qkernels/quantize_checks.h"

namespace qkernels {
namespace jaxffi {
namespace gpu {
namespace {

ffi::Error latent_quantize_fwd(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator alloc, ffi::AnyBuffer z_,
                               ffi::AnyBuffer values_, ffi::Result<ffi::AnyBuffer> zq_,
                               ffi::Result<ffi::AnyBuffer> idx_, ffi::Result<ffi::AnyBuffer> loss_q_,
                               ffi::Result<ffi::AnyBuffer> loss_c_) {
  return run(ordinal, [&] {
    const Buffer z = view(z_, ordinal), values = view(values_, ordinal), zq = view(zq_, ordinal),
                 idx = view(idx_, ordinal), loss_q = view(loss_q_, ordinal), loss_c = view(loss_c_, ordinal);
    check_codebook(z, values, "latent_quantize");
    const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
    int64_t* idx64 = indices64(idx, alloc, stream, /*copy_in=*/false, "latent_quantize");
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* partial = scratch<T>(alloc, cuda::latent_quantize_num_blocks(N, d), "latent_quantize");
      check_cuda(cuda::latent_quantize_fwd<T>(z.const_data_ptr<T>(), values.const_data_ptr<T>(),
                                              zq.mutable_data_ptr<T>(), idx64, partial, loss_q.mutable_data_ptr<T>(),
                                              loss_c.mutable_data_ptr<T>(), N, d, G, nv, stream),
                 "latent_quantize");
    });
    indices_out(idx64, idx, stream, "latent_quantize");
  });
}

ffi::Error latent_quantize_bwd(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator alloc,
                               ffi::AnyBuffer grad_zq_, ffi::AnyBuffer grad_lq_, ffi::AnyBuffer grad_lc_,
                               ffi::AnyBuffer z_, ffi::AnyBuffer values_, ffi::AnyBuffer idx_,
                               ffi::Result<ffi::AnyBuffer> gz_, ffi::Result<ffi::AnyBuffer> gv_) {
  return run(ordinal, [&] {
    const Buffer grad_zq = view(grad_zq_, ordinal), grad_lq = view(grad_lq_, ordinal),
                 grad_lc = view(grad_lc_, ordinal), z = view(z_, ordinal), values = view(values_, ordinal),
                 idx = view(idx_, ordinal), gz = view(gz_, ordinal), gv = view(gv_, ordinal);
    check_latent_quantize_backward(grad_zq, grad_lq, grad_lc, z, values, idx, "latent_quantize_backward",
                                   /*int32_index=*/true);
    check_like(grad_lq, "grad_loss_quantize", z, "z", "latent_quantize_backward");
    check_like(grad_lc, "grad_loss_commit", z, "z", "latent_quantize_backward");
    const int64_t N = z.size(0), d = z.size(1), G = values.size(0), nv = values.size(1);
    const int64_t* idx64 = indices64(idx, alloc, stream, /*copy_in=*/true, "latent_quantize_backward");
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* workspace = scratch<T>(alloc, cuda::latent_quantize_workspace(N, d, G, nv, std::is_same_v<T, double>),
                                "latent_quantize_backward");
      check_cuda(cuda::latent_quantize_bwd<T>(grad_zq.const_data_ptr<T>(), grad_lq.const_data_ptr<T>(),
                                              grad_lc.const_data_ptr<T>(), z.const_data_ptr<T>(),
                                              values.const_data_ptr<T>(), idx64, gz.mutable_data_ptr<T>(),
                                              gv.mutable_data_ptr<T>(), workspace, N, d, G, nv, stream),
                 "latent_quantize_backward");
    });
  });
}

}  // namespace
}  // namespace gpu
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qg = qkernels::jaxffi::gpu;

QK_FFI_CUDA_TARGET("latent_quantize", qk_latent_quantize_fwd_cuda, qg::latent_quantize_fwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Ctx<ffi::ScratchAllocator>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>());
QK_FFI_CUDA_TARGET("latent_quantize_backward", qk_latent_quantize_bwd_cuda, qg::latent_quantize_bwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Ctx<ffi::ScratchAllocator>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>());
