// Index copies between int32 (JAX without x64) and int64 (the CUDA kernels): csrc/jax/cuda/common.h.
#include <cuda_runtime.h>

#include <cstdint>

namespace qkernels {
namespace jaxffi {
namespace gpu {
namespace {

template <typename From, typename To>
__global__ void copy_kernel(const From* in, To* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = static_cast<To>(in[i]);
}

template <typename From, typename To>
cudaError_t launch(const From* in, To* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  copy_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t copy_indices(const int32_t* in, int64_t* out, int64_t n, cudaStream_t stream) {
  return launch(in, out, n, stream);
}
cudaError_t copy_indices(const int64_t* in, int32_t* out, int64_t n, cudaStream_t stream) {
  return launch(in, out, n, stream);
}

}  // namespace gpu
}  // namespace jaxffi
}  // namespace qkernels
