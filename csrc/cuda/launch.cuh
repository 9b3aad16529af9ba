// Launch-shape helpers shared by the CUDA kernel files. No torch: compiled with plain nvcc.
#pragma once

#include <cuda_runtime.h>

namespace qkernels {
namespace cuda {

// SMs of the current device, read at run time (grids are sized for the GPU they run on, never for one model).
inline int device_sms() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                cudaSuccess)
    return 1;
  return sms > 0 ? sms : 1;
}

}  // namespace cuda
}  // namespace qkernels
