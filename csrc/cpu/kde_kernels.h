// CPU kernels of the KDE hot path, compiled once per instruction set: csrc/cpu/kde.cpp includes
// this file twice, into namespaces isa_base (baseline x86-64) and isa_avx (AVX+FMA), and picks one
// at run time (csrc/cpu/isa.h); no include guard on purpose. Math shared with CUDA:
// csrc/include/qkernels/kde.h. Hot loops use 32-byte GCC vectors (Simd, csrc/cpu/simd.h) with a vector exp and
// log, so that they do not depend on what the auto-vectorizer makes of them.
//
// Memory: no (d, K, n), (d, M, n), (d, d, M, K) or (n, n) tensor is formed. Cliff keeps a table
// of the windowed derivative-kernel values of every (sample, latent) (n d W_k values, W_k =
// min(K, 2 window / grid spacing + 4); twice that in backward), per running task one K x M
// accumulator (two in backward) and the windowed kernel values of its conditioning latent
// (<= n M), and in backward d x d x n gradient partials. KLM: T <= 16 partial sums per sample
// and latent (T n (d + 1) values) plus per-task tiles.
//
// Determinism: every output element and every reduction is owned by one task and summed in a
// fixed order, so results do not depend on the number of threads.

#include "simd.h"  // Simd<A>: 32-byte vectors with exp and log (no include guard either)

template <typename A>
void sort_with_index(const A* v, int64_t n, std::vector<A>& sorted, std::vector<int64_t>& perm) {
  perm.resize(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return v[a] < v[b]; });
  sorted.resize(n);
  for (int64_t s = 0; s < n; ++s) sorted[s] = v[perm[s]];
}

// [lo, hi): indices of sorted[] within [c - w, c + w].
template <typename A>
void value_window(const A* sorted, int64_t n, A c, A w, int64_t* lo, int64_t* hi) {
  *lo = lower_index(sorted, static_cast<int>(n), A(c - w));
  int64_t h = lower_index(sorted, static_cast<int>(n), A(c + w));
  while (h < n && sorted[h] <= c + w) ++h;
  *hi = h;
}

// ============================================================================ kde_grid

template <typename T>
void kde_grid_kernel(const T* pts, const T* smp, int64_t n, int64_t d, int64_t K, double sigma, bool deriv,
                     T* out, const T* grad, T* gpts, T* gsmp) {
  using A = typename acc_type<T>::type;
  const A sg = A(sigma), w = A(kWindow * sigma);
  const A scale = A(1.0 / (double(n) * sigma * kSqrt2Pi * (deriv ? sigma : 1.0)));
  parallel_for(0, d, 1, [&](int64_t j0, int64_t j1) {
    std::vector<A> col(n), sorted, gs;
    std::vector<int64_t> perm;
    for (int64_t j = j0; j < j1; ++j) {
      for (int64_t s = 0; s < n; ++s) col[s] = A(smp[s * d + j]);
      sort_with_index(col.data(), n, sorted, perm);
      if (grad != nullptr) gs.assign(n, A(0));
      for (int64_t k = 0; k < K; ++k) {
        const A p = A(pts[j * K + k]);
        int64_t lo, hi;
        value_window(sorted.data(), n, p, w, &lo, &hi);
        const A g = grad != nullptr ? A(grad[j * K + k]) * scale : A(0);
        A acc = 0, gacc = 0;
        for (int64_t s = lo; s < hi; ++s) {
          const A u = (p - sorted[s]) / sg;
          const A e = qk_exp(A(-0.5) * u * u);
          acc += deriv ? -u * e : e;
          if (grad != nullptr) {
            // d/dp of the term (d/dx = -d/dp)
            const A dp = deriv ? -(A(1) - u * u) * e / sg : -u * e / sg;
            gacc += dp;
            gs[s] -= g * dp;
          }
        }
        if (out != nullptr) out[j * K + k] = T(acc * scale);
        if (grad != nullptr) gpts[j * K + k] = T(g * gacc);
      }
      if (grad != nullptr)
        for (int64_t s = 0; s < n; ++s) gsmp[perm[s] * d + j] = T(gs[s]);
    }
  });
}

