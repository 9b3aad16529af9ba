// CPU (OpenMP via at::parallel_for) kernels of the KDE hot path (schemas: csrc/schemas.cpp). Math
// lives in csrc/include/qkernels/kde.h, shared with csrc/cuda.
//
// Memory: no (d, K, n), (d, M, n), (d, d, M, K) or (n, n) tensor is formed. Cliff keeps one
// K x M accumulator per running pair task, a table of the windowed derivative-kernel values of
// every (sample, latent) (n * d * W_k, W_k = min(K, 2 * 10 sigma / grid spacing + 4) values;
// twice that in backward) and the windowed kernel values of one conditioning latent (<= n * M).
// KLM streams row blocks: O(n * d) plus per-thread blocks.
//
// Determinism: every output element and every reduction is owned by one task and summed in a
// fixed order, so results do not depend on the number of threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "qkernels/kde.h"
#include "qkernels/kde_checks.h"

namespace qkernels {
namespace {

using at::Tensor;

constexpr double kSqrt2Pi = 2.5066282746310002;

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
  at::parallel_for(0, d, 1, [&](int64_t j0, int64_t j1) {
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

Tensor kde_grid_cpu(const Tensor& points_, const Tensor& samples_, double sigma, bool derivative) {
  check_kde_grid(points_, samples_, sigma, "kde_grid");
  const Tensor points = points_.contiguous(), samples = samples_.contiguous();
  Tensor out = at::empty_like(points);
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "kde_grid_cpu", [&] {
    kde_grid_kernel<scalar_t>(points.data_ptr<scalar_t>(), samples.data_ptr<scalar_t>(), samples.size(0),
                              samples.size(1), points.size(1), sigma, derivative, out.data_ptr<scalar_t>(),
                              nullptr, nullptr, nullptr);
  });
  return out;
}

std::tuple<Tensor, Tensor> kde_grid_backward_cpu(const Tensor& grad_, const Tensor& points_, const Tensor& samples_,
                                                 double sigma, bool derivative) {
  check_kde_grid_backward(grad_, points_, samples_, sigma, "kde_grid_backward");
  const Tensor points = points_.contiguous(), samples = samples_.contiguous();
  const Tensor grad = grad_.to(points.scalar_type()).contiguous();
  Tensor gp = at::empty_like(points), gs = at::empty_like(samples);
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "kde_grid_backward_cpu", [&] {
    kde_grid_kernel<scalar_t>(points.data_ptr<scalar_t>(), samples.data_ptr<scalar_t>(), samples.size(0),
                              samples.size(1), points.size(1), sigma, derivative, nullptr,
                              grad.data_ptr<scalar_t>(), gp.data_ptr<scalar_t>(), gs.data_ptr<scalar_t>());
  });
  return {gp, gs};
}

// ============================================================================ cliff_terms


// Windowed derivative-kernel values of every (latent i, sample s) on the grid:
// k0[i n + s], cnt[..], val[(i n + s) W + kk] = D(u) = -u exp(-u^2/2), u = (t_k - x) / sigma,
// and (backward) dval = dD/dx = (1 - u^2) exp(-u^2/2) / sigma, for k = k0 + kk.
template <typename A>
struct GridTable {
  int64_t W = 0;
  std::vector<int> k0, cnt;
  std::vector<A> val, dval;
};

template <typename A>
GridTable<A> grid_table(const A* xt, int64_t n, int64_t d, const A* t, int64_t K, A sigma, bool backward) {
  GridTable<A> tab;
  const A t0 = t[0], dt = (t[K - 1] - t[0]) / A(K - 1);
  tab.W = std::min<int64_t>(K, static_cast<int64_t>(2.0 * kWindow * double(sigma) / double(dt)) + 4);
  tab.k0.resize(n * d);
  tab.cnt.resize(n * d);
  tab.val.assign(n * d * tab.W, A(0));
  if (backward) tab.dval.assign(n * d * tab.W, A(0));
  at::parallel_for(0, n * d, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const A x = xt[r];
      int k0, k1;
      grid_window(x, t0, dt, static_cast<int>(K), sigma, &k0, &k1);
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
  return tab;
}

// Forward (grad_x == nullptr) or backward of the three Cliff terms.
template <typename T>
void cliff_kernel(const T* x, int64_t n, int64_t d, const T* grid, int64_t K, const T* vpts, int64_t Ku,
                  const int64_t* cond, int64_t M, double sigma_, double step_, double g_uni, double g_biv,
                  double g_kl, std::vector<double>* terms, T* grad_x) {
  using A = typename acc_type<T>::type;
  const bool bwd = grad_x != nullptr;
  const A sigma = A(sigma_), step = A(step_);
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
  at::parallel_for(0, d, 1, [&](int64_t i0, int64_t i1) {
    std::vector<A> G(K), gG(K), sorted;
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
        A sum = 0;
        for (int64_t s = lo; s < hi; ++s) sum += qk_exp(emin - (vk - sorted[s]) * (vk - sorted[s]) * inv2s2);
        acc_logp += double(-emin + qk_log(sum));
        if (bwd) {
          for (int64_t s = lo; s < hi; ++s) {
            const A dv = vk - sorted[s];
            const A w = qk_exp(emin - dv * dv * inv2s2) / sum;
            gxi[perm[s]] += gk * w * dv / (sigma * sigma);
          }
        }
      }
      const double log_norm = std::log(double(n) * double(sigma) * kSqrt2Pi);
      kl[i] = -std::log(2.0 * std::sqrt(3.0)) - (acc_logp / double(Ku) - log_norm);
    }
  });

