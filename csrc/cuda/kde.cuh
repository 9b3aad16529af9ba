// Launchers of the CUDA KDE kernels (csrc/cuda/kde.cu): KLM, kde_grid and the Cliff terms, forward
// and backward.
// Raw pointers, sizes and a stream only: no torch here, so the kernels compile with plain nvcc.
// Every output element is written by one thread that sums in a fixed order (deterministic).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace qkernels {
namespace cuda {

// y = z / std (n, d) row-major. Writes lse (n, d + 1): lse[b, 0] = log sum_a exp(c_joint *
// |y_b - y_a|^2) (c_joint = -1 / (2 f^2)), lse[b, 1 + j] = log sum_a exp(-(y_bj - y_aj)^2 / 2).
// Streams tiles of samples a through shared memory; memory O(n d).
template <typename T>
cudaError_t klm_fwd(const T* y, T* lse, int64_t n, int64_t d, double c_joint, cudaStream_t stream);

// gy (n, d) = scale * sum_a [-(P_ba + P_ab) inv_f2 + (Pj_ba + Pj_ab)] (y_bj - y_aj) with the softmaxes
// P_ba = exp(c_joint |y_b - y_a|^2 - lse[b, 0]), Pj_ba = exp(-(y_bj - y_aj)^2 / 2 - lse[b, 1 + j]).
template <typename T>
cudaError_t klm_bwd(const T* y, const T* lse, T* gy, int64_t n, int64_t d, double c_joint, double inv_f2,
                    double scale, cudaStream_t stream);

// points (d, K), samples (n, d): out[j, k] = 1/n sum_s N(points[j, k]; samples[s, j], sigma^2) (or d/dt).
template <typename T>
cudaError_t kde_grid_fwd(const T* points, const T* samples, T* out, int64_t n, int64_t d, int64_t K,
                         double sigma, bool derivative, cudaStream_t stream);

// Gradients of sum(grad * out) with respect to points (d, K) and samples (n, d).
template <typename T>
cudaError_t kde_grid_bwd(const T* grad, const T* points, const T* samples, T* grad_points, T* grad_samples,
                         int64_t n, int64_t d, int64_t K, double sigma, bool derivative, cudaStream_t stream);

// Cliff terms (qkernels/reference/kde.py cliff_terms). x (n, d) row-major, grid (K,), uni_points (Ku,),
// cond (d, M) int64 rows of x. Forward writes the per-latent terms uni (d,), kl (d,) and the JSD of
// every ordered pair jsd (d (d - 1),), pair p = i (d - 1) + r, j = r + (r >= i) (not written when
// d < 2); the caller sums them. workspace: cliff_fwd_workspace(d, K, Ku, M) elements of T.
int64_t cliff_fwd_workspace(int64_t d, int64_t K, int64_t Ku, int64_t M);
template <typename T>
cudaError_t cliff_fwd(const T* x, const T* grid, const T* uni_points, const int64_t* cond, T* uni, T* kl, T* jsd,
                      T* workspace, int64_t n, int64_t d, int64_t K, int64_t Ku, int64_t M, double sigma,
                      double step, cudaStream_t stream);

// Backward: grad_x (n, d) = d(g_uni uni + g_biv biv + g_kl kl)/dx with grads = (g_uni, g_biv, g_kl)
// on the device. One block per latent owns its column of grad_x (deterministic, no atomics).
// workspace: cliff_bwd_workspace(d, K, Ku, M) elements of T.
int64_t cliff_bwd_workspace(int64_t d, int64_t K, int64_t Ku, int64_t M);
template <typename T>
cudaError_t cliff_bwd(const T* grads, const T* x, const T* grid, const T* uni_points, const int64_t* cond, T* grad_x,
                      T* workspace, int64_t n, int64_t d, int64_t K, int64_t Ku, int64_t M, double sigma,
                      double step, cudaStream_t stream);

}  // namespace cuda
}  // namespace qkernels