// ============================================================================ cliff_terms

// Windowed derivative-kernel values of every (latent i, sample s) on the grid:
// k0[i n + s], cnt[..], val[(i n + s) W + kk] = D(u) = -u exp(-u^2/2), u = (t_k - x) / sigma,
// and (backward) dval = dD/dx = (1 - u^2) exp(-u^2/2) / sigma, for k = k0 + kk.
template <typename A>
struct GridTable {
  int64_t W = 0;
  std::vector<int> k0, cnt;
  std::vector<int64_t> kr0, kr1;  // per latent: the grid rows [kr0, kr1) any sample's window touches
  std::vector<A> val, dval;
};

template <typename A>
GridTable<A> grid_table(const A* xt, int64_t n, int64_t d, const A* t, int64_t K, A sigma, bool backward) {
  GridTable<A> tab;
  const A t0 = t[0], dt = (t[K - 1] - t[0]) / A(K - 1);
  const double window = window_sigmas<A>();
  tab.W = std::min<int64_t>(K, static_cast<int64_t>(2.0 * window * double(sigma) / double(dt)) + 4);
  tab.k0.resize(n * d);
  tab.cnt.resize(n * d);
  tab.val.assign(n * d * tab.W, A(0));
  if (backward) tab.dval.assign(n * d * tab.W, A(0));
  parallel_for(0, n * d, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const A x = xt[r];
      int k0, k1;
      grid_window(x, t0, dt, static_cast<int>(K), sigma, &k0, &k1, window);
      k1 = std::min<int>(k1, k0 + static_cast<int>(tab.W));
      tab.k0[r] = k0;
      tab.cnt[r] = std::max(0, k1 - k0);
      A* v = tab.val.data() + r * tab.W;
      A* dv = backward ? tab.dval.data() + r * tab.W : nullptr;
      for (int k = k0; k < k1; ++k) {
        const A u = (t[k] - x) / sigma;
        const A e = vexp(A(-0.5) * u * u);
        v[k - k0] = -u * e;
        if (dv) dv[k - k0] = (A(1) - u * u) * e / sigma;
      }
    }
  });
  tab.kr0.assign(d, K);
  tab.kr1.assign(d, 0);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t s = 0; s < n; ++s) {
      const int64_t r = i * n + s;
      if (tab.cnt[r] == 0) continue;
      tab.kr0[i] = std::min<int64_t>(tab.kr0[i], tab.k0[r]);
      tab.kr1[i] = std::max<int64_t>(tab.kr1[i], tab.k0[r] + tab.cnt[r]);
    }
  for (int64_t i = 0; i < d; ++i) tab.kr1[i] = std::max(tab.kr1[i], tab.kr0[i]);
  return tab;
}

// Kernel values of one conditioning latent j at its M sorted conditioning values, per sample s:
// the window of zeta values within window_sigmas of x_sj, widened to whole vectors of L:
// m0[s] (a multiple of L), nv[s] vectors, val[off[s] + mm] = N(w) = exp(-w^2/2),
// w = (zeta_{m0 + mm} - x_sj) / sigma; 0 for the padding m >= M. (The backward's dN/dx_sj =
// w N(w) / sigma is recomputed from val, not stored: the table is the kernel's largest buffer.)
template <typename A>
struct CondTable {
  std::vector<int64_t> m0, nv, off;
  std::vector<A> val;
};

template <typename A>
void cond_table(const A* xj, int64_t n, const A* zeta, int64_t M, A sigma, CondTable<A>& tab) {
  constexpr int L = Simd<A>::L;
  tab.m0.resize(n);
  tab.nv.resize(n);
  tab.off.resize(n + 1);
  const A w = A(window_sigmas<A>() * double(sigma));
  parallel_for(0, n, 256, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      int64_t lo, hi;
      value_window(zeta, M, xj[s], w, &lo, &hi);
      tab.m0[s] = lo / L * L;
      tab.nv[s] = hi > lo ? (hi - tab.m0[s] + L - 1) / L : 0;
    }
  });
  tab.off[0] = 0;
  for (int64_t s = 0; s < n; ++s) tab.off[s + 1] = tab.off[s] + tab.nv[s] * L;
  tab.val.resize(tab.off[n]);
  parallel_for(0, n, 256, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      for (int64_t mm = 0; mm < tab.nv[s] * L; ++mm) {
        const int64_t m = tab.m0[s] + mm;
        const A u = m < M ? (zeta[m] - xj[s]) / sigma : A(0);
        const A e = m < M ? vexp(A(-0.5) * u * u) : A(0);
        tab.val[tab.off[s] + mm] = e;
      }
    }
  });
}

