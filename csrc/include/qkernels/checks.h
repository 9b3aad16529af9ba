// Argument checks shared by every op's CPU kernels and CUDA glue (the *_checks.h headers build on
// these). Uses torch's stable ABI (qkernels/stable.h): never include from a .cu kernel file.
#pragma once

#include "qkernels/stable.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace qkernels {

// t on ref's device with ref's dtype (a CUDA kernel must never be handed a host pointer).
inline void check_like(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name, const char* op) {
  QK_CHECK(device_of(t) == device_of(ref), op, ": ", name, " is on ", device_of(t), " but ", ref_name, " is on ",
           device_of(ref));
  QK_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(), " but ", ref_name,
           " has dtype ", ref.scalar_type());
}

// A floating-point tensor (float32 or float64: the kernels' dtypes).
inline void check_floating(const Tensor& t, const char* name, const char* op) {
  QK_CHECK(t.scalar_type() == ScalarType::Float || t.scalar_type() == ScalarType::Double, op, ": ", name,
           " must be float32 or float64, got ", t.scalar_type());
}

// An int64 index tensor on ref's device.
inline void check_index(const Tensor& idx, const char* name, const Tensor& ref, const char* op) {
  QK_CHECK(idx.scalar_type() == ScalarType::Long, op, ": ", name, " must be int64, got ", idx.scalar_type());
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

inline bool value_checked(const Tensor& t) { return is_cpu(t) && t.numel() > 0 && value_checks_enabled(); }

// Index values in [0, hi).
inline void check_index_range(const Tensor& idx, int64_t hi, const char* name, const char* op) {
  if (!value_checked(idx)) return;
  const Tensor c = as_contiguous(idx);
  const int64_t* p = c.const_data_ptr<int64_t>();
  const int64_t numel = c.numel();  // stable Tensor methods are calls into libtorch: hoisted out of loops
  int64_t lo_v = p[0], hi_v = p[0];
  for (int64_t i = 1; i < numel; ++i) {
    lo_v = std::min(lo_v, p[i]);
    hi_v = std::max(hi_v, p[i]);
  }
  QK_CHECK_VALUE(lo_v >= 0 && hi_v < hi, op, ": ", name, " must hold values in [0, ", hi, "), got values in [", lo_v,
                 ", ", hi_v, "]");
}

// No NaN or inf (positive: every value > 0) in a floating tensor.
inline void check_finite(const Tensor& t, const char* name, const char* op, bool positive = false) {
  if (!value_checked(t)) return;
  const Tensor c = as_contiguous(t);
  const int64_t numel = c.numel();
  bool finite = true, pos = true;
  dispatch_floating(c.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* p = c.const_data_ptr<scalar_t>();
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
inline void check_unit_interval(const Tensor& t, const char* name, const char* op) {
  if (!value_checked(t)) return;
  const Tensor c = as_contiguous(t);
  const int64_t numel = c.numel();
  bool ok = true;
  dispatch_floating(c.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* p = c.const_data_ptr<scalar_t>();
    int out = 0;  // (vectorized: see check_finite)
    for (int64_t i = 0; i < numel; ++i) out |= !(p[i] >= scalar_t(0)) | !(p[i] <= scalar_t(1));
    ok = out == 0;
  });
  QK_CHECK_VALUE(ok, op, ": ", name, " must hold values in [0, 1]");
}

// A one-element upstream gradient on ref's device.
inline void check_scalar_grad(const Tensor& g, const char* name, const Tensor& ref, const char* op) {
  QK_CHECK(g.numel() == 1, op, ": ", name, " must hold one element, got shape ", shape(g));
  QK_CHECK(device_of(g) == device_of(ref), op, ": ", name, " is on ", device_of(g), " but the data is on ",
           device_of(ref));
}

}  // namespace qkernels
