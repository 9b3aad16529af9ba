// Host/device portability macros shared by the CPU (csrc/cpu) and CUDA (csrc/cuda) kernels.
#pragma once

#ifdef __CUDACC__
#define QK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QK_HOST_DEVICE inline
#endif

#include <math.h>

namespace qkernels {

// Accumulation type: fp32 inputs accumulate in fp32, fp64 inputs stay fp64.
template <typename T> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };

QK_HOST_DEVICE float qk_exp(float x) { return expf(x); }
QK_HOST_DEVICE double qk_exp(double x) { return exp(x); }
QK_HOST_DEVICE float qk_log(float x) { return logf(x); }
QK_HOST_DEVICE double qk_log(double x) { return log(x); }
QK_HOST_DEVICE float qk_abs(float x) { return fabsf(x); }
QK_HOST_DEVICE double qk_abs(double x) { return fabs(x); }

// Quiet NaN of T: what a CUDA kernel writes for an out-of-range index (checking index ranges on
// the host would synchronize it with the device; a kernel never reads out of bounds instead).
template <typename T> QK_HOST_DEVICE T qk_nan();
template <> QK_HOST_DEVICE float qk_nan<float>() { return nanf(""); }
template <> QK_HOST_DEVICE double qk_nan<double>() { return nan(""); }

}  // namespace qkernels
