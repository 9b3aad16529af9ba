// CUDA kernels of the quantization hot path; the math is csrc/include/qkernels/quantize.h,
// shared with the CPU kernels. No torch headers: compile-checked with plain nvcc in the tests.
#include "quantize.cuh"
#include "qkernels/quantize.h"

namespace qkernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

inline int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }

template <typename T>
__global__ void latent_quantize_fwd_kernel(const T* __restrict__ z, const T* __restrict__ values,
                                           T* __restrict__ zq, int64_t* __restrict__ idx,
                                           T* __restrict__ sq_partial, int64_t total, int64_t d,
                                           int64_t G, int64_t nv) {
  using A = typename acc_type<T>::type;
  __shared__ A shared[kThreads];
  const int64_t e = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  A sq = 0;
  if (e < total) {
    const int64_t j = e % d;
    const T* vrow = values + (G == 1 ? 0 : j) * nv;
    const int k = nearest_index(vrow, static_cast<int>(nv), z[e]);
    const T q = vrow[k];
    zq[e] = q;
    idx[e] = k;
    const A diff = A(z[e]) - A(q);
    sq = diff * diff;
  }
  shared[threadIdx.x] = sq;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) sq_partial[blockIdx.x] = T(shared[0]);
}

template <typename T>
__global__ void latent_quantize_bwd_kernel(const T* __restrict__ grad_zq, const T* grad_quantize,
                                           const T* grad_commit, const T* __restrict__ z,
                                           const T* __restrict__ values,
                                           const int64_t* __restrict__ idx, T* __restrict__ grad_z,
                                           T* grad_values, int64_t total, int64_t d, int64_t G,
                                           int64_t nv, T scale) {
  const int64_t e = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  if (e >= total) return;
  const int64_t g = G == 1 ? 0 : e % d, k = idx[e];
  if (k < 0 || k >= nv) {  // never read out of bounds: the index is invalid, its gradient NaN
    grad_z[e] = qk_nan<T>();
    return;
  }
  const T q = values[g * nv + k];
  const T diff = z[e] - q;
  grad_z[e] = grad_zq[e] + (*grad_commit) * scale * diff;
  if (grad_values != nullptr) atomicAdd(grad_values + g * nv + k, -(*grad_quantize) * scale * diff);
}

template <typename T>
__global__ void relaxed_categorical_fwd_kernel(const T* logits, const T* uniform, const T* values,
                                               T* z, T* y, T* kl, int64_t rows, int64_t d,
                                               int64_t G, int64_t K, T tau, T noise_scale, bool hard) {
  const int64_t r = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  if (r >= rows) return;
  const int64_t g = G == 1 ? 0 : r % d;
  z[r] = categorical_row_forward<T>(logits + r * K, uniform ? uniform + r * K : nullptr,
                                    values + g * K, static_cast<int>(K), tau, noise_scale, hard,
                                    y + r * K, kl + r);
}

template <typename T>
__global__ void relaxed_categorical_bwd_kernel(const T* grad_z, const T* grad_y, const T* grad_kl,
                                               const T* logits, const T* uniform, const T* values,
                                               T* grad_logits, int64_t rows, int64_t d, int64_t G,
                                               int64_t K, T tau, T noise_scale) {
  const int64_t r = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  if (r >= rows) return;
  const int64_t g = G == 1 ? 0 : r % d;
  categorical_row_backward<T>(logits + r * K, uniform ? uniform + r * K : nullptr, values + g * K,
                              static_cast<int>(K), tau, noise_scale, grad_z[r], grad_y + r * K,
                              grad_kl[r], grad_logits + r * K);
}

}  // namespace

int64_t latent_quantize_num_blocks(int64_t N, int64_t d) { return blocks_for(N * d); }

template <typename T>
cudaError_t latent_quantize_fwd(const T* z, const T* values, T* zq, int64_t* idx, T* sq_partial,
                                int64_t N, int64_t d, int64_t G, int64_t nv, cudaStream_t stream) {
  const int64_t total = N * d;
  latent_quantize_fwd_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(z, values, zq, idx,
                                                                           sq_partial, total, d, G, nv);
  return cudaGetLastError();
}

template <typename T>
cudaError_t latent_quantize_bwd(const T* grad_zq, const T* grad_quantize, const T* grad_commit,
                                const T* z, const T* values, const int64_t* idx, T* grad_z,
                                T* grad_values, int64_t N, int64_t d, int64_t G, int64_t nv,
                                cudaStream_t stream) {
  const int64_t total = N * d;
  const T scale = T(2.0 / static_cast<double>(total));
  latent_quantize_bwd_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(
      grad_zq, grad_quantize, grad_commit, z, values, idx, grad_z, grad_values, total, d, G, nv, scale);
  return cudaGetLastError();
}

template <typename T>
cudaError_t relaxed_categorical_fwd(const T* logits, const T* uniform, const T* values, T* z, T* y,
                                    T* kl, int64_t rows, int64_t d, int64_t G, int64_t K, T tau,
                                    T noise_scale, bool hard, cudaStream_t stream) {
  relaxed_categorical_fwd_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(
      logits, uniform, values, z, y, kl, rows, d, G, K, tau, noise_scale, hard);
  return cudaGetLastError();
}

template <typename T>
cudaError_t relaxed_categorical_bwd(const T* grad_z, const T* grad_y, const T* grad_kl,
                                    const T* logits, const T* uniform, const T* values,
                                    T* grad_logits, int64_t rows, int64_t d, int64_t G, int64_t K,
                                    T tau, T noise_scale, cudaStream_t stream) {
  relaxed_categorical_bwd_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(
      grad_z, grad_y, grad_kl, logits, uniform, values, grad_logits, rows, d, G, K, tau, noise_scale);
  return cudaGetLastError();
}

#define QK_INSTANTIATE(T)                                                                         \
  template cudaError_t latent_quantize_fwd<T>(const T*, const T*, T*, int64_t*, T*, int64_t,      \
                                              int64_t, int64_t, int64_t, cudaStream_t);           \
  template cudaError_t latent_quantize_bwd<T>(const T*, const T*, const T*, const T*, const T*,   \
                                              const int64_t*, T*, T*, int64_t, int64_t, int64_t,  \
                                              int64_t, cudaStream_t);                             \
  template cudaError_t relaxed_categorical_fwd<T>(const T*, const T*, const T*, T*, T*, T*,       \
                                                  int64_t, int64_t, int64_t, int64_t, T, T, bool, \
                                                  cudaStream_t);                                  \
  template cudaError_t relaxed_categorical_bwd<T>(const T*, const T*, const T*, const T*,         \
                                                  const T*, const T*, T*, int64_t, int64_t,       \
                                                  int64_t, int64_t, T, T, cudaStream_t);
QK_INSTANTIATE(float)
QK_INSTANTIATE(double)
#undef QK_INSTANTIATE

}  // namespace cuda
}  // namespace qkernels
