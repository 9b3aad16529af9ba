// The CPU latent_quantize op on raw pointers (contiguous row-major data, float32 or float64; int64 or int32
// indices): what the torch binding (csrc/cpu/quantize.cpp) and the XLA FFI binding (csrc/jax/quantize_ffi.cpp)
// both call. No torch and no XLA here: threads through qkernels::parallel_for (qkernels/parallel.h).
//
// Reductions (losses, codebook gradients) use a fixed row chunking whose partial sums are added in
// chunk order, so results do not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "qkernels/parallel.h"

namespace qkernels {
namespace cpu {

// Row chunks for deterministic reductions: at most kMaxChunks partial buffers.
constexpr int64_t kMaxChunks = 64;
inline int64_t chunk_rows(int64_t rows) { return std::max<int64_t>(64, (rows + kMaxChunks - 1) / kMaxChunks); }
// Grain (in chunks) for parallel_for: problems below ~64k scalar operations run on the calling
// thread, where waking the thread pool would cost more than the work.
inline int64_t grain(int64_t n_chunks, int64_t ops_per_chunk) {
  return n_chunks * ops_per_chunk < (int64_t(1) << 16) ? std::max<int64_t>(n_chunks, 1) : 1;
}

// out[e] = scale * sum of the per-chunk partials partial[c * size + e] in chunk order, e < size.
template <typename T>
void sum_partials(const std::vector<double>& partial, int64_t n_chunks, int64_t size, double scale, T* out) {
  for (int64_t e = 0; e < size; ++e) {
    double acc = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) acc += partial[c * size + e];
    out[e] = static_cast<T>(scale * acc);
  }
}

// Each codebook row sorted ascending (stable: equal values keep index order) with the original index of
// every sorted position. A compiler given the obvious formulation (distances to every value, argmin)
// cannot know the values are few and may be searched: nearest value by binary search, O(log nv) per
// element instead of O(nv). Sorting G rows of nv values per call costs microseconds: nothing to cache.
template <typename scalar_t>
void sort_codebook(const scalar_t* vp, int64_t G, int64_t nv, std::vector<scalar_t>& sorted,
                   std::vector<int32_t>& order) {
  sorted.resize(G * nv);
  order.resize(G * nv);
  for (int64_t g = 0; g < G; ++g) {
    int32_t* o = order.data() + g * nv;
    for (int64_t k = 0; k < nv; ++k) o[k] = static_cast<int32_t>(k);
    const scalar_t* v = vp + g * nv;
    std::stable_sort(o, o + nv, [v](int32_t a, int32_t b) { return v[a] < v[b]; });
    for (int64_t k = 0; k < nv; ++k) sorted[g * nv + k] = v[o[k]];
  }
}

// Index (into the caller's codebook order) of the value nearest to x, exactly as argmin over |x - v|
// of every value with the first index on ties: the lower bound p splits the sorted values into < x and
// >= x; the nearest is s[p - 1] or s[p]; every value at the same (rounded) distance lies next to them
// in sorted order (equal values, or far-out x where distances round together), so the walk outwards
// collects them all and keeps the smallest original index.
template <typename scalar_t>
inline int32_t nearest_sorted(scalar_t x, const scalar_t* s, const int32_t* order, int32_t nv) {
  int32_t lo = 0, n = nv;
  while (n > 1) {  // branch-free lower bound
    const int32_t half = n >> 1;
    lo = s[lo + half - 1] < x ? lo + half : lo;
    n -= half;
  }
  const int32_t p = lo + (s[lo] < x ? 1 : 0);
  const scalar_t d_lo = p > 0 ? x - s[p - 1] : std::numeric_limits<scalar_t>::infinity();
  const scalar_t d_hi = p < nv ? s[p] - x : std::numeric_limits<scalar_t>::infinity();
  const scalar_t best = d_lo < d_hi ? d_lo : d_hi;
  int32_t idx = std::numeric_limits<int32_t>::max();
  for (int32_t k = p - 1; k >= 0 && x - s[k] == best; --k) idx = std::min(idx, order[k]);
  for (int32_t k = p; k < nv && s[k] - x == best; ++k) idx = std::min(idx, order[k]);
  // no value at a comparable distance: x (or the codebook) is NaN, reached only with value checks off.
  // Index 0, as argmin over all-NaN distances; never an out-of-bounds index
  return idx == std::numeric_limits<int32_t>::max() ? 0 : idx;
}

// Up to this many values, the nearest is found by scanning them all: no dependent loads (the binary search's)
// and no data-dependent loop exits (its tie walk's), so at QLAE's n_v = 10 the scan is the faster one.
constexpr int64_t kScanMaxValues = 16;

// Index of the value nearest to x by a scan of v[0..nv): the first minimum of |x - v| (argmin's rule; NaN
// distances never win, so an all-NaN row gives index 0, as nearest_sorted).
template <typename scalar_t>
inline int32_t nearest_scan(scalar_t x, const scalar_t* v, int32_t nv) {
  scalar_t best = std::abs(x - v[0]);
  int32_t idx = 0;
  for (int32_t k = 1; k < nv; ++k) {
    const scalar_t dist = std::abs(x - v[k]);
    idx = dist < best ? k : idx;
    best = dist < best ? dist : best;
  }
  return idx;
}

// z (N, d), values (G, nv) with G = 1 or d -> z_q (N, d), indices (N, d); returns the loss mean((z - z_q)^2)
// (loss_quantize and loss_commit alike). nearest(x, g) -> the index of the value of codebook row g nearest x.
template <typename scalar_t, typename index_t, typename Nearest>
double latent_quantize_rows(const scalar_t* zp, const scalar_t* vp, int64_t N, int64_t d, int64_t G, int64_t nv,
                            int64_t ops_per_element, const Nearest& nearest, scalar_t* qp, index_t* ip) {
  const int64_t rows = chunk_rows(N), n_chunks = (N + rows - 1) / rows;
  std::vector<double> partial(std::max<int64_t>(n_chunks, 1), 0.0);
  parallel_for(0, n_chunks, grain(n_chunks, rows * d * ops_per_element), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double acc = 0.0;
      const int64_t r1 = std::min(N, (c + 1) * rows);
      for (int64_t i = c * rows; i < r1; ++i) {
        for (int64_t j = 0; j < d; ++j) {
          const int64_t g = G == 1 ? 0 : j;
          const scalar_t x = zp[i * d + j];
          const int32_t k = nearest(x, g);
          const scalar_t q = vp[g * nv + k];
          qp[i * d + j] = q;
          ip[i * d + j] = static_cast<index_t>(k);
          const double diff = static_cast<double>(x) - static_cast<double>(q);
          acc += diff * diff;
        }
      }
      partial[c] = acc;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total / static_cast<double>(N * d);
}

template <typename scalar_t, typename index_t>
double latent_quantize_forward(const scalar_t* zp, const scalar_t* vp, int64_t N, int64_t d, int64_t G, int64_t nv,
                               scalar_t* qp, index_t* ip) {
  const auto n = static_cast<int32_t>(nv);
  if (nv <= kScanMaxValues) {
    auto scan = [&](scalar_t x, int64_t g) { return nearest_scan(x, vp + g * nv, n); };
    return latent_quantize_rows(zp, vp, N, d, G, nv, nv + 2, scan, qp, ip);
  }
  std::vector<scalar_t> sorted;
  std::vector<int32_t> order;
  sort_codebook(vp, G, nv, sorted, order);
  int32_t levels = 0;  // binary-search steps per element, for the parallel grain
  while ((int64_t(1) << levels) < nv) ++levels;
  auto search = [&](scalar_t x, int64_t g) {
    return nearest_sorted(x, sorted.data() + g * nv, order.data() + g * nv, n);
  };
  return latent_quantize_rows(zp, vp, N, d, G, nv, levels + 2, search, qp, ip);
}

// Upstream gradients of z_q (N, d) and of the two losses (grad_lq, grad_lc) -> grad_z (N, d) (straight
// through plus the commitment loss's share) and grad_values (G, nv) (the codebook loss's share).
template <typename scalar_t, typename index_t>
void latent_quantize_backward(const scalar_t* gp, double grad_lq, double grad_lc, const scalar_t* zp,
                              const scalar_t* vp, const index_t* ip, int64_t N, int64_t d, int64_t G, int64_t nv,
                              scalar_t* gz, scalar_t* gv) {
  const double scale = 2.0 / static_cast<double>(N * d);
  const double s_c = grad_lc * scale, s_q = grad_lq * scale;
  const int64_t rows = chunk_rows(N), n_chunks = (N + rows - 1) / rows;
  std::vector<double> partial(n_chunks * G * nv, 0.0);
  parallel_for(0, n_chunks, grain(n_chunks, rows * d * 4), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double* part = partial.data() + c * G * nv;
      const int64_t r1 = std::min(N, (c + 1) * rows);
      for (int64_t i = c * rows; i < r1; ++i) {
        for (int64_t j = 0; j < d; ++j) {
          const int64_t e = i * d + j, g = (G == 1 ? 0 : j), k = static_cast<int64_t>(ip[e]);
          const scalar_t q = vp[g * nv + k];
          const double diff = static_cast<double>(zp[e]) - static_cast<double>(q);
          gz[e] = static_cast<scalar_t>(static_cast<double>(gp[e]) + s_c * diff);
          part[g * nv + k] -= diff;
        }
      }
    }
  });
  sum_partials(partial, n_chunks, G * nv, s_q, gv);
}

}  // namespace cpu
}  // namespace qkernels