// JSD of the M columns of a transposed accumulator GT (K rows of Mp; column m = conditioning
// value m), each normalized over k: H(mean_m p_m) - mean_m H(p_m). Workspaces: c, dot (Mp), mix (K).
// Backward (grad != nullptr): writes dLoss/dGT (K x Mp; padding columns 0) for dLoss/dJSD =
// g_loss, and skips the JSD itself (returns a meaningless value). Vectorized over m.
template <typename A>
A jsd_rows(const A* GT, int64_t M, int64_t Mp, int64_t K, A step, A* c, A* dot, A* mix, A g_loss, A* grad) {
  using S = Simd<A>;
  using V = typename S::V;
  constexpr int L = S::L;
  for (int64_t m = 0; m < Mp; ++m) c[m] = A(0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < Mp; m += L) S::store(c + m, S::load(c + m) + S::abs(S::load(GT + k * Mp + m)));
  for (int64_t m = 0; m < Mp; ++m) c[m] = m < M && c[m] > A(0) ? A(1) / (step * c[m]) : A(0);  // 1 / norm
  const A invM = A(1) / A(M);
  V h_each = {};
  A h_mix = 0;
  for (int64_t k = 0; k < K; ++k) {
    V mk = {};
    for (int64_t m = 0; m < Mp; m += L) {  // padding columns: c = 0, p = 0
      const V p = S::abs(S::load(GT + k * Mp + m)) * S::load(c + m);
      if (grad == nullptr) h_each += S::xlogx(p);
      mk += p;
    }
    mix[k] = S::sum(mk) * invM;
    h_mix += xlogx(mix[k]);
  }
  if (grad != nullptr) {  // the backward needs the gradient only (the JSD returned is not valid)
    // dLoss/dp[k, m] = s (dxlogx(p) - dxlogx(mix_k)), then through p = |g| / norm (column_backward);
    // a column with norm 0 (c = 0: all-zero or padding) gets 0
    const A s = g_loss * step * invM;
    std::fill(dot, dot + Mp, A(0));
    for (int64_t k = 0; k < K; ++k) {
      const A dm = dxlogx(mix[k]);
      for (int64_t m = 0; m < Mp; m += L) {
        const V p = S::abs(S::load(GT + k * Mp + m)) * S::load(c + m);
        const V gr = s * (S::dxlogx(p) - dm);
        S::store(grad + k * Mp + m, gr);
        S::store(dot + m, S::load(dot + m) + gr * p);
      }
    }
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t m = 0; m < Mp; m += L) {
        const V g = S::load(GT + k * Mp + m);
        const V sgn = (g > A(0) ? V{} + A(1) : V{}) - (g < A(0) ? V{} + A(1) : V{});
        const V gr = S::load(grad + k * Mp + m);
        S::store(grad + k * Mp + m, sgn * (gr - step * S::load(dot + m)) * S::load(c + m));
      }
    }
  }
  return -step * h_mix + step * S::sum(h_each) * invM;
}

