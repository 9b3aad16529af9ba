// Block-wide sums shared by the CUDA kernel files. No torch: compiled with plain nvcc.
#pragma once

#include <cuda_runtime.h>

namespace qkernels {
namespace cuda {

// Sum of v over a block of Threads threads (a power of two) in a fixed order (deterministic), returned to
// every thread. shared: Threads values.
template <int Threads, typename A>
__device__ A block_sum(A v, A* shared) {
  static_assert(Threads > 0 && (Threads & (Threads - 1)) == 0, "block_sum: Threads must be a power of two");
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = Threads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const A total = shared[0];
  __syncthreads();
  return total;
}

}  // namespace cuda
}  // namespace qkernels
