// Keeps qkernels' shared libraries loadable on glibc 2.28 (the manylinux_2_28 wheel tag: auditwheel checks it)
// when they are compiled on a newer glibc. setup.py force-includes this header (-include) into every C++ file
// on x86_64 Linux; it changes which glibc symbols the objects reference, not what the code computes.
//  - exp, log, pow got new symbol versions in glibc 2.29 (the same implementation; the old versions add
//    errno/SVID error handling around it): the references are bound to the GLIBC_2.2.5 versions.
//  - libstdc++ of GCC >= 11 reads glibc 2.32's __libc_single_threaded (shared_ptr reference counts skip
//    atomics in single-threaded processes): a hidden, weak definition fixed at 0 ("may be threaded": atomic
//    counts, as in any process running torch's thread pools) satisfies it inside the library.
#pragma once

#if defined(__linux__) && defined(__x86_64__) && !defined(__CUDA_ARCH__)
__asm__(".symver exp,exp@GLIBC_2.2.5");
__asm__(".symver log,log@GLIBC_2.2.5");
__asm__(".symver pow,pow@GLIBC_2.2.5");

#ifdef __cplusplus
extern "C" {
#endif
__attribute__((weak, visibility("hidden"))) char __libc_single_threaded = 0;
#ifdef __cplusplus
}
#endif
#endif