// Forward (grad_x == nullptr) or backward of the three Cliff terms.
template <typename T>
void cliff_kernel(const T* x, int64_t n, int64_t d, const T* grid, int64_t K, const T* vpts, int64_t Ku,
                  const int64_t* cond, int64_t M, double sigma_, double step_, double g_uni, double g_biv,
                  double g_kl, std::vector<double>* terms, T* grad_x) {
  using A = typename acc_type<T>::type;
  using S = Simd<A>;
  using V = typename S::V;
  constexpr int L = S::L;
  const bool bwd = grad_x != nullptr;
  const A sigma = A(sigma_), step = A(step_), inv_sigma = A(1) / sigma;
  std::vector<A> xt(n * d), t(K), v(Ku);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < d; ++j) xt[j * n + s] = A(x[s * d + j]);
  for (int64_t k = 0; k < K; ++k) t[k] = A(grid[k]);
  for (int64_t k = 0; k < Ku; ++k) v[k] = A(vpts[k]);
  const GridTable<A> tab = grid_table(xt.data(), n, d, t.data(), K, sigma, bwd);
  const int64_t W = tab.W;
  std::vector<A> gx(bwd ? n * d : 0, A(0));  // (d, n): gradient of x, latent-major
  std::vector<double> uni(d, 0.0), kl(d, 0.0), biv(d * d, 0.0);

  // ---- univariate entropy and KL-uni, one task per latent (owns gx[i, :])
  parallel_for(0, d, 1, [&](int64_t i0, int64_t i1) {
    std::vector<A> G(K), gG(K), sorted, terms(n + L);
    std::vector<int64_t> perm;
    for (int64_t i = i0; i < i1; ++i) {
      std::fill(G.begin(), G.end(), A(0));
      for (int64_t s = 0; s < n; ++s) {
        const int64_t r = i * n + s;
        const A* dv = tab.val.data() + r * W;
        A* g = G.data() + tab.k0[r];
        for (int kk = 0; kk < tab.cnt[r]; ++kk) g[kk] += dv[kk];
      }
      uni[i] = uni_entropy(G.data(), static_cast<int>(K), step, A(g_uni), bwd ? gG.data() : nullptr);
      A* gxi = bwd ? gx.data() + i * n : nullptr;
      if (bwd) {
        for (int64_t s = 0; s < n; ++s) {
          const int64_t r = i * n + s;
          const A* ddv = tab.dval.data() + r * W;
          const A* g = gG.data() + tab.k0[r];
          A acc = 0;
          for (int kk = 0; kk < tab.cnt[r]; ++kk) acc += g[kk] * ddv[kk];
          gxi[s] += acc;
        }
      }
      // KL-uni: log p(v_k) as a log-sum-exp around the nearest sample
      sort_with_index(xt.data() + i * n, n, sorted, perm);
      const A inv2s2 = A(0.5) / (sigma * sigma);
      double acc_logp = 0.0;
      const A gk = A(-g_kl / double(Ku));
      for (int64_t k = 0; k < Ku; ++k) {
        const A vk = v[k];
        const int64_t pos = lower_index(sorted.data(), static_cast<int>(n), vk);
        A emin = INFINITY;
        if (pos < n) emin = std::min(emin, (vk - sorted[pos]) * (vk - sorted[pos]) * inv2s2);
        if (pos > 0) emin = std::min(emin, (vk - sorted[pos - 1]) * (vk - sorted[pos - 1]) * inv2s2);
        int64_t lo = pos, hi = pos;
        while (lo > 0 && (vk - sorted[lo - 1]) * (vk - sorted[lo - 1]) * inv2s2 - emin <= A(kLseWindow)) --lo;
        while (hi < n && (vk - sorted[hi]) * (vk - sorted[hi]) * inv2s2 - emin <= A(kLseWindow)) ++hi;
        // terms exp(emin - (v_k - x_s)^2 / (2 sigma^2)) of the window, vectorized; lanes past hi
        // are masked to 0
        A* e = terms.data();
        V vsum = {};
        for (int64_t s = lo; s < hi; s += L) {
          V u = {};
          for (int l = 0; l < L; ++l) u[l] = s + l < hi ? vk - sorted[s + l] : A(0);
          V ev = S::exp(emin - u * u * inv2s2);
          for (int l = 0; l < L; ++l) ev[l] = s + l < hi ? ev[l] : A(0);
          vsum += ev;
          S::store(e + (s - lo), ev);
        }
        const A sum = S::sum(vsum);
        acc_logp += double(-emin + qk_log(sum));
        if (bwd) {
          const A c = gk / (sum * sigma * sigma);
          for (int64_t s = lo; s < hi; ++s) gxi[perm[s]] += c * e[s - lo] * (vk - sorted[s]);
        }
      }
      const double log_norm = std::log(double(n) * double(sigma) * kSqrt2Pi);
      kl[i] = -std::log(2.0 * std::sqrt(3.0)) - (acc_logp / double(Ku) - log_norm);
    }
  });

  // ---- bivariate JSD: the conditioning latents j in G fixed groups (one task each), looping over
  // the differentiated i. GT[k, m] = sum_s D(t_k - x_si) N(zeta_m - x_sj) over each sample's
  // (k, m) window, as rank-1 updates vectorized over m (Mp = M rounded up to whole vectors); the
  // backward contracts dLoss/dGT with the same windows. Group g writes its gradient
  // contributions to its own slice gpart[g] (d x n), summed over g in order afterwards: the
  // groups do not depend on the number of threads.
  if (d >= 2) {
    const int64_t Mp = (M + L - 1) / L * L, groups = std::min<int64_t>(d, 16);
    std::vector<A> gpart(bwd ? groups * d * n : 0, A(0));
    parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      std::vector<A> zeta(M), zraw(M), zpad(Mp, A(0)), GT(K * Mp), gGT(bwd ? K * Mp : 0);
      std::vector<A> cn(Mp), dot(Mp), mix(K), gz(Mp);
      std::vector<int64_t> zrow(M), zperm;
      CondTable<A> ct;
      for (int64_t j = g0 * d / groups; j < g1 * d / groups; ++j) {
        // group of j: the g with g d / groups <= j < (g + 1) d / groups; its slice of gpart
        int64_t g = j * groups / d;
        while ((g + 1) * d / groups <= j) ++g;
        while (g * d / groups > j) --g;
        A* part = bwd ? gpart.data() + g * d * n : nullptr;
        // sorted conditioning values of latent j (their order does not change the JSD)
        for (int64_t m = 0; m < M; ++m) zraw[m] = xt[j * n + cond[j * M + m]];
        sort_with_index(zraw.data(), M, zeta, zperm);
        for (int64_t m = 0; m < M; ++m) zrow[m] = cond[j * M + zperm[m]];
        cond_table(xt.data() + j * n, n, zeta.data(), M, sigma, ct);
        std::copy(zeta.begin(), zeta.end(), zpad.begin());
        A* gj = bwd ? part + j * n : nullptr;  // contributions to x_j
        std::fill(gz.begin(), gz.end(), A(0));  // ... and to its conditioning values
        for (int64_t i = 0; i < d; ++i) {
          if (i == j) continue;
          // only grid rows [kr0, kr1) of latent i can be non-zero: the JSD of the others is 0
          const int64_t kr0 = tab.kr0[i], nk = tab.kr1[i] - kr0;
          std::fill(GT.begin() + kr0 * Mp, GT.begin() + (kr0 + nk) * Mp, A(0));
          for (int64_t s = 0; s < n; ++s) {
            const int64_t r = i * n + s, c = tab.cnt[r];
            const A* dv = tab.val.data() + r * W;
            const A* nv = ct.val.data() + ct.off[s];
            A* g0 = GT.data() + tab.k0[r] * Mp + ct.m0[s];
            for (int64_t q = 0; q < ct.nv[s]; ++q) {
              const V e = S::load(nv + q * L);
              A* g = g0 + q * L;
              for (int64_t kk = 0; kk < c; ++kk) S::store(g + kk * Mp, S::load(g + kk * Mp) + e * dv[kk]);
            }
          }
          const A h = jsd_rows(GT.data() + kr0 * Mp, M, Mp, nk, step, cn.data(), dot.data(), mix.data(), A(g_biv),
                               bwd ? gGT.data() + kr0 * Mp : nullptr);
          if (!bwd) {
            biv[i * d + j] = double(h);
            continue;
          }
          A* gi = part + i * n;
          for (int64_t s = 0; s < n; ++s) {
            const int64_t r = i * n + s, c = tab.cnt[r];
            const A* dv = tab.val.data() + r * W;
            const A* ddv = tab.dval.data() + r * W;
            const A* nv = ct.val.data() + ct.off[s];
            const A xs = xt[j * n + s];
            const A* g0 = gGT.data() + tab.k0[r] * Mp + ct.m0[s];
            V acc_i = {}, acc_j = {};
            for (int64_t q = 0; q < ct.nv[s]; ++q) {
              const A* g = g0 + q * L;
              V a = {}, b = {};  // sum_k dLoss/dGT[k, m] D_k, and with dD_k/dx
              for (int64_t kk = 0; kk < c; ++kk) {
                const V gk = S::load(g + kk * Mp);
                a += dv[kk] * gk;
                b += ddv[kk] * gk;
              }
              const V e = S::load(nv + q * L);
              acc_i += e * b;
              const V w = (S::load(zpad.data() + ct.m0[s] + q * L) - xs) * inv_sigma;
              const V tj = w * e * inv_sigma * a;  // dN/dx_sj = w N(w) / sigma
              acc_j += tj;
              A* gzq = gz.data() + ct.m0[s] + q * L;
              S::store(gzq, S::load(gzq) - tj);
            }
            gi[s] += S::sum(acc_i);
            gj[s] += S::sum(acc_j);
          }
        }
        if (bwd)
          for (int64_t m = 0; m < M; ++m) gj[zrow[m]] += gz[m];
      }
    });
    if (bwd) {
      parallel_for(0, d, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t g0 = 0; g0 < groups; ++g0) {
            const A* g = gpart.data() + (g0 * d + i) * n;
            A* gxi = gx.data() + i * n;
            for (int64_t s = 0; s < n; ++s) gxi[s] += g[s];
          }
      });
    }
  }
  if (bwd) {
    for (int64_t s = 0; s < n; ++s)
      for (int64_t j = 0; j < d; ++j) grad_x[s * d + j] = T(gx[j * n + s]);
  } else {
    double su = 0.0, sb = 0.0, sk = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      su += uni[i];
      sk += kl[i];
      for (int64_t j = 0; j < d; ++j) sb += biv[i * d + j];
    }
    *terms = {su, sb, sk};
  }
}

