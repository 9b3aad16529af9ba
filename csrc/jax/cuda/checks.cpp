// The run-time value check's CUDA handler (qkernels/jax/_ffi.py check_values; the CPU one: csrc/jax/checks_ffi.cpp):
// on a GPU the identity without reading the values (a read would synchronize the host with the device; the torch
// ops' CUDA glue does not check values either, qkernels/checks.h).
#include <string_view>

#include "common.h"

namespace qkernels {
namespace jaxffi {
namespace gpu {
namespace {

ffi::Error check_values(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x_, std::string_view, std::string_view,
                        bool, ffi::Result<ffi::AnyBuffer> out_) {
  return run(ordinal, [&] {
    const Buffer x = view(x_, ordinal), out = view(out_, ordinal);
    if (out.data != x.data)  // aliased unless XLA had to keep the input alive
      check_cuda(cudaMemcpyAsync(out.data, x.data, static_cast<size_t>(x.numel()) * (x.dtype == DType::Float32 ? 4 : 8),
                                 cudaMemcpyDeviceToDevice, stream),
                 "check_values");
  });
}

}  // namespace
}  // namespace gpu
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qg = qkernels::jaxffi::gpu;

QK_FFI_HELPER("check_values", "CUDA", qk_check_values_cuda, qg::check_values,
              ffi::Ffi::Bind()
                  .Ctx<qg::Stream>()
                  .Ctx<ffi::DeviceOrdinal>()
                  .Arg<ffi::AnyBuffer>()
                  .Attr<std::string_view>("op")
                  .Attr<std::string_view>("name")
                  .Attr<bool>("positive")
                  .Ret<ffi::AnyBuffer>());
