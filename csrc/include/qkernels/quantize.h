// Math of the quantization hot path, used by the CUDA kernels (csrc/cuda/quantize.cu; tests/test_build.py compiles
// it with nvcc). The CPU kernels compute the same equations their own way: latent_quantize by a scan of up to 16
// values, else a binary search over the sorted codebook (csrc/cpu/quantize_impl.h), the categorical rows
// vectorized (csrc/cpu/quantize_kernels.h: this scalar form with libm exp / log ran at 0.3-0.6x the
// reference on a CPU).
//
// nearest_index: the nearest codebook value (ties -> lowest index), exactly as
//   argmin_k |x - v_k| with first-occurrence tie breaking.
// categorical_*: one row of K categories of the relaxed categorical sample
//   y = softmax((logits + s * Gumbel(u)) / tau), z = sum_k y_k v_k,
//   kl = sum_k p_k log(p_k K), p = softmax(logits)
//   and its backward (recomputing y and p from logits and u).
#pragma once

#include "qkernels/common.h"

namespace qkernels {

template <typename T>
QK_HOST_DEVICE int nearest_index(const T* values, int n_v, T x) {
  int best = 0;
  T best_d = qk_abs(x - values[0]);
  for (int k = 1; k < n_v; ++k) {
    const T d = qk_abs(x - values[k]);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

// Gumbel(0, 1) noise from a uniform sample, with u clamped into (0, 1) so the noise is finite.
template <typename T>
QK_HOST_DEVICE T gumbel_from_uniform(T u) {
  const T tiny = sizeof(T) == 4 ? T(1e-20) : T(1e-300);
  const T one_minus = sizeof(T) == 4 ? T(1.0f - 5.9604645e-8f) : T(1.0 - 1.1102230246251565e-16);
  u = u < tiny ? tiny : (u > one_minus ? one_minus : u);
  return -qk_log(-qk_log(u));
}

// Perturbed, tempered logit of category k.
template <typename T>
QK_HOST_DEVICE T perturbed_logit(const T* logits, const T* uniform, int k, T tau, T noise_scale) {
  T a = logits[k];
  if (uniform != nullptr) a += noise_scale * gumbel_from_uniform(uniform[k]);
  return a / tau;
}

// Soft sample of one row into out[0..K): out = softmax(perturbed logits), each Gumbel term
// computed once. Returns the index of the first maximum of out.
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE int perturbed_softmax(const T* logits, const T* uniform, int K, T tau, T noise_scale, T* out) {
  A m = perturbed_logit(logits, uniform, 0, tau, noise_scale);
  out[0] = T(m);
  for (int k = 1; k < K; ++k) {
    const T a = perturbed_logit(logits, uniform, k, tau, noise_scale);
    out[k] = a;
    m = A(a) > m ? A(a) : m;
  }
  A s = 0;
  for (int k = 0; k < K; ++k) {
    const A e = qk_exp(A(out[k]) - m);
    out[k] = T(e);
    s += e;
  }
  const A inv_s = A(1) / s;
  int am = 0;
  for (int k = 0; k < K; ++k) {
    out[k] = T(A(out[k]) * inv_s);
    if (out[k] > out[am]) am = k;
  }
  return am;
}

// Max and log(sum(exp(l - max))) of the plain logits of one row.
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE void logsumexp_stats(const T* logits, int K, A* max_out, A* log_sum_out) {
  A m = logits[0];
  for (int k = 1; k < K; ++k) m = A(logits[k]) > m ? A(logits[k]) : m;
  A s = 0;
  for (int k = 0; k < K; ++k) s += qk_exp(A(logits[k]) - m);
  *max_out = m;
  *log_sum_out = qk_log(s);
}

// Forward of one row: writes y[0..K) (the one-hot of the first argmax of the soft sample when
// hard) and returns z; *kl gets KL(softmax(logits) || Uniform(K)).
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE T categorical_row_forward(const T* logits, const T* uniform, const T* values, int K,
                                         T tau, T noise_scale, bool hard, T* y, T* kl) {
  const int am = perturbed_softmax(logits, uniform, K, tau, noise_scale, y);
  A z = 0;
  for (int k = 0; k < K; ++k) {
    if (hard) y[k] = T(k == am ? 1 : 0);
    z += A(y[k]) * A(values[k]);
  }
  A lm, lse;
  logsumexp_stats(logits, K, &lm, &lse);
  const A logK = qk_log(A(K));
  A acc = 0;
  for (int k = 0; k < K; ++k) {
    const A logp = A(logits[k]) - lm - lse;
    acc += qk_exp(logp) * (logp + logK);
  }
  *kl = T(acc);
  return T(z);
}

// Backward of one row: writes grad_logits[0..K) (also its scratch space for the recomputed soft
// sample). The gradient reaching the soft sample y_soft is g_y + g_z * v (a hard sample is
// straight-through: y_hard + y_soft - sg(y_soft)). The codebook gradient, sum over rows of
// g_z * y_out, is reduced by the caller from the forward's y.
template <typename T, typename A = typename acc_type<T>::type>
QK_HOST_DEVICE void categorical_row_backward(const T* __restrict__ logits, const T* __restrict__ uniform,
                                             const T* __restrict__ values, int K, T tau, T noise_scale, T g_z,
                                             const T* __restrict__ g_y, T g_kl, T* __restrict__ grad_logits) {
  T* y = grad_logits;
  perturbed_softmax(logits, uniform, K, tau, noise_scale, y);
  A lm, lse;
  logsumexp_stats(logits, K, &lm, &lse);
  // dot = sum_j y_j * gy_j and ent = sum_j p_j log p_j
  A dot = 0, ent = 0;
  for (int k = 0; k < K; ++k) {
    dot += A(y[k]) * (A(g_y[k]) + A(g_z) * A(values[k]));
    const A logp = A(logits[k]) - lm - lse;
    ent += qk_exp(logp) * logp;
  }
  for (int k = 0; k < K; ++k) {
    const A gy = A(g_y[k]) + A(g_z) * A(values[k]);
    const A logp = A(logits[k]) - lm - lse;
    grad_logits[k] = T(A(y[k]) * (gy - dot) / A(tau) + A(g_kl) * qk_exp(logp) * (logp - ent));
  }
}

}  // namespace qkernels