  // ---- bivariate JSD: for each conditioning latent j, one task per differentiated latent i
  if (d >= 2) {
    std::vector<A> jb(bwd ? d * n : 0), gzb(bwd ? d * M : 0);
    std::vector<A> zeta(M);
    std::vector<int64_t> zrow(M), zperm;
    std::vector<int64_t> m0(n), mc(n), off(n + 1);
    std::vector<A> nval, ndval;
    for (int64_t j = 0; j < d; ++j) {
      // sorted conditioning values of latent j (their order does not change the JSD)
      std::vector<A> zraw(M);
      for (int64_t m = 0; m < M; ++m) zraw[m] = xt[j * n + cond[j * M + m]];
      sort_with_index(zraw.data(), M, zeta, zperm);
      for (int64_t m = 0; m < M; ++m) zrow[m] = cond[j * M + zperm[m]];
      // windowed kernel table of latent j: N(w) = exp(-w^2/2), w = (zeta_m - x_sj) / sigma
      const A* xj = xt.data() + j * n;
      at::parallel_for(0, n, 256, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
          int64_t lo, hi;
          value_window(zeta.data(), M, xj[s], A(kWindow * sigma_), &lo, &hi);
          m0[s] = lo;
          mc[s] = hi - lo;
        }
      });
      off[0] = 0;
      for (int64_t s = 0; s < n; ++s) off[s + 1] = off[s] + mc[s];
      nval.resize(off[n]);
      if (bwd) ndval.resize(off[n]);
      at::parallel_for(0, n, 256, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
          for (int64_t mm = 0; mm < mc[s]; ++mm) {
            const A w = (zeta[m0[s] + mm] - xj[s]) / sigma;
            const A e = vexp(A(-0.5) * w * w);
            nval[off[s] + mm] = e;
            if (bwd) ndval[off[s] + mm] = w * e / sigma;  // dN/dx_sj (= -dN/dzeta_m)
          }
        }
      });
      if (bwd) {
        std::fill(jb.begin(), jb.end(), A(0));
        std::fill(gzb.begin(), gzb.end(), A(0));
      }
      at::parallel_for(0, d, 1, [&](int64_t i0, int64_t i1) {
        std::vector<A> G(M * K), gG(bwd ? M * K : 0), mix(K), av, bv;
        for (int64_t i = i0; i < i1; ++i) {
          if (i == j) continue;
          std::fill(G.begin(), G.end(), A(0));
          for (int64_t s = 0; s < n; ++s) {
            const int64_t r = i * n + s, c = tab.cnt[r];
            const A* dv = tab.val.data() + r * W;
            const A* nv = nval.data() + off[s];
            A* g0 = G.data() + m0[s] * K + tab.k0[r];
            for (int64_t mm = 0; mm < mc[s]; ++mm) {
              const A e = nv[mm];
              A* g = g0 + mm * K;
#pragma omp simd
              for (int64_t kk = 0; kk < c; ++kk) g[kk] += e * dv[kk];
            }
          }
          biv[i * d + j] = double(jsd_columns(G.data(), static_cast<int>(M), static_cast<int>(K), step, mix.data(),
                                              A(g_biv), bwd ? gG.data() : nullptr));
          if (!bwd) continue;
          A* gxi = gx.data() + i * n;
          A* jbi = jb.data() + i * n;
          A* gzi = gzb.data() + i * M;
          for (int64_t s = 0; s < n; ++s) {
            const int64_t r = i * n + s, c = tab.cnt[r];
            const A* dv = tab.val.data() + r * W;
            const A* ddv = tab.dval.data() + r * W;
            const A* nv = nval.data() + off[s];
            const A* ndv = ndval.data() + off[s];
            const A* g0 = gG.data() + m0[s] * K + tab.k0[r];
            A gi = 0, gj = 0;
            for (int64_t mm = 0; mm < mc[s]; ++mm) {
              const A* g = g0 + mm * K;
              A a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
              for (int64_t kk = 0; kk < c; ++kk) {
                a += g[kk] * dv[kk];
                b += g[kk] * ddv[kk];
              }
              gi += b * nv[mm];
              gj += a * ndv[mm];
              gzi[m0[s] + mm] -= a * ndv[mm];
            }
            gxi[s] += gi;
            jbi[s] += gj;
          }
        }
      });
      if (bwd) {
        A* gxj = gx.data() + j * n;
        for (int64_t i = 0; i < d; ++i) {
          for (int64_t s = 0; s < n; ++s) gxj[s] += jb[i * n + s];
          for (int64_t m = 0; m < M; ++m) gxj[zrow[m]] += gzb[i * M + m];
        }
      }
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

