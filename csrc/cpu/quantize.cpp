// CPU kernels of the quantization hot path, threaded by torch::stable::parallel_for (torch's
// intra-op pool; schemas: csrc/schemas.cpp). latent_quantize's math is here; the relaxed categorical
// kernels (csrc/cpu/quantize_kernels.h, vectorized) are compiled twice, for baseline x86-64 and for
// AVX+FMA, and the entry points pick the copy the CPU supports at run time (csrc/cpu/isa.h). Their
// equations are those of csrc/include/qkernels/quantize.h, which the CUDA kernels use.
//
// Reductions (losses, codebook gradients) use a fixed row chunking whose partial sums are added in
// chunk order, so results do not depend on the number of threads.
#include "qkernels/stable.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "isa.h"
#include "qkernels/common.h"
#include "qkernels/quantize_checks.h"

namespace qkernels {

// 32-byte vector types in the baseline copy are emulated with SSE pairs: no ABI concern here (all
// of it is internal to this file).
#pragma GCC diagnostic ignored "-Wpsabi"
namespace isa_base {
#include "quantize_kernels.h"
}  // namespace isa_base
#if QK_AVX_COPY
#pragma GCC push_options
#pragma GCC target("avx,fma")
namespace isa_avx {
#include "quantize_kernels.h"
}  // namespace isa_avx
#pragma GCC pop_options
#endif

namespace {

// Row chunks for deterministic reductions: at most kMaxChunks partial buffers.
constexpr int64_t kMaxChunks = 64;
int64_t chunk_rows(int64_t rows) { return std::max<int64_t>(64, (rows + kMaxChunks - 1) / kMaxChunks); }
// Grain (in chunks) for parallel_for: problems below ~64k scalar operations run on the calling
// thread, where waking the thread pool would cost more than the work.
int64_t grain(int64_t n_chunks, int64_t ops_per_chunk) {
  return n_chunks * ops_per_chunk < (int64_t(1) << 16) ? std::max<int64_t>(n_chunks, 1) : 1;
}

// Sum of per-chunk partials partial[c * size + e] in chunk order, times scale, as a (G, n) tensor.
Tensor sum_partials(const std::vector<double>& partial, int64_t n_chunks, int64_t G, int64_t n, double scale,
                    const Tensor& like) {
  Tensor out = alloc({G, n}, like.scalar_type(), like);
  dispatch_floating(out.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for (int64_t e = 0; e < G * n; ++e) {
      double acc = 0.0;
      for (int64_t c = 0; c < n_chunks; ++c) acc += partial[c * G * n + e];
      o[e] = static_cast<scalar_t>(scale * acc);
    }
  });
  return out;
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

std::tuple<Tensor, Tensor, Tensor, Tensor> latent_quantize_cpu(const Tensor& z_, const Tensor& values_) {
  check_codebook(z_, values_, "latent_quantize");
  check_finite(z_, "z", "latent_quantize");
  check_finite(values_, "values", "latent_quantize");
  const int64_t N = z_.size(0), d = z_.size(1);
  const Tensor z = as_contiguous(z_), values = as_contiguous(values_);
  const int64_t G = values.size(0), nv = values.size(1);
  Tensor zq = alloc_like(z);
  Tensor idx = alloc({N, d}, ScalarType::Long, z);
  const int64_t rows = chunk_rows(N), n_chunks = (N + rows - 1) / rows;
  std::vector<double> partial(std::max<int64_t>(n_chunks, 1), 0.0);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* zp = z.const_data_ptr<scalar_t>();
    const scalar_t* vp = values.const_data_ptr<scalar_t>();
    scalar_t* qp = zq.mutable_data_ptr<scalar_t>();
    int64_t* ip = idx.mutable_data_ptr<int64_t>();
    std::vector<scalar_t> sorted;
    std::vector<int32_t> order;
    sort_codebook(vp, G, nv, sorted, order);
    int32_t levels = 0;  // binary-search steps per element, for the parallel grain
    while ((int64_t(1) << levels) < nv) ++levels;
    torch::stable::parallel_for(0, n_chunks, grain(n_chunks, rows * d * (levels + 2)), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double acc = 0.0;
        const int64_t r1 = std::min(N, (c + 1) * rows);
        for (int64_t i = c * rows; i < r1; ++i) {
          for (int64_t j = 0; j < d; ++j) {
            const int64_t g = G == 1 ? 0 : j;
            const scalar_t x = zp[i * d + j];
            const int32_t k = nearest_sorted(x, sorted.data() + g * nv, order.data() + g * nv,
                                             static_cast<int32_t>(nv));
            const scalar_t q = vp[g * nv + k];
            qp[i * d + j] = q;
            ip[i * d + j] = k;
            const double diff = static_cast<double>(x) - static_cast<double>(q);
            acc += diff * diff;
          }
        }
        partial[c] = acc;
      }
    });
  });
  double total = 0.0;
  for (double p : partial) total += p;
  const double loss = total / static_cast<double>(N * d);
  return {zq, idx, cpu_scalar_tensor(loss, z.scalar_type(), z), cpu_scalar_tensor(loss, z.scalar_type(), z)};
}

