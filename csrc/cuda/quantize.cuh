// Launchers of the CUDA quantization kernels (csrc/cuda/quantize.cu). Raw pointers, sizes and a
// stream only: no torch here, so the kernels compile with plain nvcc.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace qkernels {
namespace cuda {

// z (N, d), values (G, nv), G in {1, d}. Writes zq, idx and the mean squared error into loss and
// loss_commit (device scalars), through sq_partial[latent_quantize_num_blocks(N, d)] (a workspace:
// sums of squared errors per block, then summed in a fixed order).
template <typename T>
cudaError_t latent_quantize_fwd(const T* z, const T* values, T* zq, int64_t* idx, T* sq_partial, T* loss,
                                T* loss_commit, int64_t N, int64_t d, int64_t G, int64_t nv, cudaStream_t stream);
int64_t latent_quantize_num_blocks(int64_t N, int64_t d);

// grad_z = grad_zq + grad_commit * 2/(N d) * (z - q); grad_values (G, nv) = grad_quantize * 2/(N d) *
// sum (q - z) over the entries that chose each value, without atomics (deterministic: per row-chunk partials in
// the workspace, latent_quantize_workspace(N, d, G, nv, T is double) values, summed in a fixed order; every index
// read once). grad_quantize / grad_commit are device scalars.
template <typename T>
cudaError_t latent_quantize_bwd(const T* grad_zq, const T* grad_quantize, const T* grad_commit,
                                const T* z, const T* values, const int64_t* idx, T* grad_z,
                                T* grad_values, T* workspace, int64_t N, int64_t d, int64_t G, int64_t nv,
                                cudaStream_t stream);

// Workspaces of the codebook gradients (values), for N rows of d latents: latent_quantize_bwd's ((G, nv)
// codebook) and relaxed_categorical_bwd's (K categories); sized for the current device's SM count.
int64_t latent_quantize_workspace(int64_t N, int64_t d, int64_t G, int64_t nv, bool is_double);
int64_t categorical_workspace(int64_t N, int64_t d, int64_t K);

// logits, uniform (nullable), y: (N*d, K) rows; values (G, K). One thread per row.
template <typename T>
cudaError_t relaxed_categorical_fwd(const T* logits, const T* uniform, const T* values, T* z, T* y,
                                    T* kl, int64_t rows, int64_t d, int64_t G, int64_t K, T tau,
                                    T noise_scale, bool hard, cudaStream_t stream);

// grad_logits (rows, K) and the codebook gradient grad_values (G, K) = sum over the rows of each
// group of grad_z * y (the forward's y), deterministic through the workspace
// (categorical_workspace(rows / d, d, K) values).
template <typename T>
cudaError_t relaxed_categorical_bwd(const T* grad_z, const T* grad_y, const T* grad_kl,
                                    const T* logits, const T* uniform, const T* values, const T* y,
                                    T* grad_logits, T* grad_values, T* workspace, int64_t rows, int64_t d,
                                    int64_t G, int64_t K, T tau, T noise_scale, cudaStream_t stream);

}  // namespace cuda
}  // namespace qkernels
