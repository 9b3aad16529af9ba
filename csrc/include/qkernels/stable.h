// The part of the LibTorch stable ABI the CPU kernels and the CUDA glue use, and the few helpers they
// share: argument checks with one-line messages, float32/float64 dispatch, allocation, 0-dim results.
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
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace qkernels {

using Tensor = torch::stable::Tensor;
using torch::headeronly::ScalarType;

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

// QK_CHECK(cond, message parts...): a RuntimeError in Python with exactly the message (no file or line:
// STD_TORCH_CHECK would prefix both). QK_CHECK_VALUE: a ValueError: it throws std::invalid_argument,
// which PyTorch's Python binding (pybind11) translates to ValueError, as TORCH_CHECK_VALUE's error type
// was (that one is not part of the stable ABI); tests/test_backend.py checks the type.
#define QK_CHECK(cond, ...)                                                  \
  do {                                                                       \
    if (!(cond)) throw std::runtime_error(::qkernels::detail::cat(__VA_ARGS__)); \
  } while (0)
#define QK_CHECK_VALUE(cond, ...)                                                \
  do {                                                                           \
    if (!(cond)) throw std::invalid_argument(::qkernels::detail::cat(__VA_ARGS__)); \
  } while (0)

// Shapes and devices in messages as torch prints them: [5, 3], cpu, cuda:0.
struct Shape {
  torch::headeronly::IntHeaderOnlyArrayRef sizes;
};
inline Shape shape(const Tensor& t) { return {t.sizes()}; }
inline std::ostream& operator<<(std::ostream& out, const Shape& s) {
  out << '[';
  for (size_t i = 0; i < s.sizes.size(); ++i) out << (i ? ", " : "") << s.sizes[i];
  return out << ']';
}

struct DeviceName {
  int32_t type, index;
};
inline DeviceName device_of(const Tensor& t) {
  DeviceName d{};
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &d.type));
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), &d.index));
  return d;
}
inline bool operator==(const DeviceName& a, const DeviceName& b) { return a.type == b.type && a.index == b.index; }
inline bool is_cpu(const Tensor& t) { return device_of(t).type == aoti_torch_device_type_cpu(); }
inline std::ostream& operator<<(std::ostream& out, const DeviceName& d) {
  if (d.type == aoti_torch_device_type_cpu()) out << "cpu";
  else if (d.type == aoti_torch_device_type_cuda()) out << "cuda";
  else if (d.type == aoti_torch_device_type_meta()) out << "meta";
  else out << "device type " << d.type;
  if (d.index >= 0) out << ':' << d.index;
  return out;
}

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
