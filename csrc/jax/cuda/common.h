// What the CUDA handlers of the JAX front-end share (the library qkernels/jax/_kernels_cuda.abi3.so, built with the
// CUDA kernels: setup.py): buffers seen as on the call's GPU (the checks read their shapes; values are not checked
// on a GPU, as the torch ops' CUDA glue does not: reading them would synchronize the host with the device), the
// call's stream and device, XLA's scratch memory for the kernels' workspaces, and index copies between the int32
// indices of JAX without x64 and the kernels' int64. The kernels are csrc/cuda/*.cu, the torch ops' (no torch there).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>

#include "../ffi_common.h"

namespace qkernels {
namespace jaxffi {
namespace gpu {

using Stream = ffi::PlatformStream<cudaStream_t>;

// An FFI buffer on GPU `ordinal`.
inline Buffer view(const ffi::AnyBuffer& b, int32_t ordinal) {
  Buffer out = jaxffi::view(b);
  out.device = {DeviceName::Cuda, 1, ordinal};
  return out;
}
inline Buffer view(ffi::Result<ffi::AnyBuffer>& b, int32_t ordinal) { return view(*b, ordinal); }
inline std::optional<Buffer> view(const std::optional<ffi::AnyBuffer>& b, int32_t ordinal) {
  return b.has_value() ? std::optional<Buffer>(view(*b, ordinal)) : std::nullopt;
}

inline void check_cuda(cudaError_t err, const char* op) {
  QK_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

// `count` elements of T of XLA's scratch memory for this call (stream-ordered: freed after the call's kernels).
template <typename T>
T* scratch(ffi::ScratchAllocator& alloc, int64_t count, const char* op) {
  const std::optional<void*> p = alloc.Allocate(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T), 256);
  QK_CHECK(p.has_value(), op, ": could not allocate ", count * int64_t(sizeof(T)), " bytes of GPU scratch memory");
  return static_cast<T*>(*p);
}

// int32 <-> int64 copies of n indices on the stream (index.cu).
cudaError_t copy_indices(const int32_t* in, int64_t* out, int64_t n, cudaStream_t stream);
cudaError_t copy_indices(const int64_t* in, int32_t* out, int64_t n, cudaStream_t stream);

// The kernels' int64 view of an index buffer: itself when it is int64, else an int64 copy in scratch memory
// (`copy_in`: of its values, for an input).
inline int64_t* indices64(const Buffer& idx, ffi::ScratchAllocator& alloc, cudaStream_t stream, bool copy_in,
                          const char* op) {
  if (idx.dtype == DType::Int64) return idx.mutable_data_ptr<int64_t>();
  int64_t* out = scratch<int64_t>(alloc, idx.numel(), op);
  if (copy_in) check_cuda(copy_indices(idx.const_data_ptr<int32_t>(), out, idx.numel(), stream), op);
  return out;
}

// After the kernel: the int64 indices into an int32 output buffer (nothing to do for an int64 one).
inline void indices_out(const int64_t* idx64, const Buffer& idx, cudaStream_t stream, const char* op) {
  if (idx.dtype == DType::Int32)
    check_cuda(copy_indices(idx64, idx.mutable_data_ptr<int32_t>(), idx.numel(), stream), op);
}

// Runs body() on GPU `ordinal` (the kernels size their grids for the current device); a failed check becomes an
// FFI error carrying its message, as run() (ffi_common.h) does on the CPU.
template <typename F>
ffi::Error run(int32_t ordinal, F&& body) {
  try {
    int current = -1;
    cudaGetDevice(&current);
    if (current != ordinal) check_cuda(cudaSetDevice(ordinal), "qkernels");
    body();
    return ffi::Error::Success();
  } catch (const std::invalid_argument& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

}  // namespace gpu
}  // namespace jaxffi
}  // namespace qkernels
