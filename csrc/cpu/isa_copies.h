// The two copies of a kernel file (csrc/cpu/isa.h): define QK_KERNELS_FILE as its quoted name, then
// include this inside namespace qkernels; QK_ISA_CALL picks the copy at run time. Not guarded: once
// per kernel file.
#ifndef QK_KERNELS_FILE
#error "define QK_KERNELS_FILE (the kernel file's quoted name) before including isa_copies.h"
#endif
// 32-byte vector types in the baseline copy are emulated with SSE pairs: no ABI concern here (all
// of it is internal to the library).
#pragma GCC diagnostic ignored "-Wpsabi"
namespace isa_base {
#include QK_KERNELS_FILE
}  // namespace isa_base
#if QK_AVX_COPY
#pragma GCC push_options
#pragma GCC target("avx,fma")
namespace isa_avx {
#include QK_KERNELS_FILE
}  // namespace isa_avx
#pragma GCC pop_options
#endif
#undef QK_KERNELS_FILE
