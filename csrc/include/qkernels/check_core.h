// Framework-free pieces of the argument checks (qkernels/checks.h and the *_checks.h headers build on them):
// the error macros, and dtype, device and shape names for messages. No torch and no XLA type here: each
// front-end gives its tensor type X what the checks use (two front-ends, one set of kernels):
//   members  X::dim(), X::size(i), X::numel(), X::const_data_ptr<T>()
//   free     dtype_of(X) -> DType, device_of(X) -> DeviceName, as_contiguous(X) -> X
// torch: qkernels/stable.h (torch::stable::Tensor); XLA FFI: csrc/jax/ffi_common.h (a view of an ffi buffer).
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace qkernels {

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
// was (that one is not part of the stable ABI); tests/test_backend.py checks the type. The XLA FFI
// handlers return both as an FFI error carrying the message (csrc/jax/ffi_common.h).
#define QK_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) throw std::runtime_error(::qkernels::detail::cat(__VA_ARGS__)); \
  } while (0)
#define QK_CHECK_VALUE(cond, ...)                                                   \
  do {                                                                              \
    if (!(cond)) throw std::invalid_argument(::qkernels::detail::cat(__VA_ARGS__)); \
  } while (0)

// Element types as the checks see them (the kernels take float32 / float64 data and int64 or int32 indices).
enum class DType { Float32, Float64, Float16, BFloat16, Int32, Int64, Bool, Other };

inline std::ostream& operator<<(std::ostream& out, DType t) {
  switch (t) {
    case DType::Float32: return out << "float32";
    case DType::Float64: return out << "float64";
    case DType::Float16: return out << "float16";
    case DType::BFloat16: return out << "bfloat16";
    case DType::Int32: return out << "int32";
    case DType::Int64: return out << "int64";
    case DType::Bool: return out << "bool";
    default: return out << "another dtype";
  }
}

// f(scalar_t{}) for a float32 or float64 dtype (the kernels' dtypes; the checks reject others first):
//   dispatch_floating(dtype, [&](auto zero) { using scalar_t = decltype(zero); ... });
template <typename F>
decltype(auto) dispatch_floating(DType type, F&& f) {
  if (type == DType::Float32) return f(float{});
  QK_CHECK(type == DType::Float64, "qkernels: dtype ", type, " is not float32 or float64");
  return f(double{});
}

// A device as messages print it: cpu, cuda:0, meta.
struct DeviceName {
  enum Kind : int32_t { Cpu, Cuda, Meta, Other } kind;
  int32_t type, index;  // the front-end's own device type code (compared, printed for Other) and index (-1: none)
};
inline bool operator==(const DeviceName& a, const DeviceName& b) { return a.type == b.type && a.index == b.index; }
inline std::ostream& operator<<(std::ostream& out, const DeviceName& d) {
  if (d.kind == DeviceName::Cpu) out << "cpu";
  else if (d.kind == DeviceName::Cuda) out << "cuda";
  else if (d.kind == DeviceName::Meta) out << "meta";
  else out << "device type " << d.type;
  if (d.index >= 0) out << ':' << d.index;
  return out;
}

// Sizes as messages print them: [5, 3].
struct Shape {
  int64_t sizes[8];
  int64_t ndim;
};
template <typename X>
Shape shape(const X& t) {
  Shape s{{}, t.dim()};
  for (int64_t i = 0; i < s.ndim && i < 8; ++i) s.sizes[i] = t.size(i);
  return s;
}
inline std::ostream& operator<<(std::ostream& out, const Shape& s) {
  out << '[';
  for (int64_t i = 0; i < s.ndim && i < 8; ++i) out << (i ? ", " : "") << s.sizes[i];
  return out << (s.ndim > 8 ? ", ...]" : "]");
}

// Whether a and b have the same sizes.
template <typename X, typename Y>
bool same_shape(const X& a, const Y& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.dim(); ++i)
    if (a.size(i) != b.size(i)) return false;
  return true;
}

}  // namespace qkernels
