// CUDA kernels of the quantization hot path; the math is csrc/include/qkernels/quantize.h,
// shared with the CPU kernels. No torch headers: compile-checked with plain nvcc in the tests.
#include "block_reduce.cuh"
#include "quantize.cuh"
#include "qkernels/quantize.h"

namespace qkernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Codebook gradients: elements per chunk of a codebook group, and at most this many chunks. Partial sums
// over fixed chunks, added in chunk order, give results independent of the launch (deterministic, no
// atomics) while the (slots x chunks) grid fills the GPU.
constexpr int64_t kChunk = 4096, kMaxChunks = 64;

inline int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }
inline int64_t chunks_for(int64_t per_group) {
  const int64_t c = (per_group + kChunk - 1) / kChunk;
  return c < 1 ? 1 : (c > kMaxChunks ? kMaxChunks : c);
}

// One block: out0 = out1 = scale * sum of the n values in[] (fixed order).
template <typename T>
__global__ void sum_scaled_kernel(const T* __restrict__ in, int64_t n, double scale, T* out0, T* out1) {
  using A = typename acc_type<T>::type;
  __shared__ A shared[kThreads];
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += A(in[i]);
  const A total = block_sum<kThreads>(s, shared);
  if (threadIdx.x == 0) {
    const T v = T(total * A(scale));
    *out0 = v;
    *out1 = v;
  }
}

// Codebook gradients as grouped sums: slot s = g * K + k of a (G, K) codebook collects f(p, g, k) over the
// positions p of group g's elements (p = t for G = 1, p = t * d + g for G = d; t < per_group). Block
// (s, c) sums chunk c of them into partial[s * C + c].
template <typename T, typename F>
__global__ void codebook_partials_kernel(F f, int64_t d, int64_t G, int64_t K, int64_t per_group, int64_t C,
                                         T* __restrict__ partial) {
  using A = typename acc_type<T>::type;
  __shared__ A shared[kThreads];
  const int64_t s = blockIdx.x, c = blockIdx.y, g = s / K, k = s % K;
  const int64_t len = (per_group + C - 1) / C, t0 = c * len, t1 = t0 + len < per_group ? t0 + len : per_group;
  A acc = 0;
  for (int64_t t = t0 + threadIdx.x; t < t1; t += kThreads) acc += f(G == 1 ? t : t * d + g, g, k);
  const A total = block_sum<kThreads>(acc, shared);
  if (threadIdx.x == 0) partial[s * C + c] = T(total);
}

// out[s] = scale (times *dev_scale when given) * sum over c of partial[s * C + c], in chunk order.
template <typename T>
__global__ void codebook_finish_kernel(const T* __restrict__ partial, int64_t slots, int64_t C, const T* dev_scale,
                                       T scale, T* __restrict__ out) {
  using A = typename acc_type<T>::type;
  const int64_t s = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  if (s >= slots) return;
  A acc = 0;
  for (int64_t c = 0; c < C; ++c) acc += A(partial[s * C + c]);
  out[s] = T(acc) * (dev_scale != nullptr ? *dev_scale * scale : scale);
}

// latent_quantize: z - q over the entries that chose value k (an invalid index chooses none).
template <typename T>
struct ChosenResidual {
  const T* z;
  const T* values;
  const int64_t* idx;
  int64_t nv;
  __device__ typename acc_type<T>::type operator()(int64_t p, int64_t g, int64_t k) const {
    using A = typename acc_type<T>::type;
    return idx[p] == k ? A(z[p]) - A(values[g * nv + k]) : A(0);
  }
};

// relaxed_categorical: grad_z * y of row r, category k.
template <typename T>
struct WeightedSample {
  const T* grad_z;
  const T* y;
  int64_t K;
  __device__ typename acc_type<T>::type operator()(int64_t r, int64_t, int64_t k) const {
    using A = typename acc_type<T>::type;
    return A(grad_z[r]) * A(y[r * K + k]);
  }
};

