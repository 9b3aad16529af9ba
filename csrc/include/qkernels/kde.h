// Math of the KDE hot path (Cliff criterion, Tripod KLM, kde_grid), shared by the CPU and CUDA
// kernels.
//
// Windowing (truncation) of Gaussian sums. A kernel term exp(-u^2 / 2), u = (t - x) / sigma, is
// dropped when |u| exceeds a window of window_sigmas<A>() sigmas:
// - fp64: kWindow = 10. A dropped term is below exp(-50) = 1.9e-22 of its peak (the derivative
//   term u exp(-u^2/2) below 2e-21 of its peak 0.61), so every truncated sum differs from the full
//   sum by less than 4e-21 (relative to the largest term) per dropped sample. Cliff's entropies and
//   JSDs are sums of p log p over normalized grids whose normalizer is at least one full term, so
//   the losses move by < 1e-18 relative (far below the 1e-12 fp64 test tolerance).
// - fp32: kWindowF32 = 7.5. A dropped term is below exp(-28.1) * 7.5 = 4.8e-12 of its peak: even n
//   = 4096 samples all at the window's edge would move a normalized grid by 2e-8 relative, under
//   fp32 rounding (6e-8); in fp32 the terms beyond |u| ~ 13.2 underflow to exactly 0 anyway. The
//   narrower window halves the work of the fp32 Cliff kernels (the windows are in k and in m).
// Log-densities (KL-uni) are computed as log-sum-exps around the nearest sample and keep every term
// within kLseWindow = 46 of the largest exponent (dropped terms < 1e-20 of the sum): they never
// underflow.
//
// Normalizing constants cancel in Cliff's normalized densities, so the kernels accumulate the
// unnormalized terms D(u) = -u exp(-u^2/2) (derivative kernel at t of a sample x) and
// N(w) = exp(-w^2/2) (kernel), and the entropy helpers below normalize.
#pragma once

#include "qkernels/common.h"

