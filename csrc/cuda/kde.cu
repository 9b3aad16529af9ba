// CUDA kernels of the KDE hot path (KLM, kde_grid; Cliff runs on the triton backend). The math
// (windowing, exp, Silverman factor) is csrc/include/qkernels/kde.h, shared with csrc/cpu/kde.cpp. No torch headers: compile-checked with
// plain nvcc in the tests.
#include "block_reduce.cuh"
#include "kde.cuh"
#include "launch.cuh"
#include "qkernels/kde.h"

#include <math.h>

namespace qkernels {
namespace cuda {
namespace {

constexpr int kThreads = 128;  // rows b (KLM) or output elements (kde_grid) per block
constexpr int kTileA = 32;     // KLM: samples a per shared-memory tile (upper bound)
constexpr int kSharedBytes = 40 * 1024;  // < 48 KiB default: d up to ~2500 (fp64 backward)

inline int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }

// Samples per tile such that the tile's shared arrays (floats_per_a values per sample) fit.
template <typename T>
int tile_a(int64_t floats_per_a) {
  const int64_t t = kSharedBytes / (floats_per_a * int64_t(sizeof(T)));
  return int(t < 1 ? 1 : (t > kTileA ? kTileA : t));
}

// Loads y[a0 : a0 + ta, :] (and optionally exp(-lse[a, :])) into shared memory, all threads.
template <typename T>
__device__ void load_tile(const T* y, const T* lse, int64_t n, int64_t d, int64_t a0, int ta, T* ys, T* els) {
  const int64_t w = d + 1;
  for (int64_t e = threadIdx.x; e < int64_t(ta) * d; e += blockDim.x) {
    const int64_t a = a0 + e / d;
    ys[e] = a < n ? y[a * d + e % d] : T(0);
  }
  if (lse != nullptr)
    for (int64_t e = threadIdx.x; e < int64_t(ta) * w; e += blockDim.x) {
      const int64_t a = a0 + e / w;
      els[e] = a < n ? qk_exp(-lse[a * w + e % w]) : T(0);
    }
}

// KLM grids: block (i, s) takes rows [i kThreads, (i + 1) kThreads) against the samples a of column slice
// s, [s len, (s + 1) len): slices x row blocks >= 2 per SM (at n = 4096: 32 row blocks x 9 slices, was 32 blocks).
// Each (slice, row) writes its partial sums to ws[s][b][:]; the last block of a row block to finish (an int
// ticket per row block, zeroed by klm_scale_kernel, which runs first on the stream) adds the slices in order:
// deterministic, one launch, no float atomics.
struct KlmSlices {
  int64_t count, len;  // slices, samples per slice (a multiple of the shared tile)
};

inline KlmSlices klm_slices(int64_t n, int ta) {
  const int64_t rows = blocks_for(n), want = (2 * int64_t(device_sms()) + rows - 1) / rows;
  const int64_t tiles = (n + ta - 1) / ta, count = want < 1 ? 1 : (want > tiles ? tiles : want);
  const int64_t len = ((tiles + count - 1) / count) * ta;
  return {(n + len - 1) / len, len};
}

// True in every thread of the block that finished its row block last (all its partials then visible).
__device__ bool last_of_row_block(int* tickets) {
  __shared__ bool last;
  __threadfence();  // this block's partials before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&tickets[blockIdx.x], 1) == int(gridDim.y) - 1;
  __syncthreads();
  return last;
}

// One thread per row b of a slice; the marginal and joint sums of the slice accumulate in the thread's own row of
// ws (fp32 for fp32, fp64 for fp64: acc_type<T> is T), then the last block adds the slices and takes the logs.
// Exponents are <= 0 and the a = b term is 1, so the sums lie in [1, n] and need no running maximum.
template <typename T>
__global__ void klm_fwd_kernel(const T* __restrict__ y, T* __restrict__ lse, T* __restrict__ ws, int* tickets,
                               int64_t n, int64_t d, T c_joint, int ta, KlmSlices sl) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ys = reinterpret_cast<T*>(smem);
  const int64_t b = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const bool live = b < n;
  const int64_t w = d + 1, a_lo = blockIdx.y * sl.len, a_hi = a_lo + sl.len < n ? a_lo + sl.len : n;
  T* acc = ws + (int64_t(blockIdx.y) * n + b) * w;
  if (live)
    for (int64_t j = 0; j < w; ++j) acc[j] = T(0);
  T sq[kTileA];
  for (int64_t a0 = a_lo; a0 < a_hi; a0 += ta) {
    __syncthreads();
    load_tile<T>(y, nullptr, n, d, a0, ta, ys, nullptr);
    __syncthreads();
    if (!live) continue;
    const int na = int(a_hi - a0 < ta ? a_hi - a0 : ta);
    for (int a = 0; a < na; ++a) sq[a] = T(0);
    for (int64_t j = 0; j < d; ++j) {
      const T yb = y[b * d + j];
      T m = 0;
      for (int a = 0; a < na; ++a) {
        const T dd = yb - ys[a * d + j];
        sq[a] += dd * dd;
        m += vexp(T(-0.5) * dd * dd);
      }
      acc[1 + j] += m;
    }
    T s = 0;
    for (int a = 0; a < na; ++a) s += vexp(c_joint * sq[a]);
    acc[0] += s;
  }
  if (!last_of_row_block(tickets) || !live) return;
  for (int64_t j = 0; j < w; ++j) {
    T total = 0;
    for (int64_t q = 0; q < gridDim.y; ++q) total += __ldcg(ws + (q * n + b) * w + j);
    lse[b * w + j] = qk_log(total);
  }
}

// The backward by the same slices: the gradient's partial sums in ws[s][b][:d], added in order by the last block.
template <typename T>
__global__ void klm_bwd_kernel(const T* __restrict__ y, const T* __restrict__ lse, T* __restrict__ gy,
                               T* __restrict__ ws, int* tickets, int64_t n, int64_t d, T c_joint, T inv_f2, T scale,
                               int ta, KlmSlices sl) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ys = reinterpret_cast<T*>(smem);
  T* els = ys + int64_t(ta) * d;  // (ta, d + 1): exp(-lse[a, :])
  const int64_t b = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const bool live = b < n;
  const int64_t w = d + 1, a_lo = blockIdx.y * sl.len, a_hi = a_lo + sl.len < n ? a_lo + sl.len : n;
  T* acc = ws + (int64_t(blockIdx.y) * n + b) * d;
  if (live)
    for (int64_t j = 0; j < d; ++j) acc[j] = T(0);
  const T elb = live ? qk_exp(-lse[b * w]) : T(0);
  T sq[kTileA], wj[kTileA];
  for (int64_t a0 = a_lo; a0 < a_hi; a0 += ta) {
    __syncthreads();
    load_tile<T>(y, lse, n, d, a0, ta, ys, els);
    __syncthreads();
    if (!live) continue;
    const int na = int(a_hi - a0 < ta ? a_hi - a0 : ta);
    for (int a = 0; a < na; ++a) sq[a] = T(0);
    for (int64_t j = 0; j < d; ++j) {
      const T yb = y[b * d + j];
      for (int a = 0; a < na; ++a) {
        const T dd = yb - ys[a * d + j];
        sq[a] += dd * dd;
      }
    }
    for (int a = 0; a < na; ++a) wj[a] = -vexp(c_joint * sq[a]) * (elb + els[a * w]) * inv_f2;
    for (int64_t j = 0; j < d; ++j) {
      const T yb = y[b * d + j], eb = qk_exp(-lse[b * w + 1 + j]);
      T s = 0;
      for (int a = 0; a < na; ++a) {
        const T dd = yb - ys[a * d + j];
        s += (wj[a] + vexp(T(-0.5) * dd * dd) * (eb + els[a * w + 1 + j])) * dd;
      }
      acc[j] += s;
    }
  }
  if (!last_of_row_block(tickets) || !live) return;
  for (int64_t j = 0; j < d; ++j) {
    T total = 0;
    for (int64_t q = 0; q < gridDim.y; ++q) total += __ldcg(ws + (q * n + b) * d + j);
    gy[b * d + j] = total * scale;
  }
}

