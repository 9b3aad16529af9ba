// Argument checks shared by every op's CPU kernels and CUDA glue (the *_checks.h headers build on
// these). Uses torch: never include from a .cu kernel file.
#pragma once

#include <ATen/ATen.h>

namespace qkernels {

using at::Tensor;

// t on ref's device with ref's dtype (a CUDA kernel must never be handed a host pointer).
inline void check_like(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name, const char* op) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ", ref_name, " is on ",
              ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(), " but ",
              ref_name, " has dtype ", ref.scalar_type());
}

// A floating-point tensor (float32 or float64: the kernels' dtypes).
inline void check_floating(const Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
              " must be float32 or float64, got ", t.scalar_type());
}

// An int64 index tensor on ref's device.
inline void check_index(const Tensor& idx, const char* name, const Tensor& ref, const char* op) {
  TORCH_CHECK(idx.scalar_type() == at::kLong, op, ": ", name, " must be int64, got ", idx.scalar_type());
  TORCH_CHECK(idx.device() == ref.device(), op, ": ", name, " is on ", idx.device(), " but the data is on ",
              ref.device());
}

// Index values in [0, hi): checked on CPU tensors only. Reading them on a GPU would synchronize the
// host with the device; the CUDA kernels never read out of bounds and write NaN instead.
inline void check_index_range(const Tensor& idx, int64_t hi, const char* name, const char* op) {
  if (!idx.device().is_cpu() || idx.numel() == 0) return;
  const auto mm = at::aminmax(idx);
  const int64_t lo_v = std::get<0>(mm).item<int64_t>(), hi_v = std::get<1>(mm).item<int64_t>();
  TORCH_CHECK(lo_v >= 0 && hi_v < hi, op, ": ", name, " must hold values in [0, ", hi, "), got values in [", lo_v,
              ", ", hi_v, "]");
}

// A one-element upstream gradient on ref's device.
inline void check_scalar_grad(const Tensor& g, const char* name, const Tensor& ref, const char* op) {
  TORCH_CHECK(g.numel() == 1, op, ": ", name, " must hold one element, got shape ", g.sizes());
  TORCH_CHECK(g.device() == ref.device(), op, ": ", name, " is on ", g.device(), " but the data is on ",
              ref.device());
}

}  // namespace qkernels
