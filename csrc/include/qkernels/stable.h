// The part of the LibTorch stable ABI the CPU kernels and the CUDA glue use, and the few helpers they
// share: the torch side of the framework-free checks (qkernels/check_core.h: dtype_of, device_of),
// float32/float64 dispatch, allocation, 0-dim results.
// Every torch symbol reached from here is a C function of the stable shim (aoti_torch_* / torch_*),
// so qkernels._C loads in every torch release >= TORCH_TARGET_VERSION (setup.py sets it: 2.11).
// Include this header before any other torch header. Uses torch: never include from a .cu kernel file.
#pragma once

#ifndef TORCH_TARGET_VERSION
#error "TORCH_TARGET_VERSION must be set (setup.py passes -DTORCH_TARGET_VERSION, the oldest torch supported)"
#endif

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>
#include <torch/headeronly/util/shim_utils.h>

#include <cstdint>
#include <initializer_list>

#include "qkernels/check_core.h"

namespace qkernels {

using Tensor = torch::stable::Tensor;
using torch::headeronly::ScalarType;

// The torch side of qkernels/check_core.h: what the framework-free checks ask of a tensor.
inline DType dtype_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return DType::Float32;
    case ScalarType::Double: return DType::Float64;
    case ScalarType::Half: return DType::Float16;
    case ScalarType::BFloat16: return DType::BFloat16;
    case ScalarType::Int: return DType::Int32;
    case ScalarType::Long: return DType::Int64;
    case ScalarType::Bool: return DType::Bool;
    default: return DType::Other;
  }
}

inline DeviceName device_of(const Tensor& t) {
  int32_t type = 0, index = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), &index));
  const DeviceName::Kind kind = type == aoti_torch_device_type_cpu()    ? DeviceName::Cpu
                                : type == aoti_torch_device_type_cuda() ? DeviceName::Cuda
                                : type == aoti_torch_device_type_meta() ? DeviceName::Meta
                                                                        : DeviceName::Other;
  return {kind, type, index};
}
inline bool is_cpu(const Tensor& t) { return device_of(t).kind == DeviceName::Cpu; }

// f(scalar_t{}) for a float32 or float64 dtype (the kernels' dtypes; the checks reject others first):
//   dispatch_floating(t.scalar_type(), [&](auto zero) { using scalar_t = decltype(zero); ... });
template <typename F>
decltype(auto) dispatch_floating(ScalarType type, F&& f) {
  if (type == ScalarType::Float) return f(float{});
  QK_CHECK(type == ScalarType::Double, "qkernels: dtype ", type, " is not float32 or float64");
  return f(double{});
}

// A new contiguous tensor of `sizes` and `dtype` on `like`'s device (one stable C call, no dispatcher
// lookup: the kernels allocate their outputs on every call).
inline Tensor alloc(std::initializer_list<int64_t> sizes, ScalarType dtype, const Tensor& like) {
  int64_t strides[8];
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  int64_t stride = 1;
  for (int64_t i = ndim - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= sizes.begin()[i];
  }
  const DeviceName dev = device_of(like);
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      ndim, sizes.begin(), strides, torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype)), dev.type,
      dev.index, &out));
  return Tensor(out);
}

// A contiguous tensor shaped and typed like t (t's contents not copied), on t's device.
inline Tensor alloc_like(const Tensor& t) {
  const auto s = t.sizes();
  QK_CHECK(s.size() <= 3, "qkernels: empty_like of a ", s.size(), "-d tensor");
  switch (s.size()) {
    case 0: return alloc({}, t.scalar_type(), t);
    case 1: return alloc({s[0]}, t.scalar_type(), t);
    case 2: return alloc({s[0], s[1]}, t.scalar_type(), t);
    default: return alloc({s[0], s[1], s[2]}, t.scalar_type(), t);
  }
}

// t itself when contiguous, else a contiguous copy (asking first spares a dispatcher call).
inline Tensor as_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// t in dtype (t itself when it already has it).
inline Tensor to_dtype(const Tensor& t, ScalarType dtype) {
  return t.scalar_type() == dtype ? t : torch::stable::to(t, dtype);
}

// The value of a one-element CPU tensor of any dtype, as a double (float32 / float64 read directly: a conversion
// would cost a dispatcher call and an allocation, microseconds per backward call).
inline double cpu_scalar(const Tensor& t) {
  const ScalarType type = t.scalar_type();
  if (type == ScalarType::Float) return *t.const_data_ptr<float>();
  if (type == ScalarType::Double) return *t.const_data_ptr<double>();
  return *to_dtype(t, ScalarType::Double).const_data_ptr<double>();
}

// A 0-dim CPU tensor of `dtype` holding value.
inline Tensor cpu_scalar_tensor(double value, ScalarType dtype, const Tensor& like) {
  Tensor out = alloc({}, dtype, like);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    *out.mutable_data_ptr<scalar_t>() = static_cast<scalar_t>(value);
  });
  return out;
}

}  // namespace qkernels