// Launches the two codebook kernels for f over N rows of d latents into out (G, K).
template <typename T, typename F>
cudaError_t codebook_grad(F f, int64_t N, int64_t d, int64_t G, int64_t K, const T* dev_scale, T scale,
                          T* workspace, T* out, cudaStream_t stream) {
  const int64_t per_group = G == 1 ? N * d : N, C = chunks_for(per_group);
  codebook_partials_kernel<T><<<dim3(unsigned(G * K), unsigned(C)), kThreads, 0, stream>>>(f, d, G, K, per_group, C,
                                                                                       workspace);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  codebook_finish_kernel<T><<<blocks_for(G * K), kThreads, 0, stream>>>(workspace, G * K, C, dev_scale, scale, out);
  return cudaGetLastError();
}

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
__global__ void latent_quantize_bwd_kernel(const T* __restrict__ grad_zq, const T* grad_commit,
                                           const T* __restrict__ z,
                                           const T* __restrict__ values,
                                           const int64_t* __restrict__ idx, T* __restrict__ grad_z,
                                           int64_t total, int64_t d, int64_t G, int64_t nv, T scale) {
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
int64_t codebook_workspace(int64_t N, int64_t d, int64_t G, int64_t K) {
  return G * K * chunks_for(G == 1 ? N * d : N);
}

template <typename T>
cudaError_t latent_quantize_fwd(const T* z, const T* values, T* zq, int64_t* idx, T* sq_partial, T* loss,
                                T* loss_commit, int64_t N, int64_t d, int64_t G, int64_t nv, cudaStream_t stream) {
  const int64_t total = N * d, blocks = blocks_for(total);
  latent_quantize_fwd_kernel<T><<<blocks, kThreads, 0, stream>>>(z, values, zq, idx, sq_partial, total, d, G, nv);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  sum_scaled_kernel<T><<<1, kThreads, 0, stream>>>(sq_partial, blocks, 1.0 / static_cast<double>(total), loss,
                                                   loss_commit);
  return cudaGetLastError();
}

template <typename T>
cudaError_t latent_quantize_bwd(const T* grad_zq, const T* grad_quantize, const T* grad_commit,
                                const T* z, const T* values, const int64_t* idx, T* grad_z,
                                T* grad_values, T* workspace, int64_t N, int64_t d, int64_t G, int64_t nv,
                                cudaStream_t stream) {
  const int64_t total = N * d;
  const T scale = T(2.0 / static_cast<double>(total));
  latent_quantize_bwd_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(
      grad_zq, grad_commit, z, values, idx, grad_z, total, d, G, nv, scale);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // grad_values = -grad_quantize * 2/(N d) * sum (z - q) over the entries that chose each value
  return codebook_grad<T>(ChosenResidual<T>{z, values, idx, nv}, N, d, G, nv, grad_quantize, T(-scale), workspace,
                          grad_values, stream);
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
                                    const T* logits, const T* uniform, const T* values, const T* y,
                                    T* grad_logits, T* grad_values, T* workspace, int64_t rows, int64_t d,
                                    int64_t G, int64_t K, T tau, T noise_scale, cudaStream_t stream) {
  relaxed_categorical_bwd_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(
      grad_z, grad_y, grad_kl, logits, uniform, values, grad_logits, rows, d, G, K, tau, noise_scale);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // grad_values (G, K) = sum over each group's rows of grad_z * y
  return codebook_grad<T>(WeightedSample<T>{grad_z, y, K}, rows / d, d, G, K, nullptr, T(1), workspace,
                          grad_values, stream);
}

#define QK_INSTANTIATE(T)                                                                         \
  template cudaError_t latent_quantize_fwd<T>(const T*, const T*, T*, int64_t*, T*, T*, T*,      \
                                              int64_t, int64_t, int64_t, int64_t, cudaStream_t);  \
  template cudaError_t latent_quantize_bwd<T>(const T*, const T*, const T*, const T*, const T*,   \
                                              const int64_t*, T*, T*, T*, int64_t, int64_t,       \
                                              int64_t, int64_t, cudaStream_t);                    \
  template cudaError_t relaxed_categorical_fwd<T>(const T*, const T*, const T*, T*, T*, T*,       \
                                                  int64_t, int64_t, int64_t, int64_t, T, T, bool, \
                                                  cudaStream_t);                                  \
  template cudaError_t relaxed_categorical_bwd<T>(const T*, const T*, const T*, const T*,         \
                                                  const T*, const T*, const T*, T*, T*, T*,       \
                                                  int64_t, int64_t, int64_t, int64_t, T, T,       \
                                                  cudaStream_t);
QK_INSTANTIATE(float)
QK_INSTANTIATE(double)
#undef QK_INSTANTIATE

}  // namespace cuda
}  // namespace qkernels