std::tuple<Tensor, Tensor, Tensor> cliff_terms_cpu(const Tensor& x_, const Tensor& grid_, const Tensor& uni_points_,
                                                   const Tensor& cond_, double sigma, double step) {
  check_cliff(x_, grid_, uni_points_, cond_, sigma, step, "cliff_terms");
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  std::vector<double> terms;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_terms_cpu", [&] {
    cliff_kernel<scalar_t>(x.data_ptr<scalar_t>(), x.size(0), x.size(1), grid.data_ptr<scalar_t>(), grid.size(0),
                           vp.data_ptr<scalar_t>(), vp.size(0), cond.data_ptr<int64_t>(), cond.size(1), sigma, step,
                           0.0, 0.0, 0.0, &terms, nullptr);
  });
  return {at::scalar_tensor(terms[0], x.options()), at::scalar_tensor(terms[1], x.options()),
          at::scalar_tensor(terms[2], x.options())};
}

Tensor cliff_terms_backward_cpu(const Tensor& g_uni, const Tensor& g_biv, const Tensor& g_kl, const Tensor& x_,
                                const Tensor& grid_, const Tensor& uni_points_, const Tensor& cond_, double sigma,
                                double step) {
  check_cliff_backward(g_uni, g_biv, g_kl, x_, grid_, uni_points_, cond_, sigma, step, "cliff_terms_backward");
  const Tensor x = x_.contiguous(), grid = grid_.contiguous(), vp = uni_points_.contiguous(), cond = cond_.contiguous();
  Tensor gx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cliff_terms_backward_cpu", [&] {
    cliff_kernel<scalar_t>(x.data_ptr<scalar_t>(), x.size(0), x.size(1), grid.data_ptr<scalar_t>(), grid.size(0),
                           vp.data_ptr<scalar_t>(), vp.size(0), cond.data_ptr<int64_t>(), cond.size(1), sigma, step,
                           g_uni.item<double>(), g_biv.item<double>(), g_kl.item<double>(), nullptr,
                           gx.data_ptr<scalar_t>());
  });
  return gx;
}

