// What every XLA FFI handler of the JAX front-end shares: a view of an FFI buffer as the framework-free checks
// and kernels see it (qkernels/check_core.h), XLA's intra-op thread pool as qkernels::parallel_for's executor,
// and errors as FFI errors. Headers: jax.ffi.include_dir() (setup.py). No torch here.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkernels/checks.h"
#include "qkernels/parallel.h"
#include "xla/ffi/api/ffi.h"

namespace qkernels {
namespace jaxffi {

namespace ffi = xla::ffi;

// A dense row-major buffer (XLA's default layout, which jax.ffi.ffi_call asks for) in host memory, or on a GPU for
// the CUDA handlers (csrc/jax/cuda/common.h): the checks read its shape there, never its values.
struct Buffer {
  DType dtype;
  const int64_t* dims;
  int64_t rank;
  void* data;
  DeviceName device = {DeviceName::Cpu, 0, -1};

  int64_t dim() const { return rank; }
  int64_t size(int64_t i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  template <typename T>
  const T* const_data_ptr() const { return static_cast<const T*>(data); }
  template <typename T>
  T* mutable_data_ptr() const { return static_cast<T*>(data); }
};

inline DType to_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::Float32;
    case ffi::DataType::F64: return DType::Float64;
    case ffi::DataType::F16: return DType::Float16;
    case ffi::DataType::BF16: return DType::BFloat16;
    case ffi::DataType::S32: return DType::Int32;
    case ffi::DataType::S64: return DType::Int64;
    case ffi::DataType::PRED: return DType::Bool;
    default: return DType::Other;
  }
}

inline Buffer view(const ffi::AnyBuffer& b) {
  const auto dims = b.dimensions();
  return {to_dtype(b.element_type()), dims.begin(), static_cast<int64_t>(dims.size()), b.untyped_data(),
          {DeviceName::Cpu, 0, -1}};
}
inline Buffer view(ffi::Result<ffi::AnyBuffer>& b) { return view(*b); }
inline std::optional<Buffer> view(const std::optional<ffi::AnyBuffer>& b) {
  return b.has_value() ? std::optional<Buffer>(view(*b)) : std::nullopt;
}

// What the checks ask of a tensor (qkernels/check_core.h): its device, contiguous.
inline DType dtype_of(const Buffer& b) { return b.dtype; }
inline DeviceName device_of(const Buffer& b) { return b.device; }
inline Buffer as_contiguous(const Buffer& b) { return b; }

// The value of a one-element float32 / float64 buffer.
inline double scalar(const Buffer& b) {
  return b.dtype == DType::Float32 ? double(*b.const_data_ptr<float>()) : *b.const_data_ptr<double>();
}

// f(index_t{}) for an int32 or int64 index buffer.
template <typename F>
void dispatch_index(DType type, F&& f) {
  if (type == DType::Int32) return f(int32_t{});
  QK_CHECK(type == DType::Int64, "qkernels: index dtype ", type, " is not int32 or int64");
  f(int64_t{});
}

// XLA's intra-op pool as the executor of qkernels::parallel_for.
class PoolExecutor final : public Executor {
 public:
  explicit PoolExecutor(ffi::ThreadPool& pool) : pool_(pool) {}
  int64_t num_threads() const override { return pool_.num_threads(); }
  void schedule(std::function<void()> task) override { pool_.Schedule(std::move(task)); }

 private:
  ffi::ThreadPool& pool_;
};

// Runs body() with the pool installed; a failed check becomes an FFI error carrying its message (XLA raises it
// in Python as a run-time error): std::invalid_argument (a value check: QK_CHECK_VALUE) as INVALID_ARGUMENT,
// others (QK_CHECK, allocation) as INTERNAL. Exceptions never cross the C boundary.
template <typename F>
ffi::Error run(ffi::ThreadPool pool, F&& body) {
  try {
    PoolExecutor executor(pool);
    ExecutorScope scope(&executor);
    body();
    return ffi::Error::Success();
  } catch (const std::invalid_argument& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

// The library's registration table: every handler with the platform it runs on ("cpu"; "CUDA" in a build with
// CUDA) and whether it runs an op (named as the op, qkernels/decl) or is a helper of the front-end (the run-time
// value check, checks_ffi.cpp), added beside its definition by QK_FFI_TARGET / QK_FFI_HELPER. qkernels/jax/_ffi.py
// reads it through qk_ffi_targets (targets.cpp) and registers each entry with jax.ffi.register_ffi_target as
// qkernels_<name> for its platform.
struct Target {
  const char* name;
  XLA_FFI_Handler* handler;
  const char* platform;
  bool op;
};

inline std::vector<Target>& targets() {
  static std::vector<Target> table;
  return table;
}

struct AddTarget {
  AddTarget(const char* name, XLA_FFI_Handler* handler, const char* platform, bool op) {
    targets().push_back({name, handler, platform, op});
  }
};

}  // namespace jaxffi
}  // namespace qkernels

// Defines the XLA FFI handler `handler` of `impl` with `binding` and adds it to the table as the op `name` on the CPU
// (QK_FFI_CUDA_TARGET: on a GPU, csrc/jax/cuda/).
#define QK_FFI_TARGET(name, handler, impl, binding) \
  XLA_FFI_DEFINE_HANDLER(handler, impl, binding);   \
  static const ::qkernels::jaxffi::AddTarget handler##_target(name, handler, "cpu", true)
#define QK_FFI_CUDA_TARGET(name, handler, impl, binding) \
  XLA_FFI_DEFINE_HANDLER(handler, impl, binding);        \
  static const ::qkernels::jaxffi::AddTarget handler##_target(name, handler, "CUDA", true)
// The same for a helper target `name` (not an op) on `platform`.
#define QK_FFI_HELPER(name, platform, handler, impl, binding) \
  XLA_FFI_DEFINE_HANDLER(handler, impl, binding);             \
  static const ::qkernels::jaxffi::AddTarget handler##_target(name, handler, platform, false)
