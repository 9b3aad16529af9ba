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

}  // namespace qkernels