// ============================================================================ klm

constexpr int64_t kBlock = 256;  // samples a streamed per block


// y^T (d, n) = (z / std)^T
template <typename T, typename A>
std::vector<A> scaled_transpose(const T* z, const T* std, int64_t n, int64_t d) {
  std::vector<A> yt(n * d);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < d; ++j) yt[j * n + s] = A(z[s * d + j]) / A(std[j]);
  return yt;
}

// Forward: lse[b, 0] = log sum_a exp(-|y_b - y_a|^2 / (2 f^2)), lse[b, 1 + j] = log sum_a
// exp(-(y_bj - y_aj)^2 / 2). Every exponent is <= 0 and the a = b term is exp(0) = 1, so the sums
// lie in [1, n]: no running maximum is needed (terms that underflow are < 1e-38 of the sum).
template <typename T>
double klm_forward_kernel(const T* z, const T* std, int64_t n, int64_t d, T* lse) {
  using A = typename acc_type<T>::type;
  const std::vector<A> yt = scaled_transpose<T, A>(z, std, n, d);
  const double f = silverman_factor(double(n), double(d));
  const A c_joint = A(-0.5 / (f * f));
  std::vector<double> row(n);
  at::parallel_for(0, n, 16, [&](int64_t b0, int64_t b1) {
    std::vector<A> sq(kBlock), msum(d);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(msum.begin(), msum.end(), A(0));
      A jsum = 0;
      for (int64_t a0 = 0; a0 < n; a0 += kBlock) {
        const int64_t na = std::min(kBlock, n - a0);
        std::fill(sq.begin(), sq.begin() + na, A(0));
        for (int64_t j = 0; j < d; ++j) {
          const A yb = yt[j * n + b];
          const A* ya = yt.data() + j * n + a0;
          A acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t aa = 0; aa < na; ++aa) {
            const A dd = yb - ya[aa];
            const A q = dd * dd;
            sq[aa] += q;
            acc += vexp(A(-0.5) * q);
          }
          msum[j] += acc;
        }
        A acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t aa = 0; aa < na; ++aa) acc += vexp(c_joint * sq[aa]);
        jsum += acc;
      }
      const A lj = qk_log(jsum);
      lse[b * (d + 1)] = T(lj);
      double r = double(lj);
      for (int64_t j = 0; j < d; ++j) {
        const A lm = qk_log(msum[j]);
        lse[b * (d + 1) + 1 + j] = T(lm);
        r -= double(lm);
      }
      row[b] = r;
    }
  });
  double total = 0.0;
  for (int64_t b = 0; b < n; ++b) total += row[b];
  return total / double(n) + double(d - 1) * std::log(double(n)) - double(d) * std::log(f);
}

std::tuple<Tensor, Tensor> klm_cpu(const Tensor& z_, const Tensor& std_) {
  check_klm(z_, std_, "klm");
  const Tensor z = z_.contiguous(), std = std_.contiguous();
  const int64_t n = z.size(0), d = z.size(1);
  Tensor lse = at::empty({n, d + 1}, z.options());
  double loss = 0.0;
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "klm_cpu", [&] {
    loss = klm_forward_kernel<scalar_t>(z.data_ptr<scalar_t>(), std.data_ptr<scalar_t>(), n, d,
                                        lse.data_ptr<scalar_t>());
  });
  return {at::scalar_tensor(loss, z.options()), lse};
}

