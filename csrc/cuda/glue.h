// Helpers shared by the TORCH_LIBRARY_IMPL(qkernels, CUDA) glue files (csrc/cuda/*_glue.cpp): built
// only with CUDA torch. Schemas: csrc/schemas.cpp; argument checks: csrc/include/qkernels/*_checks.h.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

namespace qkernels {

// Raise (a RuntimeError in Python) when a kernel launch reported an error.
inline void check_cuda(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace qkernels
