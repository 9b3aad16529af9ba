// CUDA kernels of the KDE hot path (KLM, kde_grid, Cliff terms). The math (windowing, exp, Silverman factor) is
// csrc/include/qkernels/kde.h, shared with csrc/cpu/kde.cpp. No torch headers: compile-checked with
// plain nvcc in the tests.
#include "kde.cuh"
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

// One thread per row b; the marginal sums accumulate in the thread's own row of lse (fp32 for
// fp32, fp64 for fp64: acc_type<T> is T), then become logs. Exponents are <= 0 and the a = b term is
// 1, so the sums lie in [1, n] and need no running maximum.
template <typename T>
__global__ void klm_fwd_kernel(const T* __restrict__ y, T* __restrict__ lse, int64_t n, int64_t d, T c_joint,
                               int ta) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ys = reinterpret_cast<T*>(smem);
  const int64_t b = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const bool live = b < n;
  const int64_t w = d + 1;
  if (live)
    for (int64_t j = 0; j < w; ++j) lse[b * w + j] = T(0);
  T sq[kTileA];
  for (int64_t a0 = 0; a0 < n; a0 += ta) {
    __syncthreads();
    load_tile<T>(y, nullptr, n, d, a0, ta, ys, nullptr);
    __syncthreads();
    if (!live) continue;
    const int na = int(n - a0 < ta ? n - a0 : ta);
    for (int a = 0; a < na; ++a) sq[a] = T(0);
    for (int64_t j = 0; j < d; ++j) {
      const T yb = y[b * d + j];
      T m = 0;
      for (int a = 0; a < na; ++a) {
        const T dd = yb - ys[a * d + j];
        sq[a] += dd * dd;
        m += vexp(T(-0.5) * dd * dd);
      }
      lse[b * w + 1 + j] += m;
    }
    T s = 0;
    for (int a = 0; a < na; ++a) s += vexp(c_joint * sq[a]);
    lse[b * w] += s;
  }
  if (live)
    for (int64_t j = 0; j < w; ++j) lse[b * w + j] = qk_log(lse[b * w + j]);
}

template <typename T>
__global__ void klm_bwd_kernel(const T* __restrict__ y, const T* __restrict__ lse, T* __restrict__ gy, int64_t n,
                               int64_t d, T c_joint, T inv_f2, T scale, int ta) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ys = reinterpret_cast<T*>(smem);
  T* els = ys + int64_t(ta) * d;  // (ta, d + 1): exp(-lse[a, :])
  const int64_t b = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const bool live = b < n;
  const int64_t w = d + 1;
  if (live)
    for (int64_t j = 0; j < d; ++j) gy[b * d + j] = T(0);
  const T elb = live ? qk_exp(-lse[b * w]) : T(0);
  T sq[kTileA], wj[kTileA];
  for (int64_t a0 = 0; a0 < n; a0 += ta) {
    __syncthreads();
    load_tile<T>(y, lse, n, d, a0, ta, ys, els);
    __syncthreads();
    if (!live) continue;
    const int na = int(n - a0 < ta ? n - a0 : ta);
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
      gy[b * d + j] += s;
    }
  }
  if (live)
    for (int64_t j = 0; j < d; ++j) gy[b * d + j] *= scale;
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

// ============================================================================ cliff_terms
//
// Same algorithm as csrc/cpu/kde.cpp and qkernels/triton/kde.py: the normalizing constants cancel
// in the normalized grids, so D(u) = -u exp(-u^2/2), u = (t_k - x_si) / sigma and N(w) =
// exp(-w^2/2), w = (zeta_m - x_sj) / sigma are accumulated unnormalized (every sample, no kWindow
// truncation: see cliff_dker). Entropies / JSDs use the kde.h column helpers (column_norm, column_entropy,
// column_backward, uni_entropy), each column owned by one thread. Every sum is owned by one thread
// in a fixed order: deterministic, no atomics. Grids live in a global workspace (one K x M slice
// per resident block), not in shared memory, so K and M are unbounded.

