// CUDA XLA FFI handlers of the KDE ops with CUDA kernels, klm and kde_grid (Cliff has none: it runs on the CPU in
// qkernels.jax, on the triton backend in torch): the checks of qkernels/kde_checks.h and the launchers of
// csrc/cuda/kde.cu, as the torch glue csrc/cuda/kde_glue.cpp calls them; workspaces in XLA's scratch memory.
#include <cmath>
#include <type_traits>

#include "../../cuda/kde.cuh"
#include "common.h"
#include "qkernels/kde.h"
#include "qkernels/kde_checks.h"

namespace qkernels {
namespace jaxffi {
namespace gpu {
namespace {

// Silverman's factor and the loss's constant, as the torch glue computes them.
struct KlmConstants {
  double f, c;
};
KlmConstants klm_constants(int64_t n, int64_t d) {
  const double f = silverman_factor(double(n), double(d));
  return {f, double(d - 1) * std::log(double(n)) - double(d) * std::log(f)};
}

// y = z / s with s the given std or the default one; s, mean and var (3 d values of `stats`); zeroes `tickets`.
template <typename T>
void scale(const Buffer& z, const std::optional<Buffer>& std, T* stats, T* y, int* tickets, cudaStream_t stream,
           const char* op) {
  const int64_t n = z.size(0), d = z.size(1);
  check_cuda(cuda::klm_scale<T>(z.const_data_ptr<T>(), std.has_value() ? std->const_data_ptr<T>() : nullptr, stats,
                                stats + d, stats + 2 * d, y, tickets, n, d, stream),
             op);
}

ffi::Error klm_fwd(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator alloc, ffi::AnyBuffer z_,
                   std::optional<ffi::AnyBuffer> std_, ffi::Result<ffi::AnyBuffer> loss_,
                   ffi::Result<ffi::AnyBuffer> lse_) {
  return run(ordinal, [&] {
    const Buffer z = view(z_, ordinal), loss = view(loss_, ordinal), lse = view(lse_, ordinal);
    const std::optional<Buffer> std = view(std_, ordinal);
    check_klm(z, std, "klm_loss");
    const int64_t n = z.size(0), d = z.size(1);
    const KlmConstants k = klm_constants(n, d);
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* stats = scratch<T>(alloc, 3 * d, "klm");
      T* y = scratch<T>(alloc, n * d, "klm");
      T* ws = scratch<T>(alloc, cuda::klm_workspace(n, d, std::is_same_v<T, double>, false), "klm");
      int* tickets = scratch<int>(alloc, cuda::klm_tickets(n), "klm");
      scale<T>(z, std, stats, y, tickets, stream, "klm");
      check_cuda(cuda::klm_fwd<T>(y, lse.mutable_data_ptr<T>(), ws, tickets, n, d, -0.5 / (k.f * k.f), stream), "klm");
      check_cuda(cuda::klm_loss<T>(lse.const_data_ptr<T>(), loss.mutable_data_ptr<T>(), n, d, k.c, stream), "klm");
    });
  });
}

// Operands as qkernels/jax/_ffi.py orders them: grad_loss, z, lse (required), then std when given.
ffi::Error klm_bwd(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator alloc, ffi::AnyBuffer grad_,
                   ffi::AnyBuffer z_, ffi::AnyBuffer lse_, std::optional<ffi::AnyBuffer> std_,
                   ffi::Result<ffi::AnyBuffer> gz_, ffi::Result<ffi::AnyBuffer> gs_) {
  return run(ordinal, [&] {
    const Buffer grad = view(grad_, ordinal), z = view(z_, ordinal), lse = view(lse_, ordinal);
    const Buffer gz = view(gz_, ordinal), gs = view(gs_, ordinal);
    const std::optional<Buffer> std = view(std_, ordinal);
    check_klm_backward(grad, z, std, lse, "klm_backward");
    check_like(grad, "grad_loss", z, "z", "klm_backward");
    const int64_t n = z.size(0), d = z.size(1);
    const KlmConstants k = klm_constants(n, d);
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* stats = scratch<T>(alloc, 3 * d, "klm_backward");
      T* y = scratch<T>(alloc, n * d, "klm_backward");
      T* gy = scratch<T>(alloc, n * d, "klm_backward");
      T* ws = scratch<T>(alloc, cuda::klm_workspace(n, d, std::is_same_v<T, double>, true), "klm_backward");
      int* tickets = scratch<int>(alloc, cuda::klm_tickets(n), "klm_backward");
      scale<T>(z, std, stats, y, tickets, stream, "klm_backward");
      check_cuda(cuda::klm_bwd<T>(y, lse.const_data_ptr<T>(), gy, ws, tickets, n, d, -0.5 / (k.f * k.f),
                                  1.0 / (k.f * k.f), 1.0 / double(n), stream),
                 "klm_backward");
      // z = y * std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j, plus the default std's share in dz
      check_cuda(cuda::klm_unscale<T>(gy, grad.const_data_ptr<T>(), z.const_data_ptr<T>(), y, stats, stats + d,
                                      stats + 2 * d, !std.has_value(), gz.mutable_data_ptr<T>(),
                                      std.has_value() ? gs.mutable_data_ptr<T>() : nullptr, n, d, stream),
                 "klm_backward");
    });
  });
}

