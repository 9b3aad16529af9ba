// CUDA kernels of the quantization hot path; the math is csrc/include/qkernels/quantize.h,
// shared with the CPU kernels. No torch headers: compile-checked with plain nvcc in the tests.
#include "block_reduce.cuh"
#include "launch.cuh"
#include "quantize.cuh"
#include "qkernels/quantize.h"

namespace qkernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Codebook gradients by row chunks: each block reads its chunk of rows once and writes one partial row
// of the (G, K) gradient; codebook_finish_kernel adds the partial rows in order. Deterministic without atomics,
// and every index / sample read once (the previous kernels had one block per codebook slot, each scanning all of
// its group's indices: n_v reads of each). kCbThreads threads per block; kCbShared bytes of shared accumulators.
constexpr int kCbThreads = 128;
constexpr int64_t kCbShared = 32 * 1024;

inline int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows per chunk for a grid of `per_chunk` blocks per chunk: about 4 blocks per SM of the current device in all.
inline int64_t chunk_rows(int64_t N, int64_t per_chunk) {
  const int64_t want = ceil_div(4 * int64_t(device_sms()), per_chunk);
  return ceil_div(N, want < 1 ? 1 : (want > N ? N : want));
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

// out[s] = scale (times *dev_scale when given) * sum over p < P of partial[p * S + s], in row order.
template <typename T>
__global__ void codebook_finish_kernel(const T* __restrict__ partial, int64_t P, int64_t S, const T* dev_scale,
                                       T scale, T* __restrict__ out) {
  using A = typename acc_type<T>::type;
  const int64_t s = blockIdx.x * (int64_t)kThreads + threadIdx.x;
  if (s >= S) return;
  A acc = 0;
  for (int64_t p = 0; p < P; ++p) acc += A(partial[p * S + s]);
  out[s] = T(acc) * (dev_scale != nullptr ? *dev_scale * scale : scale);
}

// Tiles of latent_quantize's codebook kernel: jt latents x kt values of accumulators per block, row chunks.
struct ChosenTiles {
  int64_t kt, jt, tiles_j, tiles_k, rows, chunks;
};

inline ChosenTiles chosen_tiles(int64_t N, int64_t d, int64_t K, int64_t acc_bytes) {
  ChosenTiles t{};
  t.kt = K < kCbShared / acc_bytes ? K : kCbShared / acc_bytes;
  const int64_t jt = kCbShared / (t.kt * acc_bytes), cap = d < kCbThreads ? d : kCbThreads;
  t.jt = jt < cap ? jt : cap;
  t.tiles_j = ceil_div(d, t.jt);
  t.tiles_k = ceil_div(K, t.kt);
  t.rows = chunk_rows(N, t.tiles_j * t.tiles_k);
  t.chunks = ceil_div(N, t.rows);
  return t;
}

// latent_quantize's codebook gradient: partial sums of z - q over the entries that chose each value. Block
// (c, tj, tk) reads rows [c rows, (c + 1) rows) of latents [tj jt, (tj + 1) jt) once; thread j owns latent
// tj jt + j and adds each of its entries to acc[j][k] in shared memory in row order (values k in [tk kt,
// (tk + 1) kt): more than one k tile only for codebooks beyond kCbShared). Writes, per-latent codebooks (G = d),
// partial[c][latent][k] (P = chunks rows of S = d K); a global one (G = 1), partial[c tiles_j + tj][k], its
// latents added in order (P = chunks tiles_j rows of S = K). An invalid index chooses no value.
template <typename T>
__global__ void chosen_partials_kernel(const T* __restrict__ z, const T* __restrict__ values,
                                       const int64_t* __restrict__ idx, int64_t N, int64_t d, int64_t G,
                                       int64_t K, ChosenTiles t, T* __restrict__ partial) {
  using A = typename acc_type<T>::type;
  extern __shared__ __align__(16) unsigned char smem[];
  A* acc = reinterpret_cast<A*>(smem);  // (jt, kt)
  const int64_t c = blockIdx.x, tj = blockIdx.y, k0 = blockIdx.z * t.kt;
  const int64_t j0 = tj * t.jt, kt = K - k0 < t.kt ? K - k0 : t.kt, jt = d - j0 < t.jt ? d - j0 : t.jt;
  for (int64_t e = threadIdx.x; e < jt * t.kt; e += blockDim.x) acc[e] = A(0);
  __syncthreads();
  const int64_t r0 = c * t.rows, r1 = r0 + t.rows < N ? r0 + t.rows : N;
  if (threadIdx.x < jt) {
    const int64_t j = j0 + threadIdx.x;
    const T* vrow = values + (G == 1 ? 0 : j) * K;
    A* mine = acc + threadIdx.x * t.kt;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t k = idx[r * d + j] - k0;  // neighbouring threads read neighbouring latents of a row
      if (k >= 0 && k < kt) mine[k] += A(z[r * d + j]) - A(vrow[k0 + k]);
    }
  }
  __syncthreads();
  if (G == 1) {
    for (int64_t k = threadIdx.x; k < kt; k += blockDim.x) {
      A s = 0;
      for (int64_t j = 0; j < jt; ++j) s += acc[j * t.kt + k];
      partial[(c * t.tiles_j + tj) * K + k0 + k] = T(s);
    }
  } else {
    for (int64_t e = threadIdx.x; e < jt * kt; e += blockDim.x) {
      const int64_t j = e / kt, k = e % kt;
      partial[(c * d + j0 + j) * K + k0 + k] = T(acc[j * t.kt + k]);
    }
  }
}