// D(u) and (ddx != nullptr) dD/dx = (1 - u^2) exp(-u^2/2) / sigma. Not truncated at kWindow: when
// sigma is far below the grid spacing a column can have no term within the window, and only the
// full (tiny) terms then give the reference's normalized density. Exact zeros come from exp
// underflow alone, as in the reference; the loops skip them.
template <typename T>
__device__ __forceinline__ T cliff_dker(T t, T x, T inv_sigma, T* ddx) {
  const T u = (t - x) * inv_sigma;
  const T e = qk_exp(T(-0.5) * u * u);
  if (ddx != nullptr) *ddx = (T(1) - u * u) * e * inv_sigma;
  return -u * e;
}

// N(w) and (dndx != nullptr) dN/dx = w / sigma N (= -dN/dzeta); not truncated (as cliff_dker).
template <typename T>
__device__ __forceinline__ T cliff_ker(T z, T x, T inv_sigma, T* dndx) {
  const T w = (z - x) * inv_sigma;
  const T e = qk_exp(T(-0.5) * w * w);
  if (dndx != nullptr) *dndx = w * inv_sigma * e;
  return e;
}

// log sum_s exp(-(v - x_si)^2 / (2 sigma^2)) over every sample (max first: never underflows).
template <typename T>
__device__ T cliff_lse(const T* x, int64_t n, int64_t d, int64_t i, T v, T inv_sigma) {
  T amax = -INFINITY;
  for (int64_t s = 0; s < n; ++s) {
    const T u = (v - x[s * d + i]) * inv_sigma;
    const T a = T(-0.5) * u * u;
    amax = a > amax ? a : amax;
  }
  T sum = 0;
  for (int64_t s = 0; s < n; ++s) {
    const T u = (v - x[s * d + i]) * inv_sigma;
    sum += qk_exp(T(-0.5) * u * u - amax);
  }
  return amax + qk_log(sum);
}

// All threads: G[k] = sum_s D((t_k - x_si) / sigma), k < K.
template <typename T>
__device__ void cliff_uni_grid(const T* x, const T* t, int64_t n, int64_t d, int64_t K, int64_t i, T inv_sigma,
                               T* G) {
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const T tk = t[k];
    T acc = 0;
    for (int64_t s = 0; s < n; ++s) acc += cliff_dker(tk, x[s * d + i], inv_sigma, static_cast<T*>(nullptr));
    G[k] = acc;
  }
}

// All threads, ends with a barrier: zeta[m] = x[cond[j, m], j]; G[m K + k] = sum_s D(t_k - x_si)
// N(zeta_m - x_sj) (row m = conditioning value m, k contiguous); cm[m] =
// column normalizer; mix[k] = mean_m |G[m, k]| / cm[m] (columns with cm = 0 contribute 0).
template <typename T>
__device__ void cliff_pair_grid(const T* x, const T* t, const int64_t* cond, int64_t n, int64_t d, int64_t K,
                                int64_t M, int64_t i, int64_t j, T inv_sigma, T step, T* G, T* zeta, T* cm,
                                T* mix) {
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t r = cond[j * M + m];  // out of range: NaN, never an out-of-bounds read
    zeta[m] = (r >= 0 && r < n) ? x[r * d + j] : qk_nan<T>();
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < M * K; e += blockDim.x) {
    const T z = zeta[e / K], tk = t[e % K];
    T acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      const T nv = cliff_ker(z, x[s * d + j], inv_sigma, static_cast<T*>(nullptr));
      if (nv != T(0)) acc += nv * cliff_dker(tk, x[s * d + i], inv_sigma, static_cast<T*>(nullptr));
    }
    G[e] = acc;
  }
  __syncthreads();
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) cm[m] = column_norm(G + m * K, int(K), 1, step);
  __syncthreads();
  const T invM = T(1) / T(M);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    T acc = 0;
    for (int64_t m = 0; m < M; ++m)
      if (cm[m] > T(0)) acc += qk_abs(G[m * K + k]) / cm[m] * invM;
    mix[k] = acc;
  }
  __syncthreads();
}