ffi::Error kde_grid_fwd(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer points_, ffi::AnyBuffer samples_,
                        double sigma, bool derivative, ffi::Result<ffi::AnyBuffer> out_) {
  return run(ordinal, [&] {
    const Buffer points = view(points_, ordinal), samples = view(samples_, ordinal), out = view(out_, ordinal);
    check_kde_grid(points, samples, sigma, "kde_grid");
    dispatch_floating(points.dtype, [&](auto zero) {
      using T = decltype(zero);
      check_cuda(cuda::kde_grid_fwd<T>(points.const_data_ptr<T>(), samples.const_data_ptr<T>(),
                                       out.mutable_data_ptr<T>(), samples.size(0), samples.size(1), points.size(1),
                                       sigma, derivative, stream),
                 "kde_grid");
    });
  });
}

ffi::Error kde_grid_bwd(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer grad_, ffi::AnyBuffer points_,
                        ffi::AnyBuffer samples_, double sigma, bool derivative, ffi::Result<ffi::AnyBuffer> gp_,
                        ffi::Result<ffi::AnyBuffer> gs_) {
  return run(ordinal, [&] {
    const Buffer grad = view(grad_, ordinal), points = view(points_, ordinal), samples = view(samples_, ordinal);
    const Buffer gp = view(gp_, ordinal), gs = view(gs_, ordinal);
    check_kde_grid_backward(grad, points, samples, sigma, "kde_grid_backward");
    check_like(grad, "grad", points, "points", "kde_grid_backward");
    dispatch_floating(points.dtype, [&](auto zero) {
      using T = decltype(zero);
      check_cuda(cuda::kde_grid_bwd<T>(grad.const_data_ptr<T>(), points.const_data_ptr<T>(),
                                       samples.const_data_ptr<T>(), gp.mutable_data_ptr<T>(), gs.mutable_data_ptr<T>(),
                                       samples.size(0), samples.size(1), points.size(1), sigma, derivative, stream),
                 "kde_grid_backward");
    });
  });
}

}  // namespace
}  // namespace gpu
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qg = qkernels::jaxffi::gpu;

QK_FFI_CUDA_TARGET("klm", qk_klm_fwd_cuda, qg::klm_fwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Ctx<ffi::ScratchAllocator>()
                       .Arg<ffi::AnyBuffer>()
                       .OptionalArg<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>());
QK_FFI_CUDA_TARGET("klm_backward", qk_klm_bwd_cuda, qg::klm_bwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Ctx<ffi::ScratchAllocator>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .OptionalArg<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>());
QK_FFI_CUDA_TARGET("kde_grid", qk_kde_grid_fwd_cuda, qg::kde_grid_fwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Attr<double>("sigma")
                       .Attr<bool>("derivative")
                       .Ret<ffi::AnyBuffer>());
QK_FFI_CUDA_TARGET("kde_grid_backward", qk_kde_grid_bwd_cuda, qg::kde_grid_bwd,
                   ffi::Ffi::Bind()
                       .Ctx<qg::Stream>()
                       .Ctx<ffi::DeviceOrdinal>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Arg<ffi::AnyBuffer>()
                       .Attr<double>("sigma")
                       .Attr<bool>("derivative")
                       .Ret<ffi::AnyBuffer>()
                       .Ret<ffi::AnyBuffer>());