// ============================================================================ klm

// KLM over symmetric tiles. Every pair term is symmetric in (a, b) (exp of a squared difference;
// the backward's weights times the antisymmetric y_b - y_a), so the n x n pairs are walked as
// the T (T + 1) / 2 tiles I <= J of T row blocks of B samples, each exp computed once: a tile adds
// its row sums to rows b in I and (I < J) its column sums to rows a in J. Each tile writes its
// partial sums to its own slot part[(other block) * n + row], summed over blocks in a fixed order
// afterwards: deterministic for any number of threads; memory T * n * (d + 1) with T <= 16.

struct Tiles {
  int64_t B, T;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (I, J), I <= J
};

template <typename A>
Tiles klm_tiles(int64_t n) {
  constexpr int64_t L = Simd<A>::L;
  Tiles t;
  t.B = std::max<int64_t>(64, ((n + 15) / 16 + L - 1) / L * L);
  t.T = (n + t.B - 1) / t.B;
  for (int64_t I = 0; I < t.T; ++I)
    for (int64_t J = I; J < t.T; ++J) t.pairs.emplace_back(I, J);
  return t;
}

// Runs body(I, J) for every tile pair, one task each.
template <typename F>
void for_each_tile(const Tiles& tl, F&& body) {
  parallel_for(0, int64_t(tl.pairs.size()), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) body(tl.pairs[p].first, tl.pairs[p].second);
  });
}

