// Helpers shared by the STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA) glue files (csrc/cuda/*_glue.cpp): built
// only with CUDA torch (setup.py defines USE_CUDA for the stable shim's CUDA part). Schemas:
// csrc/schemas.cpp; argument checks: csrc/include/qkernels/*_checks.h.
#pragma once

#include "qkernels/stable.h"

#include <cuda_runtime_api.h>
#include <torch/csrc/stable/accelerator.h>

namespace qkernels {

// Raise (a RuntimeError in Python) when a kernel launch reported an error.
inline void check_cuda(cudaError_t err, const char* op) {
  QK_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

// Makes t's GPU current for the scope (torch's device guard, through the stable ABI) and hands out
// torch's current stream on it, where the kernels launch.
class OnDevice {
 public:
  explicit OnDevice(const Tensor& t) : index_(device_of(t).index), guard_(index_) {}
  cudaStream_t stream() const {
    void* s = nullptr;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(index_, &s));
    return static_cast<cudaStream_t>(s);
  }

 private:
  int32_t index_;
  torch::stable::accelerator::DeviceGuard guard_;
};

}  // namespace qkernels