std::tuple<Tensor, Tensor> latent_quantize_backward_cpu(const Tensor& grad_zq_, const Tensor& grad_lq,
                                                        const Tensor& grad_lc, const Tensor& z_,
                                                        const Tensor& values_, const Tensor& idx_) {
  check_latent_quantize_backward(grad_zq_, grad_lq, grad_lc, z_, values_, idx_, "latent_quantize_backward");
  const int64_t N = z_.size(0), d = z_.size(1);
  const Tensor z = as_contiguous(z_), values = as_contiguous(values_), idx = as_contiguous(idx_);
  const Tensor grad_zq = as_contiguous(grad_zq_);
  const int64_t G = values.size(0), nv = values.size(1);
  const double scale = 2.0 / static_cast<double>(N * d);
  const double s_c = cpu_scalar(grad_lc) * scale, s_q = cpu_scalar(grad_lq) * scale;
  Tensor grad_z = alloc_like(z);
  const int64_t rows = chunk_rows(N), n_chunks = (N + rows - 1) / rows;
  std::vector<double> partial(n_chunks * G * nv, 0.0);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* zp = z.const_data_ptr<scalar_t>();
    const scalar_t* vp = values.const_data_ptr<scalar_t>();
    const scalar_t* gp = grad_zq.const_data_ptr<scalar_t>();
    const int64_t* ip = idx.const_data_ptr<int64_t>();
    scalar_t* gz = grad_z.mutable_data_ptr<scalar_t>();
    torch::stable::parallel_for(0, n_chunks, grain(n_chunks, rows * d * 4), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double* part = partial.data() + c * G * nv;
        const int64_t r1 = std::min(N, (c + 1) * rows);
        for (int64_t i = c * rows; i < r1; ++i) {
          for (int64_t j = 0; j < d; ++j) {
            const int64_t e = i * d + j, g = (G == 1 ? 0 : j);
            const scalar_t q = vp[g * nv + ip[e]];
            const double diff = static_cast<double>(zp[e]) - static_cast<double>(q);
            gz[e] = static_cast<scalar_t>(static_cast<double>(gp[e]) + s_c * diff);
            part[g * nv + ip[e]] -= diff;
          }
        }
      }
    });
  });
  Tensor grad_values = sum_partials(partial, n_chunks, G, nv, s_q, values);
  return {grad_z, grad_values};
}

std::tuple<Tensor, Tensor, Tensor> relaxed_categorical_cpu(const Tensor& logits_, const Tensor& values_,
                                                           const std::optional<Tensor>& uniform_,
                                                           double tau, double noise_scale, bool hard) {
  check_categorical(logits_, values_, uniform_, "relaxed_categorical");
  check_finite(logits_, "logits", "relaxed_categorical");
  check_finite(values_, "values", "relaxed_categorical");
  if (uniform_.has_value()) check_unit_interval(*uniform_, "uniform", "relaxed_categorical");
  const Tensor logits = as_contiguous(logits_), values = as_contiguous(values_);
  const std::optional<Tensor> uniform = uniform_.has_value() ? std::optional(as_contiguous(*uniform_)) : std::nullopt;
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  Tensor z = alloc({N, d}, logits.scalar_type(), logits);
  Tensor y = alloc_like(logits);
  Tensor kl = alloc({N, d}, logits.scalar_type(), logits);
  dispatch_floating(logits.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    QK_ISA_CALL(categorical_forward_kernel<scalar_t>)(
        logits.const_data_ptr<scalar_t>(), uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr,
        values.const_data_ptr<scalar_t>(), N * d, d, G, K, tau, noise_scale, hard, z.mutable_data_ptr<scalar_t>(),
        y.mutable_data_ptr<scalar_t>(), kl.mutable_data_ptr<scalar_t>());
  });
  return {z, y, kl};
}

std::tuple<Tensor, Tensor> relaxed_categorical_backward_cpu(
    const Tensor& grad_z_, const Tensor& grad_y_, const Tensor& grad_kl_, const Tensor& logits_,
    const Tensor& values_, const std::optional<Tensor>& uniform_, const Tensor& y_, double tau,
    double noise_scale) {
  check_categorical_backward(grad_z_, grad_y_, grad_kl_, logits_, values_, uniform_, y_, "relaxed_categorical_backward");
  const Tensor logits = as_contiguous(logits_), values = as_contiguous(values_), y = as_contiguous(y_);
  const std::optional<Tensor> uniform = uniform_.has_value() ? std::optional(as_contiguous(*uniform_)) : std::nullopt;
  const Tensor grad_z = as_contiguous(grad_z_), grad_y = as_contiguous(grad_y_), grad_kl = as_contiguous(grad_kl_);
  const int64_t N = logits.size(0), d = logits.size(1), K = logits.size(2), G = values.size(0);
  Tensor grad_logits = alloc_like(logits);
  const int64_t rows = chunk_rows(N), n_chunks = (N + rows - 1) / rows;
  std::vector<double> partial(n_chunks * G * K, 0.0);
  dispatch_floating(logits.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    QK_ISA_CALL(categorical_backward_kernel<scalar_t>)(
        logits.const_data_ptr<scalar_t>(), uniform.has_value() ? uniform->const_data_ptr<scalar_t>() : nullptr,
        values.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(), grad_z.const_data_ptr<scalar_t>(),
        grad_y.const_data_ptr<scalar_t>(), grad_kl.const_data_ptr<scalar_t>(), N * d, d, G, K, tau, noise_scale,
        rows * d, grad_logits.mutable_data_ptr<scalar_t>(), partial.data());
  });
  Tensor grad_values = sum_partials(partial, n_chunks, G, K, 1.0, values);
  return {grad_logits, grad_values};
}

}  // namespace

}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("latent_quantize", TORCH_BOX(&qkernels::latent_quantize_cpu));
  m.impl("latent_quantize_backward", TORCH_BOX(&qkernels::latent_quantize_backward_cpu));
  m.impl("relaxed_categorical", TORCH_BOX(&qkernels::relaxed_categorical_cpu));
  m.impl("relaxed_categorical_backward", TORCH_BOX(&qkernels::relaxed_categorical_backward_cpu));
}