namespace qkernels {

constexpr double kWindow = 10.0;      // sigma units: fp64 Gaussian terms beyond are dropped
constexpr double kWindowF32 = 7.5;    // sigma units: fp32 Gaussian terms beyond are dropped
constexpr double kLseWindow = 46.0;   // exponent units kept below the largest log-sum-exp term

// Truncation window of Gaussian sums accumulated in A, in sigmas (see the top of this file).
template <typename A>
QK_HOST_DEVICE constexpr double window_sigmas() { return sizeof(A) == sizeof(float) ? kWindowF32 : kWindow; }

// Branch-free exp that compilers vectorize (round-to-nearest by a magic constant, Cody-Waite
// reduction, Taylor polynomial; a few ulp for the arguments <= 0 used here). Arguments below
// -87 (fp32) / -708 (fp64) are clamped there (results 1.6e-38 / 3.3e-308, never used where they
// could matter: every sum using vexp has a term >= exp(-50) relative). CUDA uses exp.
QK_HOST_DEVICE float vexp(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  x = x > -87.0f ? x : -87.0f;  // max: exp(-87) = 1.6e-38 stands in for smaller results
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.9841269841e-4f;  // Taylor to degree 7: truncation < 6e-9 on |r| <= ln2 / 2
  p = p * r + 1.3888888889e-3f;
  p = p * r + 8.3333333333e-3f;
  p = p * r + 4.1666666667e-2f;
  p = p * r + 1.6666666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n by a float -> int conversion of (n + 127) 2^23 (exact): one vector instruction with AVX,
  // which has no 256-bit integer shifts
  union { float f; int i; } sc;
  sc.i = static_cast<int>((n + 127.0f) * 8388608.0f);
  return p * sc.f;
#endif
}

QK_HOST_DEVICE double vexp(double x) {
#ifdef __CUDA_ARCH__
  return exp(x);
#else
  x = x > -708.0 ? x : -708.0;  // max: exp(-708) = 3.3e-308 stands in for smaller results
  const double magic = 6755399441055744.0;  // 1.5 * 2^52
  const double t = x * 1.4426950408889634074 + magic;
  const double n = t - magic;
  const double r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  double p = 1.0 / 479001600.0;  // Taylor to degree 12: truncation < 2e-16 on |r| <= ln2 / 2
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  union { double f; long long i; } tb, mb, sc;
  tb.f = t;
  mb.f = magic;
  sc.i = (tb.i - mb.i + 1023) << 52;
  return p * sc.f;
#endif
}

// First index in sorted[0, n) whose value is >= v (n when none).
template <typename T>
QK_HOST_DEVICE int lower_index(const T* sorted, int n, T v) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (sorted[mid] < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Grid window [*k0, *k1) of a uniform grid t_k = t0 + k * dt (k < K) that covers every point
// within window * sigma of x (one extra point each side absorbs rounding).
template <typename A>
QK_HOST_DEVICE void grid_window(A x, A t0, A dt, int K, A sigma, int* k0, int* k1, double window = kWindow) {
  const double lo = (double(x) - window * double(sigma) - double(t0)) / double(dt);
  const double hi = (double(x) + window * double(sigma) - double(t0)) / double(dt);
  const double a = ceil(lo) - 1.0, b = floor(hi) + 2.0;
  *k0 = a < 0.0 ? 0 : (a > double(K) ? K : int(a));
  *k1 = b < 0.0 ? 0 : (b > double(K) ? K : int(b));
}

// p log p with 0 log 0 = 0.
template <typename A>
QK_HOST_DEVICE A xlogx(A p) { return p > A(0) ? p * qk_log(p) : A(0); }
// d(p log p)/dp, defined as 0 at p = 0 (the reference's gradient convention).
template <typename A>
QK_HOST_DEVICE A dxlogx(A p) { return p > A(0) ? qk_log(p) + A(1) : A(0); }

// Normalizer c = step * sum_k |g_k| of one grid column (stride between k's).
template <typename A>
QK_HOST_DEVICE A column_norm(const A* g, int K, int stride, A step) {
  A s = 0;
  for (int k = 0; k < K; ++k) s += qk_abs(g[k * stride]);
  return step * s;
}

// Entropy -step * sum p log p of p = |g| / c (0 when c == 0).
template <typename A>
QK_HOST_DEVICE A column_entropy(const A* g, int K, int stride, A step, A c) {
  if (!(c > A(0))) return A(0);
  A s = 0;
  for (int k = 0; k < K; ++k) s += xlogx(qk_abs(g[k * stride]) / c);
  return -step * s;
}

// Gradient of a loss through p = |g| / c, c = step * sum |g|, given gp = dLoss/dp in place:
// on return gp holds dLoss/dg = sign(g) * (gp - step * sum_k gp_k p_k) / c.
template <typename A>
QK_HOST_DEVICE void column_backward(const A* g, A* gp, int K, int stride, A step, A c) {
  if (!(c > A(0))) {
    for (int k = 0; k < K; ++k) gp[k * stride] = A(0);
    return;
  }
  A dot = 0;
  for (int k = 0; k < K; ++k) dot += gp[k * stride] * (qk_abs(g[k * stride]) / c);
  for (int k = 0; k < K; ++k) {
    const A gk = g[k * stride];
    const A sgn = gk > A(0) ? A(1) : (gk < A(0) ? A(-1) : A(0));
    gp[k * stride] = sgn * (gp[k * stride] - step * dot) / c;
  }
}

// Uni term of one latent from its (unnormalized) derivative grid g[0, K): entropy, and in
// backward (grad != nullptr) dLoss/dg scaled by g_loss.
template <typename A>
QK_HOST_DEVICE A uni_entropy(const A* g, int K, A step, A g_loss, A* grad) {
  const A c = column_norm(g, K, 1, step);
  const A h = column_entropy(g, K, 1, step, c);
  if (grad != nullptr) {
    for (int k = 0; k < K; ++k) grad[k] = c > A(0) ? -g_loss * step * dxlogx(qk_abs(g[k]) / c) : A(0);
    column_backward(g, grad, K, 1, step, c);
  }
  return h;
}

// Silverman's factor (4 / (d + 2))^(1/(d+4)) n^(-1/(d+4)) (Tripod eq. 12).
QK_HOST_DEVICE double silverman_factor(double n, double d) {
  return pow(4.0 / (d + 2.0), 1.0 / (d + 4.0)) * pow(n, -1.0 / (d + 4.0));
}

}  // namespace qkernels