// Backward: with P_ba = exp(J_ba - L_b) (joint softmax of row b) and Pj_ba likewise per latent,
// dLoss/dy_bj = g / n * sum_a [ -(P_ba + P_ab) / f^2 + (Pj_ba + Pj_ab) ] (y_bj - y_aj); then
// z = y * std gives dz = dy / std and dstd_j = -sum_b dy_bj y_bj / std_j.
template <typename T>
void klm_backward_kernel(double g, const T* z, const T* std, const T* lse, int64_t n, int64_t d, T* gz, T* gstd) {
  using A = typename acc_type<T>::type;
  const std::vector<A> yt = scaled_transpose<T, A>(z, std, n, d);
  const double f = silverman_factor(double(n), double(d));
  const A c_joint = A(-0.5 / (f * f)), inv_f2 = A(1.0 / (f * f));
  std::vector<A> el(n), elt(n * d);  // exp(-lse)
  for (int64_t b = 0; b < n; ++b) {
    el[b] = qk_exp(-A(lse[b * (d + 1)]));
    for (int64_t j = 0; j < d; ++j) elt[j * n + b] = qk_exp(-A(lse[b * (d + 1) + 1 + j]));
  }
  std::vector<A> gy(n * d);  // (n, d)
  const A scale = A(g / double(n));
  at::parallel_for(0, n, 16, [&](int64_t b0, int64_t b1) {
    std::vector<A> sq(kBlock), wj(kBlock), acc(d);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t a0 = 0; a0 < n; a0 += kBlock) {
        const int64_t na = std::min(kBlock, n - a0);
        std::fill(sq.begin(), sq.begin() + na, A(0));
        for (int64_t j = 0; j < d; ++j) {
          const A yb = yt[j * n + b];
          const A* ya = yt.data() + j * n + a0;
#pragma omp simd
          for (int64_t aa = 0; aa < na; ++aa) {
            const A dd = yb - ya[aa];
            sq[aa] += dd * dd;
          }
        }
        const A elb = el[b];
        const A* ela = el.data() + a0;
#pragma omp simd
        for (int64_t aa = 0; aa < na; ++aa) wj[aa] = -vexp(c_joint * sq[aa]) * (elb + ela[aa]) * inv_f2;
        for (int64_t j = 0; j < d; ++j) {
          const A yb = yt[j * n + b], eb = elt[j * n + b];
          const A* ya = yt.data() + j * n + a0;
          const A* ea = elt.data() + j * n + a0;
          A s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t aa = 0; aa < na; ++aa) {
            const A dd = yb - ya[aa];
            s += (wj[aa] + vexp(A(-0.5) * dd * dd) * (eb + ea[aa])) * dd;
          }
          acc[j] += s;
        }
      }
      for (int64_t j = 0; j < d; ++j) gy[b * d + j] = acc[j] * scale;
    }
  });
  for (int64_t j = 0; j < d; ++j) {
    double sj = 0.0;
    for (int64_t b = 0; b < n; ++b) {
      gz[b * d + j] = T(gy[b * d + j] / A(std[j]));
      sj += double(gy[b * d + j]) * double(yt[j * n + b]);
    }
    gstd[j] = T(-sj / double(std[j]));
  }
}

std::tuple<Tensor, Tensor> klm_backward_cpu(const Tensor& grad_loss, const Tensor& z_, const Tensor& std_,
                                            const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const Tensor z = z_.contiguous(), std = std_.contiguous(), lse = lse_.contiguous();
  Tensor gz = at::empty_like(z), gs = at::empty_like(std);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "klm_backward_cpu", [&] {
    klm_backward_kernel<scalar_t>(grad_loss.item<double>(), z.data_ptr<scalar_t>(), std.data_ptr<scalar_t>(),
                                  lse.data_ptr<scalar_t>(), z.size(0), z.size(1), gz.data_ptr<scalar_t>(),
                                  gs.data_ptr<scalar_t>());
  });
  return {gz, gs};
}

}  // namespace

TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("kde_grid", &kde_grid_cpu);
  m.impl("kde_grid_backward", &kde_grid_backward_cpu);
  m.impl("cliff_terms", &cliff_terms_cpu);
  m.impl("cliff_terms_backward", &cliff_terms_backward_cpu);
  m.impl("klm", &klm_cpu);
  m.impl("klm_backward", &klm_backward_cpu);
}

}  // namespace qkernels