// Forward, one block per latent i: uni[i] (entropy of the normalized derivative grid) and kl[i].
// Workspace per block: K + Ku.
template <typename T>
__global__ void cliff_uni_kl_fwd_kernel(const T* __restrict__ x, const T* __restrict__ t, const T* __restrict__ v,
                                        T* __restrict__ uni, T* __restrict__ kl, T* __restrict__ ws, int64_t n,
                                        int64_t d, int64_t K, int64_t Ku, T inv_sigma, T step, double log_const) {
  const int64_t i = blockIdx.x;
  T* G = ws + i * (K + Ku);
  T* lse = G + K;
  cliff_uni_grid(x, t, n, d, K, i, inv_sigma, G);
  for (int64_t k = threadIdx.x; k < Ku; k += blockDim.x) lse[k] = cliff_lse(x, n, d, i, v[k], inv_sigma);
  __syncthreads();
  if (threadIdx.x == 0) {
    uni[i] = uni_entropy(G, int(K), step, T(0), static_cast<T*>(nullptr));
    double acc = 0.0;
    for (int64_t k = 0; k < Ku; ++k) acc += double(lse[k]);
    // kl_i = -log(2 sqrt 3) - mean_v log p_i(v), log p_i(v) = lse_v - log(n sigma sqrt(2 pi))
    kl[i] = T(log_const - acc / double(Ku));
  }
}

// Forward JSD of the ordered pairs p = i (d - 1) + r (j = r + (r >= i)), grid-stride over pairs.
// Workspace per block: M K + 2 M + K.
template <typename T>
__global__ void cliff_biv_fwd_kernel(const T* __restrict__ x, const T* __restrict__ t,
                                     const int64_t* __restrict__ cond, T* __restrict__ jsd, T* __restrict__ ws,
                                     int64_t n, int64_t d, int64_t K, int64_t M, T inv_sigma, T step) {
  T* G = ws + int64_t(blockIdx.x) * (M * K + 2 * M + K);
  T* zeta = G + M * K;
  T* cm = zeta + M;
  T* mix = cm + M;
  const int64_t P = d * (d - 1);
  const T invM = T(1) / T(M);
  for (int64_t p = blockIdx.x; p < P; p += gridDim.x) {
    const int64_t i = p / (d - 1), r = p % (d - 1), j = r + (r >= i ? 1 : 0);
    cliff_pair_grid(x, t, cond, n, d, K, M, i, j, inv_sigma, step, G, zeta, cm, mix);
    if (threadIdx.x == 0) {
      T h_each = 0, h_mix = 0;
      for (int64_t m = 0; m < M; ++m) h_each += column_entropy(G + m * K, int(K), 1, step, cm[m]);
      for (int64_t k = 0; k < K; ++k) h_mix += xlogx(mix[k]);
      jsd[p] = -step * h_mix - h_each * invM;
      for (int64_t m = 0; m < M; ++m)  // an out-of-range conditioning row (NaN zeta) poisons the pair
        if (zeta[m] != zeta[m]) jsd[p] = qk_nan<T>();
    }
    __syncthreads();  // G is rebuilt by the next pair
  }
}

