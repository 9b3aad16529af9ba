// CPU kernels of the relaxed categorical sample (categorical_latent, gumbel_quantize's cpu backend), compiled
// once per instruction set: csrc/cpu/quantize.cpp includes this file twice, into namespaces isa_base (baseline
// x86-64) and isa_avx (AVX+FMA), and picks one at run time (csrc/cpu/isa.h); no include guard on purpose.
// Framework-free: raw pointers and sizes in (the entry points in quantize.cpp hold the tensors).
//
// One row of K categories per iteration, rows threaded (torch::stable::parallel_for), each row vectorized over
// its categories with the 32-byte vectors of simd.h (their exp and log; libm's scalar ones made this kernel
// 0.3-0.4x the reference, benchmarks/HISTORY.md, "Quantization"): the perturbed logits a = (l + s Gumbel(u)) / tau, the soft
// sample y = softmax(a), z = sum y v, and the plain softmax p = softmax(l) for KL(p || Uniform(K)) =
// sum p (log p + log K), log p = l - max - log sum exp(l - max) (one exp per category for p and log p). The same
// equations as csrc/include/qkernels/quantize.h (the CUDA kernels'): the Gumbel noise -log(-log(u)) with u
// clamped into [tiny, 1 - ulp/2] (finite for u = 0 and u = 1), the one-hot of the first maximum of y when hard.
// Exponents are <= 0, so Simd::exp's clamp at -87 (float) / -708 (double) stands in 1e-38 / 1e-308 for smaller
// terms, negligible in sums of at least 1; lanes past K are masked to 0.
//
// Determinism: the backward's codebook gradient is summed per fixed chunk of rows (in double), the chunks added in
// order by the caller: results do not depend on the number of threads.

#include "simd.h"

template <typename A>
struct CategoricalRow {
  using S = Simd<A>;
  using V = typename S::V;
  static constexpr int L = S::L;
  int K, Kp;       // categories, rounded up to whole vectors
  V tail_mask;     // 1 for the lanes of the last vector below K, else 0
  V tail_minf;     // 0 for those lanes, -inf for the others
  std::vector<A> a, e, lg, u;  // per row (padded): the perturbed logits, then y; exp(l - max); logits; noise

  explicit CategoricalRow(int K_) : K(K_), Kp((K_ + L - 1) / L * L), a(Kp), e(Kp), lg(Kp), u(Kp) {
    const int last = Kp - L;
    for (int l = 0; l < L; ++l) {
      tail_mask[l] = last + l < K ? A(1) : A(0);
      tail_minf[l] = last + l < K ? A(0) : -INFINITY;
    }
  }

  static A hmax(V v) {
    A m = v[0];
    for (int l = 1; l < L; ++l) m = v[l] > m ? v[l] : m;
    return m;
  }

  // Gumbel(0, 1) noise from uniform u clamped into [tiny, 1 - ulp/2]: -log(-log(u)), both logs of normal positive
  // numbers (Simd::log's domain).
  static V gumbel(V uv) {
    const A tiny = sizeof(A) == 4 ? A(1e-20) : A(1e-300);
    const A top = sizeof(A) == 4 ? A(1.0f - 5.9604645e-8f) : A(1.0 - 1.1102230246251565e-16);
    uv = uv < tiny ? V{} + tiny : uv;
    uv = uv > top ? V{} + top : uv;
    return -S::log(-S::log(uv));
  }

  // max over the row's K entries of src (padded to Kp)
  A row_max(const A* src) const {
    V m = V{} - INFINITY;
    for (int q = 0; q < Kp; q += L) {
      const V v = S::load(src + q) + (q + L == Kp ? tail_minf : V{});
      m = v > m ? v : m;
    }
    return hmax(m);
  }

