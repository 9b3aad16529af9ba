// Argument checks shared by every op's CPU kernels, CUDA glue and XLA FFI handlers (the *_checks.h headers
// build on these). Framework-free: templates over the front-end's tensor type X (qkernels/check_core.h says
// what X provides); never include from a .cu kernel file.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "qkernels/check_core.h"

namespace qkernels {

// t on ref's device with ref's dtype (a CUDA kernel must never be handed a host pointer).
template <typename X>
void check_like(const X& t, const char* name, const X& ref, const char* ref_name, const char* op) {
  QK_CHECK(device_of(t) == device_of(ref), op, ": ", name, " is on ", device_of(t), " but ", ref_name, " is on ",
           device_of(ref));
  QK_CHECK(dtype_of(t) == dtype_of(ref), op, ": ", name, " has dtype ", dtype_of(t), " but ", ref_name,
           " has dtype ", dtype_of(ref));
}

// A floating-point tensor (float32 or float64: the kernels' dtypes).
template <typename X>
void check_floating(const X& t, const char* name, const char* op) {
  QK_CHECK(dtype_of(t) == DType::Float32 || dtype_of(t) == DType::Float64, op, ": ", name,
           " must be float32 or float64, got ", dtype_of(t));
}

// An index tensor on ref's device: int64 (int32 too where the front-end says so: JAX without x64).
template <typename X>
void check_index(const X& idx, const char* name, const X& ref, const char* op, bool int32_ok = false) {
  QK_CHECK(dtype_of(idx) == DType::Int64 || (int32_ok && dtype_of(idx) == DType::Int32), op, ": ", name,
           " must be int64", int32_ok ? " or int32" : "", ", got ", dtype_of(idx));
  QK_CHECK(device_of(idx) == device_of(ref), op, ": ", name, " is on ", device_of(idx), " but the data is on ",
           device_of(ref));
}

// Value checks (the CPU kernels' share of qkernels/_validation.py): input values are checked here, in
// C++ where the data is read, on CPU tensors only (reading GPU data would synchronize the host with
// the device; the CUDA kernels never read out of bounds and write NaN instead), unless
// QKERNELS_CHECK_FINITE=0 (read once). A failed check is a ValueError naming the argument.
inline bool value_checks_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("QKERNELS_CHECK_FINITE");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

template <typename X>
bool value_checked(const X& t) {
  return device_of(t).kind == DeviceName::Cpu && t.numel() > 0 && value_checks_enabled();
}

// Index values in [0, hi) (int64, or int32 where check_index allowed it).
template <typename X>
void check_index_range(const X& idx, int64_t hi, const char* name, const char* op) {
  if (!value_checked(idx)) return;
  const X c = as_contiguous(idx);
  const int64_t numel = c.numel();  // stable Tensor methods are calls into libtorch: hoisted out of loops
  int64_t lo_v = 0, hi_v = 0;
  auto scan = [&](const auto* p) {
    lo_v = hi_v = p[0];
    for (int64_t i = 1; i < numel; ++i) {
      lo_v = std::min<int64_t>(lo_v, p[i]);
      hi_v = std::max<int64_t>(hi_v, p[i]);
    }
  };
  if (dtype_of(c) == DType::Int32) scan(c.template const_data_ptr<int32_t>());
  else scan(c.template const_data_ptr<int64_t>());
  QK_CHECK_VALUE(lo_v >= 0 && hi_v < hi, op, ": ", name, " must hold values in [0, ", hi, "), got values in [", lo_v,
                 ", ", hi_v, "]");
}

// No NaN or inf (positive: every value > 0) in a floating tensor.
template <typename X>
void check_finite(const X& t, const char* name, const char* op, bool positive = false) {
  if (!value_checked(t)) return;
  const X c = as_contiguous(t);
  const int64_t numel = c.numel();
  bool finite = true, pos = true;
  dispatch_floating(dtype_of(c), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* p = c.template const_data_ptr<scalar_t>();
    // locals, not the captured flags: the loop stays in registers; or'ed comparisons (x - x is 0 for finite x,
    // NaN for inf and NaN), not isfinite and &&: the compiler vectorizes them (a check read each value in ~10
    // instructions, a third of the categorical kernel's time)
    int not_finite = 0, not_pos = 0;
    for (int64_t i = 0; i < numel; ++i) {
      not_finite |= !(p[i] - p[i] == scalar_t(0));
      not_pos |= !(p[i] > scalar_t(0));
    }
    finite = not_finite == 0;
    pos = not_pos == 0;
  });
  QK_CHECK_VALUE(finite, op, ": ", name, " contains NaN or inf");
  QK_CHECK_VALUE(!positive || pos, op, ": ", name, " must be > 0 everywhere");
}

// Every value in [0, 1].
template <typename X>
void check_unit_interval(const X& t, const char* name, const char* op) {
  if (!value_checked(t)) return;
  const X c = as_contiguous(t);
  const int64_t numel = c.numel();
  bool ok = true;
  dispatch_floating(dtype_of(c), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* p = c.template const_data_ptr<scalar_t>();
    int out = 0;  // (vectorized: see check_finite)
    for (int64_t i = 0; i < numel; ++i) out |= !(p[i] >= scalar_t(0)) | !(p[i] <= scalar_t(1));
    ok = out == 0;
  });
  QK_CHECK_VALUE(ok, op, ": ", name, " must hold values in [0, 1]");
}

// A one-element upstream gradient on ref's device.
template <typename X>
void check_scalar_grad(const X& g, const char* name, const X& ref, const char* op) {
  QK_CHECK(g.numel() == 1, op, ": ", name, " must hold one element, got shape ", shape(g));
  QK_CHECK(device_of(g) == device_of(ref), op, ": ", name, " is on ", device_of(g), " but the data is on ",
           device_of(ref));
}

}  // namespace qkernels