// Column sums col[e * B + aa] of a tile (I, J) to the partials of rows a0 + aa: part[(I * Np + a0 +
// aa) * w + e].
template <typename A>
void store_columns(const std::vector<A>& col, int64_t I, int64_t a0, int64_t B, int64_t Np, int64_t w, A* part) {
  for (int64_t aa = 0; aa < B; ++aa)
    for (int64_t e = 0; e < w; ++e) part[(I * Np + a0 + aa) * w + e] = col[e * B + aa];
}

// y^T (d, Np) = (z / std)^T, Np = n rounded up to whole tiles (padding 0), and valid[a] = 1
// for real samples, 0 for padding.
template <typename T, typename A>
std::vector<A> scaled_transpose(const T* z, const T* std, int64_t n, int64_t d, int64_t Np, std::vector<A>& valid) {
  std::vector<A> yt(Np * d, A(0));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < d; ++j) yt[j * Np + s] = A(z[s * d + j]) / A(std[j]);
  valid.assign(Np, A(0));
  std::fill(valid.begin(), valid.begin() + n, A(1));
  return yt;
}

// Forward: lse[b, 0] = log sum_a exp(-|y_b - y_a|^2 / (2 f^2)), lse[b, 1 + j] = log sum_a
// exp(-(y_bj - y_aj)^2 / 2). Every exponent is <= 0 and the a = b term is exp(0) = 1, so the sums
// lie in [1, n]: no running maximum is needed (terms that underflow are < 1e-38 of the sum).
template <typename T>
double klm_forward_kernel(const T* z, const T* std, int64_t n, int64_t d, T* lse) {
  using A = typename acc_type<T>::type;
  using S = Simd<A>;
  using V = typename S::V;
  constexpr int64_t L = S::L;
  const Tiles tl = klm_tiles<A>(n);
  const int64_t B = tl.B, Np = tl.T * B, w = d + 1;
  std::vector<A> valid;
  const std::vector<A> yt = scaled_transpose<T, A>(z, std, n, d, Np, valid);
  const double f = silverman_factor(double(n), double(d));
  const A c_joint = A(-0.5 / (f * f));
  std::vector<A> part(tl.T * Np * w, A(0));  // part[(K * Np + row) * w + e]: block K's sums of row
  for_each_tile(tl, [&](int64_t I, int64_t J) {
    std::vector<A> sq(B), col(B * w, A(0));
    const int64_t b0 = I * B, a0 = J * B;
    const bool mirror = I != J;
    for (int64_t b = b0; b < b0 + B; ++b) {
      std::fill(sq.begin(), sq.end(), A(0));
      A* row = part.data() + (J * Np + b) * w;
      for (int64_t j = 0; j < d; ++j) {
        const A yb = yt[j * Np + b];
        const A* ya = yt.data() + j * Np + a0;
        A* cj = col.data() + (1 + j) * B;
        V acc = {};
        for (int64_t aa = 0; aa < B; aa += L) {
          const V dd = yb - S::load(ya + aa);
          const V q = dd * dd;
          S::store(sq.data() + aa, S::load(sq.data() + aa) + q);
          const V e = S::exp(A(-0.5) * q) * S::load(valid.data() + a0 + aa);
          acc += e;
          if (mirror) S::store(cj + aa, S::load(cj + aa) + e);
        }
        row[1 + j] = S::sum(acc);
      }
      V acc = {};
      for (int64_t aa = 0; aa < B; aa += L) {
        const V e = S::exp(c_joint * S::load(sq.data() + aa)) * S::load(valid.data() + a0 + aa);
        acc += e;
        if (mirror) S::store(col.data() + aa, S::load(col.data() + aa) + e);
      }
      row[0] = S::sum(acc);
    }
    if (mirror) store_columns(col, I, a0, B, Np, w, part.data());
  });
  std::vector<double> rows(n);
  parallel_for(0, n, 64, [&](int64_t s0, int64_t s1) {
    for (int64_t b = s0; b < s1; ++b) {
      double r = 0.0;
      for (int64_t e = 0; e < w; ++e) {
        A sum = 0;
        for (int64_t K = 0; K < tl.T; ++K) sum += part[(K * Np + b) * w + e];
        const A l = qk_log(sum);
        lse[b * w + e] = T(l);
        r += e == 0 ? double(l) : -double(l);
      }
      rows[b] = r;
    }
  });
  double total = 0.0;
  for (int64_t b = 0; b < n; ++b) total += rows[b];
  return total / double(n) + double(d - 1) * std::log(double(n)) - double(d) * std::log(f);
}

