// CUDA kernels of the Hessian hot path; the math is csrc/include/qkernels/hessian.h, shared with
// the CPU kernels. No torch headers: compile-checked with plain nvcc in the tests.
//
// Forward: one thread per activation column of one (sample, group); consecutive threads read
// consecutive columns of each of the 2k perturbed rows (coalesced). A block reduces its columns to
// a partial sum and a partial (max, first argmax); a second kernel combines the partials of each
// (group, sample) in block order (deterministic, no atomics).
#include "hessian.cuh"
#include "qkernels/hessian.h"

namespace qkernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void fd_curvature_fwd_kernel(const T* __restrict__ x, T* __restrict__ part_sum,
                                        T* __restrict__ part_max, int64_t* __restrict__ part_arg,
                                        int64_t n, int64_t M, int64_t k, int64_t col_blocks,
                                        typename acc_type<T>::type inv_eps2, bool unbiased) {
  using A = typename acc_type<T>::type;
  __shared__ A s_sum[kThreads];
  __shared__ A s_max[kThreads];
  __shared__ int64_t s_arg[kThreads];
  const int64_t i = blockIdx.x / col_blocks, cb = blockIdx.x % col_blocks, g = blockIdx.y;
  const int64_t c = cb * kThreads + threadIdx.x, stride = n * M;
  A v = 0;
  int64_t arg = -1;
  if (c < M) {
    v = fd_column_var<T, A>(x + (g * 2 * k) * stride + i * M + c, stride, k, inv_eps2, unbiased);
    arg = c;
  }
  s_sum[threadIdx.x] = v;
  s_max[threadIdx.x] = v;
  s_arg[threadIdx.x] = arg;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + s];
      const int64_t other = s_arg[threadIdx.x + s];
      if (other >= 0) max_update(s_max[threadIdx.x + s], other, &s_max[threadIdx.x], &s_arg[threadIdx.x]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int64_t slot = (g * n + i) * col_blocks + cb;
    part_sum[slot] = T(s_sum[0]);
    part_max[slot] = T(s_max[0]);
    part_arg[slot] = s_arg[0];
  }
}

template <typename T>
__global__ void fd_curvature_finalize_kernel(const T* part_sum, const T* part_max, const int64_t* part_arg,
                                             T* values, int64_t* argmax, int64_t rows, int64_t M,
                                             int64_t col_blocks, bool use_max) {
  using A = typename acc_type<T>::type;
  const int64_t r = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  if (r >= rows) return;
  A sum = 0, best = 0;
  int64_t best_c = -1;
  for (int64_t b = 0; b < col_blocks; ++b) {
    sum += A(part_sum[r * col_blocks + b]);
    max_update(A(part_max[r * col_blocks + b]), part_arg[r * col_blocks + b], &best, &best_c);
  }
  values[r] = T(use_max ? best : sum / A(M));
  argmax[r] = best_c;
}

template <typename T>
__global__ void fd_curvature_bwd_kernel(const T* __restrict__ grad, const T* __restrict__ x,
                                        const int64_t* __restrict__ argmax, T* __restrict__ grad_x,
                                        int64_t n, int64_t M, int64_t k, int64_t col_blocks,
                                        typename acc_type<T>::type inv_eps2, bool unbiased, bool use_max) {
  using A = typename acc_type<T>::type;
  const int64_t i = blockIdx.x / col_blocks, cb = blockIdx.x % col_blocks, g = blockIdx.y;
  const int64_t c = cb * kThreads + threadIdx.x, stride = n * M;
  if (c >= M) return;
  const int64_t off = (g * 2 * k) * stride + i * M + c;
  if (use_max && c != argmax[g * n + i]) {
    for (int64_t r = 0; r < 2 * k; ++r) grad_x[off + r * stride] = T(0);
    return;
  }
  const A gout = A(grad[g * n + i]);
  const A coef = use_max ? gout : gout / A(M);
  fd_column_backward<T, A>(x + off, stride, k, inv_eps2, unbiased, coef, grad_x + off);
}

}  // namespace

int64_t fd_curvature_col_blocks(int64_t M) { return (M + kThreads - 1) / kThreads; }

template <typename T>
cudaError_t fd_curvature_fwd(const T* x, T* part_sum, T* part_max, int64_t* part_arg, T* values,
                             int64_t* argmax, int64_t n, int64_t M, int64_t k, int64_t groups,
                             int64_t offset_rows, double eps, bool unbiased, bool use_max,
                             cudaStream_t stream) {
  using A = typename acc_type<T>::type;
  const int64_t cbs = fd_curvature_col_blocks(M);
  const dim3 grid(static_cast<unsigned>(n * cbs), static_cast<unsigned>(groups));
  fd_curvature_fwd_kernel<T><<<grid, kThreads, 0, stream>>>(x + offset_rows * M, part_sum, part_max,
                                                            part_arg, n, M, k, cbs, A(1.0 / (eps * eps)),
                                                            unbiased);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t rows = groups * n;
  fd_curvature_finalize_kernel<T><<<(rows + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      part_sum, part_max, part_arg, values, argmax, rows, M, cbs, use_max);
  return cudaGetLastError();
}

template <typename T>
cudaError_t fd_curvature_bwd(const T* grad, const T* x, const int64_t* argmax, T* grad_x, int64_t n,
                             int64_t M, int64_t k, int64_t groups, int64_t offset_rows, double eps,
                             bool unbiased, bool use_max, cudaStream_t stream) {
  using A = typename acc_type<T>::type;
  const int64_t cbs = fd_curvature_col_blocks(M);
  const dim3 grid(static_cast<unsigned>(n * cbs), static_cast<unsigned>(groups));
  fd_curvature_bwd_kernel<T><<<grid, kThreads, 0, stream>>>(grad, x + offset_rows * M, argmax,
                                                            grad_x + offset_rows * M, n, M, k, cbs,
                                                            A(1.0 / (eps * eps)), unbiased, use_max);
  return cudaGetLastError();
}

#define QK_INSTANTIATE(T)                                                                          \
  template cudaError_t fd_curvature_fwd<T>(const T*, T*, T*, int64_t*, T*, int64_t*, int64_t,      \
                                           int64_t, int64_t, int64_t, int64_t, double, bool, bool, \
                                           cudaStream_t);                                          \
  template cudaError_t fd_curvature_bwd<T>(const T*, const T*, const int64_t*, T*, int64_t,        \
                                           int64_t, int64_t, int64_t, int64_t, double, bool, bool, \
                                           cudaStream_t);
QK_INSTANTIATE(float)
QK_INSTANTIATE(double)
#undef QK_INSTANTIATE

}  // namespace cuda
}  // namespace qkernels