// Backward, one block per latent c: owns column c of grad x (written by thread s % blockDim for
// row s, then the zeta scatter by thread 0), so no atomics. Recomputes the uni grid, the KL
// log-sum-exps and the grids of every pair (c, q) and (q, c). Workspace per block: 2 max(M K, K) +
// 3 M + K + Ku. g3 (device): dLoss/d(uni, biv, kl).
template <typename T>
__global__ void cliff_bwd_kernel(const T* __restrict__ x, const T* __restrict__ t, const T* __restrict__ v,
                                 const int64_t* __restrict__ cond, const T* __restrict__ g3, T* __restrict__ gx,
                                 T* __restrict__ ws, int64_t n, int64_t d, int64_t K, int64_t Ku, int64_t M,
                                 T inv_sigma, T step) {
  const int64_t c = blockIdx.x;
  const int64_t MK = M * K > K ? M * K : K;
  T* G = ws + c * (2 * MK + 3 * M + K + Ku);
  T* dG = G + MK;
  T* zeta = dG + MK;
  T* cm = zeta + M;
  T* gz = cm + M;
  T* mix = gz + M;
  T* lse = mix + K;
  const T g_uni = g3[0], g_biv = g3[1], g_kl = g3[2];
  // ---- uni and KL-uni
  cliff_uni_grid(x, t, n, d, K, c, inv_sigma, G);
  for (int64_t k = threadIdx.x; k < Ku; k += blockDim.x) lse[k] = cliff_lse(x, n, d, c, v[k], inv_sigma);
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) gz[m] = T(0);
  __syncthreads();
  if (threadIdx.x == 0) uni_entropy(G, int(K), step, g_uni, dG);  // dG[k] = dLoss/dG[k]
  __syncthreads();
  const T gk = -g_kl / T(Ku);
  for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
    const T xs = x[s * d + c];
    T acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      T dd;
      cliff_dker(t[k], xs, inv_sigma, &dd);
      acc += dG[k] * dd;
    }
    for (int64_t k = 0; k < Ku; ++k) {
      const T u = (v[k] - xs) * inv_sigma;
      acc += gk * qk_exp(T(-0.5) * u * u - lse[k]) * u * inv_sigma;
    }
    gx[s * d + c] = acc;
  }
  // ---- bivariate: pairs (c, q) (c differentiated, side 0) and (q, c) (c conditions, side 1)
  __shared__ int bad_zeta;  // an out-of-range conditioning row met: column c of grad x is NaN
  if (threadIdx.x == 0) bad_zeta = 0;
  const T invM = T(1) / T(M), sc = g_biv * step * invM;
  for (int64_t q = 0; q < d; ++q) {
    if (q == c) continue;
    for (int side = 0; side < 2; ++side) {
      const int64_t i = side == 0 ? c : q, j = side == 0 ? q : c;
      __syncthreads();  // the previous pair's dG / zeta are no longer read
      cliff_pair_grid(x, t, cond, n, d, K, M, i, j, inv_sigma, step, G, zeta, cm, mix);
      if (threadIdx.x == 0)
        for (int64_t m = 0; m < M; ++m)
          if (zeta[m] != zeta[m]) bad_zeta = 1;
      for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
        const T* g = G + m * K;
        T* gr = dG + m * K;
        for (int64_t k = 0; k < K; ++k) {
          const T p = cm[m] > T(0) ? qk_abs(g[k]) / cm[m] : T(0);
          gr[k] = sc * (dxlogx(p) - dxlogx(mix[k]));
        }
        column_backward(g, gr, int(K), 1, step, cm[m]);
      }
      __syncthreads();
      for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        const T xi = x[s * d + i], xj = x[s * d + j];
        T acc = 0;
        for (int64_t m = 0; m < M; ++m) {
          T dn;
          const T nv = cliff_ker(zeta[m], xj, inv_sigma, &dn);
          if (nv == T(0) && dn == T(0)) continue;
          const T* gr = dG + m * K;
          T a = 0;
          for (int64_t k = 0; k < K; ++k) {
            T dd;
            const T dv = cliff_dker(t[k], xi, inv_sigma, &dd);
            a += gr[k] * (side == 0 ? dd : dv);
          }
          acc += a * (side == 0 ? nv : dn);
        }
        gx[s * d + c] += acc;
      }
      if (side == 1) {  // through zeta_m = x[cond[c, m], c]: dN/dzeta = -dN/dx
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
          const T* gr = dG + m * K;
          T acc = 0;
          for (int64_t s = 0; s < n; ++s) {
            T dn;
            const T nv = cliff_ker(zeta[m], x[s * d + c], inv_sigma, &dn);
            if (nv == T(0) && dn == T(0)) continue;
            const T xi = x[s * d + i];
            T a = 0;
            for (int64_t k = 0; k < K; ++k) a += gr[k] * cliff_dker(t[k], xi, inv_sigma, static_cast<T*>(nullptr));
            acc -= a * dn;
          }
          gz[m] += acc;
        }
      }
    }
  }
  __syncthreads();
  if (bad_zeta)
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) gx[s * d + c] = qk_nan<T>();
  if (threadIdx.x == 0)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t r = cond[c * M + m];
      if (r >= 0 && r < n) gx[r * d + c] += gz[m];
    }
}

// Blocks of the pair kernel: two resident per SM of the current device (read at run time), at
// most one per pair.
int64_t biv_blocks(int64_t pairs) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
    sms = 1;
  return pairs < 2 * int64_t(sms) ? pairs : 2 * int64_t(sms);
}

}  // namespace

