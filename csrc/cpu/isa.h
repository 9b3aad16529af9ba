// Run-time instruction-set dispatch of CPU kernels. A kernel file is included twice by its entry
// points' file: into namespace isa_base (compiled for baseline x86-64 / the target's default) and,
// with GCC on x86, into namespace isa_avx under `#pragma GCC target("avx,fma")`: 256-bit vectors
// and fused multiply-adds where the CPU has them, without building the whole extension for a CPU
// newer than the one it may run on. QKERNELS_CPU_ISA=baseline forces the baseline copy (tests).
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define QK_AVX_COPY 1
#else
#define QK_AVX_COPY 0
#endif

namespace qkernels {

// True when the AVX+FMA copy exists, the CPU supports it and QKERNELS_CPU_ISA != "baseline".
inline bool use_avx_copy() {
#if QK_AVX_COPY
  static const bool supported = __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma");
  const char* forced = std::getenv("QKERNELS_CPU_ISA");
  return supported && !(forced != nullptr && std::strcmp(forced, "baseline") == 0);
#else
  return false;
#endif
}

}  // namespace qkernels

// QK_ISA_CALL(kernel<T>)(args...): the copy of a kernel this CPU runs.
#if QK_AVX_COPY
#define QK_ISA_CALL(fn) (::qkernels::use_avx_copy() ? isa_avx::fn : isa_base::fn)
#else
#define QK_ISA_CALL(fn) isa_base::fn
#endif