// Backward: with P_ba = exp(J_ba - L_b) (joint softmax of row b) and Pj_ba likewise per latent,
// dLoss/dy_bj = g / n * sum_a W_j[b, a] (y_bj - y_aj), W_j[b, a] = -(P_ba + P_ab) / f^2 + (Pj_ba +
// Pj_ab), symmetric in (a, b): a tile adds W (y_b - y_a) to row b and its negative to row a.
// Then z = y * std gives dz = dy / std and dstd_j = -sum_b dy_bj y_bj / std_j.
template <typename T>
void klm_backward_kernel(double g, const T* z, const T* std, const T* lse, int64_t n, int64_t d, T* gz, T* gstd) {
  using A = typename acc_type<T>::type;
  using S = Simd<A>;
  using V = typename S::V;
  constexpr int64_t L = S::L;
  const Tiles tl = klm_tiles<A>(n);
  const int64_t B = tl.B, Np = tl.T * B;
  std::vector<A> valid;
  const std::vector<A> yt = scaled_transpose<T, A>(z, std, n, d, Np, valid);
  const double f = silverman_factor(double(n), double(d));
  const A c_joint = A(-0.5 / (f * f)), inv_f2 = A(1.0 / (f * f));
  std::vector<A> el(Np, A(0)), elt(Np * d, A(0));  // exp(-lse); 0 for padding
  for (int64_t b = 0; b < n; ++b) {
    el[b] = qk_exp(-A(lse[b * (d + 1)]));
    for (int64_t j = 0; j < d; ++j) elt[j * Np + b] = qk_exp(-A(lse[b * (d + 1) + 1 + j]));
  }
  std::vector<A> part(tl.T * Np * d, A(0));  // part[(K * Np + row) * d + j]
  for_each_tile(tl, [&](int64_t I, int64_t J) {
    std::vector<A> sq(B), wj(B), col(B * d, A(0));
    const int64_t b0 = I * B, a0 = J * B;
    const bool mirror = I != J;
    for (int64_t b = b0; b < b0 + B; ++b) {
      std::fill(sq.begin(), sq.end(), A(0));
      for (int64_t j = 0; j < d; ++j) {
        const A yb = yt[j * Np + b];
        const A* ya = yt.data() + j * Np + a0;
        for (int64_t aa = 0; aa < B; aa += L) {
          const V dd = yb - S::load(ya + aa);
          S::store(sq.data() + aa, S::load(sq.data() + aa) + dd * dd);
        }
      }
      const A elb = el[b];
      for (int64_t aa = 0; aa < B; aa += L) {
        const V e = S::exp(c_joint * S::load(sq.data() + aa)) * S::load(valid.data() + a0 + aa);
        S::store(wj.data() + aa, -e * (elb + S::load(el.data() + a0 + aa)) * inv_f2);
      }
      A* row = part.data() + (J * Np + b) * d;
      for (int64_t j = 0; j < d; ++j) {
        const A yb = yt[j * Np + b], eb = elt[j * Np + b];
        const A* ya = yt.data() + j * Np + a0;
        const A* ea = elt.data() + j * Np + a0;
        A* cj = col.data() + j * B;
        V acc = {};
        for (int64_t aa = 0; aa < B; aa += L) {
          const V dd = yb - S::load(ya + aa);
          const V e = S::exp(A(-0.5) * dd * dd) * S::load(valid.data() + a0 + aa);
          const V t = (S::load(wj.data() + aa) + e * (eb + S::load(ea + aa))) * dd;
          acc += t;
          if (mirror) S::store(cj + aa, S::load(cj + aa) - t);
        }
        row[j] = S::sum(acc);
      }
    }
    if (mirror) store_columns(col, I, a0, B, Np, d, part.data());
  });
  const A scale = A(g / double(n));
  std::vector<A> gy(n * d);  // (n, d)
  parallel_for(0, n, 64, [&](int64_t s0, int64_t s1) {
    for (int64_t b = s0; b < s1; ++b)
      for (int64_t j = 0; j < d; ++j) {
        A sum = 0;
        for (int64_t K = 0; K < tl.T; ++K) sum += part[(K * Np + b) * d + j];
        gy[b * d + j] = sum * scale;
      }
  });
  for (int64_t j = 0; j < d; ++j) {
    double sj = 0.0;
    for (int64_t b = 0; b < n; ++b) {
      gz[b * d + j] = T(gy[b * d + j] / A(std[j]));
      sj += double(gy[b * d + j]) * double(yt[j * Np + b]);
    }
    gstd[j] = T(-sj / double(std[j]));
  }
}