  // dst = exp(src - m) (0 in the lanes past K); returns its sum
  A exp_shifted(const A* src, A m, A* dst) const {
    V sum = {};
    for (int q = 0; q < Kp; q += L) {
      const V e = S::exp(S::load(src + q) - m) * (q + L == Kp ? tail_mask : V{} + A(1));
      S::store(dst + q, e);
      sum += e;
    }
    return S::sum(sum);
  }

  // The plain softmax's parts: loads the row's logits into lg, p = exp(l - lmax) into e; returns lmax and
  // log sum exp(l - lmax), the log of e's sum.
  template <typename T>
  void plain(const T* logits, A* lmax, A* lse) {
    for (int k = 0; k < K; ++k) lg[k] = A(logits[k]);
    for (int k = K; k < Kp; ++k) lg[k] = A(0);
    *lmax = row_max(lg.data());
    *lse = std::log(exp_shifted(lg.data(), *lmax, e.data()));
  }

  // plain(), then the soft sample y = softmax((l + s Gumbel(u)) / tau) into a (u: the row's noise, or none).
  template <typename T>
  void softmaxes(const T* logits, const T* uniform, A tau, A noise_scale, A* lmax, A* lse) {
    plain(logits, lmax, lse);
    if (uniform != nullptr) {
      for (int k = 0; k < K; ++k) u[k] = A(uniform[k]);
      for (int k = K; k < Kp; ++k) u[k] = A(0.5);
    }
    for (int q = 0; q < Kp; q += L) {
      const V lv = S::load(lg.data() + q);
      S::store(a.data() + q, (uniform != nullptr ? lv + noise_scale * gumbel(S::load(u.data() + q)) : lv) / tau);
    }
    const A inv = A(1) / exp_shifted(a.data(), row_max(a.data()), a.data());
    for (int q = 0; q < Kp; q += L) S::store(a.data() + q, S::load(a.data() + q) * inv);
  }
};

// Forward over R = N d rows of K categories: z (R), y (R K), kl (R); row r uses codebook row (G == 1 ? 0 : r % d).
template <typename T>
void categorical_forward_kernel(const T* logits, const T* uniform, const T* values, int64_t R, int64_t d, int64_t G,
                                int64_t K, double tau, double noise_scale, bool hard, T* z, T* y, T* kl) {
  using A = typename acc_type<T>::type;
  using Row = CategoricalRow<A>;
  using S = typename Row::S;
  using V = typename Row::V;
  constexpr int L = Row::L;
  const A log_k = std::log(A(K));
  torch::stable::parallel_for(0, R, std::max<int64_t>(1, 8192 / K), [&](int64_t r0, int64_t r1) {
    Row w(static_cast<int>(K));
    std::vector<A> vals(w.Kp, A(0));
    for (int64_t r = r0; r < r1; ++r) {
      A lm, lse;
      w.softmaxes(logits + r * K, uniform ? uniform + r * K : nullptr, A(tau), A(noise_scale), &lm, &lse);
      const T* v = values + (G == 1 ? 0 : r % d) * K;
      for (int64_t k = 0; k < K; ++k) vals[k] = A(v[k]);
      T* yr = y + r * K;
      if (hard) {
        int64_t am = 0;
        for (int64_t k = 1; k < K; ++k) am = w.a[k] > w.a[am] ? k : am;
        for (int64_t k = 0; k < K; ++k) yr[k] = T(k == am ? 1 : 0);
        z[r] = T(vals[am]);
      } else {
        V zs = {};
        for (int q = 0; q < w.Kp; q += L) zs += S::load(w.a.data() + q) * S::load(vals.data() + q);
        for (int64_t k = 0; k < K; ++k) yr[k] = T(w.a[k]);
        z[r] = T(S::sum(zs));
      }
      // KL: sum p (log p + log K), p = e / sum e, log p = l - lm - lse (padding lanes: p = 0)
      const A inv = A(std::exp(-lse));
      V acc = {};
      for (int q = 0; q < w.Kp; q += L) {
        const V p = S::load(w.e.data() + q) * inv;
        acc += p * (S::load(w.lg.data() + q) - (lm + lse - log_k));
      }
      kl[r] = T(S::sum(acc));
    }
  });
}