// relaxed_categorical's codebook gradient: partial sums of grad_z * y. Block (c, i) reads samples [c rows,
// (c + 1) rows); thread s owns slots s = j K + k of a sample's (d, K) rows (neighbouring threads read
// neighbouring entries of y) and adds its samples in order. Writes partial[c][j][k]: per-latent codebooks
// P = chunks rows of S = d K; a global one P = chunks d rows of S = K (the finish adds the latents, in order).
template <typename T>
__global__ void weighted_partials_kernel(const T* __restrict__ grad_z, const T* __restrict__ y, int64_t N,
                                         int64_t d, int64_t K, int64_t rows, T* __restrict__ partial) {
  using A = typename acc_type<T>::type;
  const int64_t c = blockIdx.x, dk = d * K;
  const int64_t r0 = c * rows, r1 = r0 + rows < N ? r0 + rows : N;
  for (int64_t s = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; s < dk; s += int64_t(gridDim.y) * blockDim.x) {
    const int64_t j = s / K;
    A acc = 0;
    for (int64_t r = r0; r < r1; ++r) acc += A(grad_z[r * d + j]) * A(y[r * dk + s]);
    partial[c * dk + s] = T(acc);
  }
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
int64_t latent_quantize_workspace(int64_t N, int64_t d, int64_t G, int64_t nv, bool is_double) {
  const ChosenTiles t = chosen_tiles(N, d, nv, is_double ? sizeof(double) : sizeof(float));
  return (G == 1 ? t.chunks * t.tiles_j : t.chunks * d) * nv;
}

// relaxed_categorical's codebook kernel: grid (chunks, slot blocks), chunks of `rows` samples.
static dim3 weighted_grid(int64_t N, int64_t d, int64_t K, int64_t* rows) {
  const int64_t slot_blocks = ceil_div(d * K, kCbThreads);
  *rows = chunk_rows(N, slot_blocks);
  return dim3(unsigned(ceil_div(N, *rows)), unsigned(slot_blocks));
}

int64_t categorical_workspace(int64_t N, int64_t d, int64_t K) {
  int64_t rows = 0;
  return int64_t(weighted_grid(N, d, K, &rows).x) * d * K;
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
  using A = typename acc_type<T>::type;
  const ChosenTiles t = chosen_tiles(N, d, nv, sizeof(A));
  chosen_partials_kernel<T><<<dim3(unsigned(t.chunks), unsigned(t.tiles_j), unsigned(t.tiles_k)), kCbThreads,
                              size_t(t.jt * t.kt) * sizeof(A), stream>>>(z, values, idx, N, d, G, nv, t, workspace);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t P = G == 1 ? t.chunks * t.tiles_j : t.chunks, S = G * nv;
  codebook_finish_kernel<T><<<blocks_for(S), kThreads, 0, stream>>>(workspace, P, S, grad_quantize, T(-scale),
                                                                  grad_values);
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
                                    const T* logits, const T* uniform, const T* values, const T* y,
                                    T* grad_logits, T* grad_values, T* workspace, int64_t rows, int64_t d,
                                    int64_t G, int64_t K, T tau, T noise_scale, cudaStream_t stream) {
  relaxed_categorical_bwd_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(
      grad_z, grad_y, grad_kl, logits, uniform, values, grad_logits, rows, d, G, K, tau, noise_scale);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // grad_values (G, K) = sum over each group's rows of grad_z * y
  int64_t chunk = 0;
  const int64_t N = rows / d;
  const dim3 grid = weighted_grid(N, d, K, &chunk);
  weighted_partials_kernel<T><<<grid, kCbThreads, 0, stream>>>(grad_z, y, N, d, K, chunk, workspace);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t P = G == 1 ? int64_t(grid.x) * d : int64_t(grid.x), S = G * K;
  codebook_finish_kernel<T><<<blocks_for(S), kThreads, 0, stream>>>(workspace, P, S, nullptr, T(1), grad_values);
  return cudaGetLastError();
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
