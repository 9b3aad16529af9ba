// Launchers of the CUDA quantization kernels (csrc/cuda/quantize.cu). Raw pointers, sizes and a
// stream only: no torch here, so the kernels compile with plain nvcc.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace qkernels {
namespace cuda {

// z (N, d), values (G, nv), G in {1, d}. Writes zq, idx and sq_partial[ceil(N*d / 256)] (sums of
// squared errors per block, reduced by the caller).
template <typename T>
cudaError_t latent_quantize_fwd(const T* z, const T* values, T* zq, int64_t* idx, T* sq_partial,
                                int64_t N, int64_t d, int64_t G, int64_t nv, cudaStream_t stream);
int64_t latent_quantize_num_blocks(int64_t N, int64_t d);

// grad_z = grad_zq + grad_commit * 2/(N d) * (z - q); grad_values (G, nv) (zeroed by the caller,
// accumulated with atomics) += grad_quantize * 2/(N d) * sum (q - z) over the entries that chose
// each value. grad_quantize / grad_commit are device scalars.
template <typename T>
cudaError_t latent_quantize_bwd(const T* grad_zq, const T* grad_quantize, const T* grad_commit,
                                const T* z, const T* values, const int64_t* idx, T* grad_z,
                                T* grad_values, int64_t N, int64_t d, int64_t G, int64_t nv,
                                cudaStream_t stream);

// logits, uniform (nullable), y: (N*d, K) rows; values (G, K). One thread per row.
template <typename T>
cudaError_t relaxed_categorical_fwd(const T* logits, const T* uniform, const T* values, T* z, T* y,
                                    T* kl, int64_t rows, int64_t d, int64_t G, int64_t K, T tau,
                                    T noise_scale, bool hard, cudaStream_t stream);

// grad_logits (rows, K); the codebook gradient is reduced by the caller from the forward's y.
template <typename T>
cudaError_t relaxed_categorical_bwd(const T* grad_z, const T* grad_y, const T* grad_kl,
                                    const T* logits, const T* uniform, const T* values,
                                    T* grad_logits, int64_t rows, int64_t d, int64_t G, int64_t K,
                                    T tau, T noise_scale, cudaStream_t stream);

}  // namespace cuda
}  // namespace qkernels
