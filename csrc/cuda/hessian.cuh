// Launchers of the CUDA Hessian-path kernels (csrc/cuda/hessian.cu). Raw pointers, sizes and a
// stream only: no torch here, so the kernels compile with plain nvcc.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace qkernels {
namespace cuda {

// Column blocks per sample: the partial buffers hold groups * n * this many entries.
int64_t fd_curvature_col_blocks(int64_t M);

// x: stacked activations (offset_rows + n * 2k * groups, M); the first offset_rows (0 or n) rows
// are the center and are not read. Writes the partials (sum of variances, max, first argmax per
// (group, sample, column block)) and then values (groups, n) (mean or max over the M columns) and
// argmax (groups, n), combining the partials in a fixed order.
template <typename T>
cudaError_t fd_curvature_fwd(const T* x, T* part_sum, T* part_max, int64_t* part_arg, T* values,
                             int64_t* argmax, int64_t n, int64_t M, int64_t k, int64_t groups,
                             int64_t offset_rows, double eps, bool unbiased, bool use_max,
                             cudaStream_t stream);

// grad (groups, n), argmax (groups, n): writes grad_x for every perturbed row (the offset_rows
// center rows are left to the caller: their gradient is zero).
template <typename T>
cudaError_t fd_curvature_bwd(const T* grad, const T* x, const int64_t* argmax, T* grad_x, int64_t n,
                             int64_t M, int64_t k, int64_t groups, int64_t offset_rows, double eps,
                             bool unbiased, bool use_max, cudaStream_t stream);

}  // namespace cuda
}  // namespace qkernels