// Backward over the same rows: grad_logits (R K) and, per chunk c of `rows` rows, part[c G K + g K + k] =
// sum over the chunk's rows of latent g of grad_z y_out (y_out: the forward's y, one-hot when hard). The gradient
// reaching the soft sample y is g_y + g_z v (a hard sample is straight-through). A row of y_out that is not one-hot
// is the soft sample itself (the forward wrote it from these very buffers: the same bits as a recomputation); a
// one-hot row (hard, or a soft sample that rounded to one) is recomputed, its Gumbel noise included.
template <typename T>
void categorical_backward_kernel(const T* logits, const T* uniform, const T* values, const T* y_out, const T* g_z,
                                 const T* g_y, const T* g_kl, int64_t R, int64_t d, int64_t G, int64_t K,
                                 double tau, double noise_scale, int64_t rows, T* grad_logits, double* part) {
  using A = typename acc_type<T>::type;
  using Row = CategoricalRow<A>;
  using S = typename Row::S;
  using V = typename Row::V;
  constexpr int L = Row::L;
  const int64_t n_chunks = (R + rows - 1) / rows;
  torch::stable::parallel_for(0, n_chunks, std::max<int64_t>(1, 8192 / (rows * K)), [&](int64_t c0, int64_t c1) {
    Row w(static_cast<int>(K));
    std::vector<A> gy(w.Kp, A(0));
    for (int64_t c = c0; c < c1; ++c) {
      double* pc = part + c * G * K;
      for (int64_t r = c * rows; r < std::min(R, (c + 1) * rows); ++r) {
        A lm, lse;
        const T* yo = y_out + r * K;
        int64_t ones = 0, zeros = 0;
        for (int64_t k = 0; k < K; ++k) {
          ones += yo[k] == T(1);
          zeros += yo[k] == T(0);
        }
        if (ones == 1 && zeros == K - 1) {
          w.softmaxes(logits + r * K, uniform ? uniform + r * K : nullptr, A(tau), A(noise_scale), &lm, &lse);
        } else {
          w.plain(logits + r * K, &lm, &lse);
          for (int64_t k = 0; k < K; ++k) w.a[k] = A(yo[k]);
          for (int64_t k = K; k < w.Kp; ++k) w.a[k] = A(0);
        }
        const int64_t g = G == 1 ? 0 : r % d;
        const T* v = values + g * K;
        const A gz = A(g_z[r]), gk = A(g_kl[r]);
        for (int64_t k = 0; k < K; ++k) gy[k] = A(g_y[r * K + k]) + gz * A(v[k]);
        // dot = sum y gy, ent = sum p log p; d/dl_k: y_k (gy_k - dot) / tau + g_kl p_k (log p_k - ent)
        const A inv = A(std::exp(-lse)), c = lm + lse;
        V dot = {}, ent = {};
        for (int q = 0; q < w.Kp; q += L) {
          const V p = S::load(w.e.data() + q) * inv;
          dot += S::load(w.a.data() + q) * S::load(gy.data() + q);
          ent += p * (S::load(w.lg.data() + q) - c);
        }
        const A dt = S::sum(dot), en = S::sum(ent);
        T* out = grad_logits + r * K;
        for (int q = 0; q < w.Kp; q += L) {
          const V p = S::load(w.e.data() + q) * inv;
          const V gl = S::load(w.a.data() + q) * (S::load(gy.data() + q) - dt) / A(tau) +
                       gk * p * (S::load(w.lg.data() + q) - c - en);
          S::store(w.e.data() + q, gl);
        }
        for (int64_t k = 0; k < K; ++k) out[k] = T(w.e[k]);
        double* pg = pc + g * K;
        for (int64_t k = 0; k < K; ++k) pg[k] += double(g_z[r]) * double(yo[k]);
      }
    }
  });
}