// One block per latent j: s[j] (given, or the population std + 1e-6 with mean and var), then y = z / s.
template <typename T>
__global__ void klm_scale_kernel(const T* __restrict__ z, const T* __restrict__ std, T* __restrict__ s,
                                 T* __restrict__ mean, T* __restrict__ var, T* __restrict__ y, int64_t n, int64_t d,
                                 int* tickets, int64_t num_tickets) {
  using A = typename acc_type<T>::type;
  __shared__ A shared[kThreads];
  const int64_t j = blockIdx.x;
  if (j == 0)  // the tickets of the KLM kernel that follows on the stream
    for (int64_t t = threadIdx.x; t < num_tickets; t += kThreads) tickets[t] = 0;
  A sj;
  if (std != nullptr) {
    sj = A(std[j]);
  } else {
    A sum = 0;
    for (int64_t b = threadIdx.x; b < n; b += kThreads) sum += A(z[b * d + j]);
    const A m = block_sum<kThreads>(sum, shared) / A(n);
    A sq = 0;
    for (int64_t b = threadIdx.x; b < n; b += kThreads) {
      const A dev = A(z[b * d + j]) - m;
      sq += dev * dev;
    }
    const A v = block_sum<kThreads>(sq, shared) / A(n);
    sj = (v > A(0) ? sqrt(v) : A(0)) + A(1e-6);
    if (threadIdx.x == 0) {
      mean[j] = T(m);
      var[j] = T(v);
    }
  }
  if (threadIdx.x == 0) s[j] = T(sj);
  for (int64_t b = threadIdx.x; b < n; b += kThreads) y[b * d + j] = T(A(z[b * d + j]) / sj);
}