template <typename T>
cudaError_t klm_fwd(const T* y, T* lse, int64_t n, int64_t d, double c_joint, cudaStream_t stream) {
  const int ta = tile_a<T>(d);
  klm_fwd_kernel<T><<<blocks_for(n), kThreads, size_t(ta) * d * sizeof(T), stream>>>(y, lse, n, d, T(c_joint), ta);
  return cudaGetLastError();
}

template <typename T>
cudaError_t klm_bwd(const T* y, const T* lse, T* gy, int64_t n, int64_t d, double c_joint, double inv_f2,
                    double scale, cudaStream_t stream) {
  const int ta = tile_a<T>(2 * d + 1);
  klm_bwd_kernel<T><<<blocks_for(n), kThreads, size_t(ta) * (2 * d + 1) * sizeof(T), stream>>>(
      y, lse, gy, n, d, T(c_joint), T(inv_f2), T(scale), ta);
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

int64_t cliff_fwd_workspace(int64_t d, int64_t K, int64_t Ku, int64_t M) {
  const int64_t nb = biv_blocks(d * (d - 1));
  const int64_t a = d * (K + Ku), b = nb * (M * K + 2 * M + K);
  return a > b ? a : b;
}

int64_t cliff_bwd_workspace(int64_t d, int64_t K, int64_t Ku, int64_t M) {
  const int64_t MK = M * K > K ? M * K : K;
  return d * (2 * MK + 3 * M + K + Ku);
}

template <typename T>
cudaError_t cliff_fwd(const T* x, const T* grid, const T* uni_points, const int64_t* cond, T* uni, T* kl, T* jsd,
                      T* workspace, int64_t n, int64_t d, int64_t K, int64_t Ku, int64_t M, double sigma,
                      double step, cudaStream_t stream) {
  const double log_const = -std::log(2.0 * std::sqrt(3.0)) + std::log(double(n) * sigma * 2.5066282746310002);
  cliff_uni_kl_fwd_kernel<T><<<d, kThreads, 0, stream>>>(x, grid, uni_points, uni, kl, workspace, n, d, K, Ku,
                                                        T(1.0 / sigma), T(step), log_const);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || d < 2) return err;
  const int64_t nb = biv_blocks(d * (d - 1));
  cliff_biv_fwd_kernel<T><<<nb, kThreads, 0, stream>>>(x, grid, cond, jsd, workspace, n, d, K, M, T(1.0 / sigma),
                                                       T(step));
  return cudaGetLastError();
}

template <typename T>
cudaError_t cliff_bwd(const T* grads, const T* x, const T* grid, const T* uni_points, const int64_t* cond, T* grad_x,
                      T* workspace, int64_t n, int64_t d, int64_t K, int64_t Ku, int64_t M, double sigma,
                      double step, cudaStream_t stream) {
  cliff_bwd_kernel<T><<<d, kThreads, 0, stream>>>(x, grid, uni_points, cond, grads, grad_x, workspace, n, d, K, Ku,
                                                  M, T(1.0 / sigma), T(step));
  return cudaGetLastError();
}

#define QK_INSTANTIATE(T)                                                                                 \
  template cudaError_t klm_fwd<T>(const T*, T*, int64_t, int64_t, double, cudaStream_t);                 \
  template cudaError_t klm_bwd<T>(const T*, const T*, T*, int64_t, int64_t, double, double, double,       \
                                  cudaStream_t);                                                          \
  template cudaError_t kde_grid_fwd<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, double, bool,   \
                                       cudaStream_t);                                                     \
  template cudaError_t kde_grid_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,  \
                                       double, bool, cudaStream_t);                                       \
  template cudaError_t cliff_fwd<T>(const T*, const T*, const T*, const int64_t*, T*, T*, T*, T*, int64_t,      \
                                    int64_t, int64_t, int64_t, int64_t, double, double, cudaStream_t);          \
  template cudaError_t cliff_bwd<T>(const T*, const T*, const T*, const T*, const int64_t*, T*, T*, int64_t,    \
                                    int64_t, int64_t, int64_t, int64_t, double, double, cudaStream_t);
QK_INSTANTIATE(float)
QK_INSTANTIATE(double)
#undef QK_INSTANTIATE

}  // namespace cuda
}  // namespace qkernels
