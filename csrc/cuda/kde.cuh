// Launchers of the CUDA KDE kernels (csrc/cuda/kde.cu): KLM and kde_grid, forward and
// backward (Cliff runs on the triton backend: docs/design/routing.md#cliff_loss).
// Raw pointers, sizes and a stream only: no torch here, so the kernels compile with plain nvcc.
// Every output element is written by one thread that sums in a fixed order (deterministic).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace qkernels {
namespace cuda {

// y = z / std (n, d) row-major. Writes lse (n, d + 1): lse[b, 0] = log sum_a exp(c_joint *
// |y_b - y_a|^2) (c_joint = -1 / (2 f^2)), lse[b, 1 + j] = log sum_a exp(-(y_bj - y_aj)^2 / 2).
// Streams tiles of samples a through shared memory; rows x column slices of blocks (>= 2 per SM of the current
// device), the slices' partial sums in ws (klm_workspace(n, d, T is double, false) values), added in order by the
// last block of each row block: tickets (klm_tickets(n) ints) must be zeroed by klm_scale just before, on the stream.
template <typename T>
cudaError_t klm_fwd(const T* y, T* lse, T* ws, int* tickets, int64_t n, int64_t d, double c_joint,
                    cudaStream_t stream);

// gy (n, d) = scale * sum_a [-(P_ba + P_ab) inv_f2 + (Pj_ba + Pj_ab)] (y_bj - y_aj) with the softmaxes
// P_ba = exp(c_joint |y_b - y_a|^2 - lse[b, 0]), Pj_ba = exp(-(y_bj - y_aj)^2 / 2 - lse[b, 1 + j]). The same slices
// (ws: klm_workspace(n, d, T is double, true) values; tickets zeroed by klm_scale just before).
template <typename T>
cudaError_t klm_bwd(const T* y, const T* lse, T* gy, T* ws, int* tickets, int64_t n, int64_t d, double c_joint,
                    double inv_f2, double scale, cudaStream_t stream);
int64_t klm_workspace(int64_t n, int64_t d, bool is_double, bool backward);
int64_t klm_tickets(int64_t n);

// The O(n d) work around the KLM kernels (one block per latent, sums in a fixed order):
// klm_scale: s (d,) = std, or when std is nullptr the population std of z + 1e-6 (0 + 1e-6 for a constant
//   column), with the column mean and variance in mean, var (d,); y (n, d) = z / s; zeroes the klm_tickets(n)
//   tickets of the klm_fwd / klm_bwd launch that follows.
template <typename T>
cudaError_t klm_scale(const T* z, const T* std, T* s, T* mean, T* var, T* y, int* tickets, int64_t n, int64_t d,
                      cudaStream_t stream);

// loss (a device scalar) = mean over b of (lse[b, 0] - sum_j lse[b, 1 + j]) + c.
template <typename T>
cudaError_t klm_loss(const T* lse, T* loss, int64_t n, int64_t d, double c, cudaStream_t stream);

// From gy (n, d), the gradient of the loss in y = z / s per unit of *grad_loss (a device scalar), with g = gy *
// *grad_loss: gz = g / s, plus with default_std the default std's share (z - mean) gs / (n sqrt(var)) where
// var > 0; gs_j = -sum_b g_bj y_bj / s_j into gs (nullable).
template <typename T>
cudaError_t klm_unscale(const T* gy, const T* grad_loss, const T* z, const T* y, const T* s, const T* mean,
                        const T* var, bool default_std, T* gz, T* gs, int64_t n, int64_t d, cudaStream_t stream);

// points (d, K), samples (n, d): out[j, k] = 1/n sum_s N(points[j, k]; samples[s, j], sigma^2) (or d/dt).
template <typename T>
cudaError_t kde_grid_fwd(const T* points, const T* samples, T* out, int64_t n, int64_t d, int64_t K,
                         double sigma, bool derivative, cudaStream_t stream);

// Gradients of sum(grad * out) with respect to points (d, K) and samples (n, d).
template <typename T>
cudaError_t kde_grid_bwd(const T* grad, const T* points, const T* samples, T* grad_points, T* grad_samples,
                         int64_t n, int64_t d, int64_t K, double sigma, bool derivative, cudaStream_t stream);

}  // namespace cuda
}  // namespace qkernels