// One block: the loss from the log-sum-exps.
template <typename T>
__global__ void klm_loss_kernel(const T* __restrict__ lse, T* __restrict__ loss, int64_t n, int64_t d, double c) {
  using A = typename acc_type<T>::type;
  __shared__ A shared[kThreads];
  // sum_b (joint_b - sum_j marginal_bj) = 2 sum_b joint_b - (sum of all n (d + 1) entries): the second sum flat, so
  // that neighbouring threads read neighbouring entries (coalesced), without a 64-bit modulo per entry
  const int64_t w = d + 1;
  A acc = 0;
  for (int64_t e = threadIdx.x; e < n * w; e += kThreads) acc -= A(lse[e]);
  for (int64_t b = threadIdx.x; b < n; b += kThreads) acc += A(2) * A(lse[b * w]);
  const A total = block_sum<kThreads>(acc, shared);
  if (threadIdx.x == 0) *loss = T(total / A(n) + A(c));
}

// One block per latent j: gs_j, then gz[:, j].
template <typename T>
__global__ void klm_unscale_kernel(const T* __restrict__ gy, const T* grad_loss, const T* __restrict__ z,
                                   const T* __restrict__ y, const T* __restrict__ s, const T* __restrict__ mean,
                                   const T* __restrict__ var, bool default_std, T* __restrict__ gz,
                                   T* __restrict__ gs, int64_t n, int64_t d) {
  using A = typename acc_type<T>::type;
  __shared__ A shared[kThreads];
  const int64_t j = blockIdx.x;
  const A g = A(*grad_loss), sj = A(s[j]);
  A part = 0;
  for (int64_t b = threadIdx.x; b < n; b += kThreads) part += A(gy[b * d + j]) * g * A(y[b * d + j]);
  const A gsj = -block_sum<kThreads>(part, shared) / sj;
  if (gs != nullptr && threadIdx.x == 0) gs[j] = T(gsj);
  const A vj = default_std ? A(var[j]) : A(0);
  const A coef = vj > A(0) ? gsj / (A(n) * sqrt(vj)) : A(0), mj = default_std ? A(mean[j]) : A(0);
  for (int64_t b = threadIdx.x; b < n; b += kThreads)
    gz[b * d + j] = T(A(gy[b * d + j]) * g / sj + coef * (A(z[b * d + j]) - mj));
}

// Unnormalized kernel term of u = (p - x) / sigma: N(u) = exp(-u^2 / 2) or D(u) = -u N(u); with
// grad, its derivative d/dp. Terms beyond kWindow sigma are dropped (kde.h).
template <typename T>
__device__ __forceinline__ T kde_term(T p, T x, T inv_sigma, bool deriv, bool grad) {
  const T u = (p - x) * inv_sigma;
  if (qk_abs(u) > T(kWindow)) return T(0);
  const T e = vexp(T(-0.5) * u * u);
  if (grad) return deriv ? -(T(1) - u * u) * e * inv_sigma : -u * e * inv_sigma;
  return deriv ? -u * e : e;
}

// One thread per point (j, k); streams the samples. out = scale * sum_s term (forward) or, with
// grad != nullptr, grad[j, k] * scale * sum_s d term / dp (points' gradient).
template <typename T>
__global__ void kde_grid_points_kernel(const T* __restrict__ pts, const T* __restrict__ smp,
                                       const T* __restrict__ grad, T* __restrict__ out, int64_t n, int64_t d,
                                       int64_t K, T inv_sigma, T scale, bool deriv) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e >= d * K) return;
  const int64_t j = e / K;
  const T p = pts[e];
  T acc = 0;
  for (int64_t s = 0; s < n; ++s) acc += kde_term(p, smp[s * d + j], inv_sigma, deriv, grad != nullptr);
  out[e] = grad != nullptr ? grad[e] * scale * acc : scale * acc;
}

// One thread per sample (s, j); streams latent j's points: -scale * sum_k grad[j, k] d term / dp.
template <typename T>
__global__ void kde_grid_samples_kernel(const T* __restrict__ pts, const T* __restrict__ smp,
                                        const T* __restrict__ grad, T* __restrict__ gsmp, int64_t n, int64_t d,
                                        int64_t K, T inv_sigma, T scale, bool deriv) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e >= n * d) return;
  const int64_t j = e % d;
  const T x = smp[e];
  T acc = 0;
  for (int64_t k = 0; k < K; ++k) acc += grad[j * K + k] * kde_term(pts[j * K + k], x, inv_sigma, deriv, true);
  gsmp[e] = -scale * acc;
}

double kde_scale(int64_t n, double sigma, bool deriv) {
  return 1.0 / (double(n) * sigma * 2.5066282746310002 * (deriv ? sigma : 1.0));
}

}  // namespace

int64_t klm_workspace(int64_t n, int64_t d, bool is_double, bool backward) {
  const int64_t floats = backward ? 2 * d + 1 : d;
  const KlmSlices sl = klm_slices(n, is_double ? tile_a<double>(floats) : tile_a<float>(floats));
  return sl.count * n * (backward ? d : d + 1);
}

int64_t klm_tickets(int64_t n) { return blocks_for(n); }

template <typename T>
cudaError_t klm_fwd(const T* y, T* lse, T* ws, int* tickets, int64_t n, int64_t d, double c_joint,
                    cudaStream_t stream) {
  const int ta = tile_a<T>(d);
  const KlmSlices sl = klm_slices(n, ta);
  klm_fwd_kernel<T><<<dim3(unsigned(blocks_for(n)), unsigned(sl.count)), kThreads, size_t(ta) * d * sizeof(T),
                      stream>>>(y, lse, ws, tickets, n, d, T(c_joint), ta, sl);
  return cudaGetLastError();
}

template <typename T>
cudaError_t klm_bwd(const T* y, const T* lse, T* gy, T* ws, int* tickets, int64_t n, int64_t d, double c_joint,
                    double inv_f2, double scale, cudaStream_t stream) {
  const int ta = tile_a<T>(2 * d + 1);
  const KlmSlices sl = klm_slices(n, ta);
  klm_bwd_kernel<T><<<dim3(unsigned(blocks_for(n)), unsigned(sl.count)), kThreads,
                      size_t(ta) * (2 * d + 1) * sizeof(T), stream>>>(y, lse, gy, ws, tickets, n, d, T(c_joint),
                                                                      T(inv_f2), T(scale), ta, sl);
  return cudaGetLastError();
}

template <typename T>
cudaError_t klm_scale(const T* z, const T* std, T* s, T* mean, T* var, T* y, int* tickets, int64_t n, int64_t d,
                      cudaStream_t stream) {
  klm_scale_kernel<T><<<d, kThreads, 0, stream>>>(z, std, s, mean, var, y, n, d, tickets, klm_tickets(n));
  return cudaGetLastError();
}

template <typename T>
cudaError_t klm_loss(const T* lse, T* loss, int64_t n, int64_t d, double c, cudaStream_t stream) {
  klm_loss_kernel<T><<<1, kThreads, 0, stream>>>(lse, loss, n, d, c);
  return cudaGetLastError();
}

template <typename T>
cudaError_t klm_unscale(const T* gy, const T* grad_loss, const T* z, const T* y, const T* s, const T* mean,
                        const T* var, bool default_std, T* gz, T* gs, int64_t n, int64_t d, cudaStream_t stream) {
  klm_unscale_kernel<T><<<d, kThreads, 0, stream>>>(gy, grad_loss, z, y, s, mean, var, default_std, gz, gs, n, d);
  return cudaGetLastError();
}

template <typename T>
cudaError_t kde_grid_fwd(const T* points, const T* samples, T* out, int64_t n, int64_t d, int64_t K,
                         double sigma, bool derivative, cudaStream_t stream) {
  kde_grid_points_kernel<T><<<blocks_for(d * K), kThreads, 0, stream>>>(
      points, samples, nullptr, out, n, d, K, T(1.0 / sigma), T(kde_scale(n, sigma, derivative)), derivative);
  return cudaGetLastError();
}

template <typename T>
cudaError_t kde_grid_bwd(const T* grad, const T* points, const T* samples, T* grad_points, T* grad_samples,
                         int64_t n, int64_t d, int64_t K, double sigma, bool derivative, cudaStream_t stream) {
  const T inv_sigma = T(1.0 / sigma), scale = T(kde_scale(n, sigma, derivative));
  kde_grid_points_kernel<T><<<blocks_for(d * K), kThreads, 0, stream>>>(
      points, samples, grad, grad_points, n, d, K, inv_sigma, scale, derivative);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  kde_grid_samples_kernel<T><<<blocks_for(n * d), kThreads, 0, stream>>>(
      points, samples, grad, grad_samples, n, d, K, inv_sigma, scale, derivative);
  return cudaGetLastError();
}

#define QK_INSTANTIATE(T)                                                                                 \
  template cudaError_t klm_fwd<T>(const T*, T*, T*, int*, int64_t, int64_t, double, cudaStream_t);       \
  template cudaError_t klm_bwd<T>(const T*, const T*, T*, T*, int*, int64_t, int64_t, double, double,     \
                                  double, cudaStream_t);                                                  \
  template cudaError_t klm_scale<T>(const T*, const T*, T*, T*, T*, T*, int*, int64_t, int64_t,           \
                                    cudaStream_t);                                                        \
  template cudaError_t klm_loss<T>(const T*, T*, int64_t, int64_t, double, cudaStream_t);                  \
  template cudaError_t klm_unscale<T>(const T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                      bool, T*, T*, int64_t, int64_t, cudaStream_t);                       \
  template cudaError_t kde_grid_fwd<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, double, bool,   \
                                       cudaStream_t);                                                     \
  template cudaError_t kde_grid_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,  \
                                       double, bool, cudaStream_t);
QK_INSTANTIATE(float)
QK_INSTANTIATE(double)
#undef QK_INSTANTIATE

}  // namespace cuda
}  // namespace qkernels
