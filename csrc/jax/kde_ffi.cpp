// XLA FFI handlers of the KDE ops (qkernels/jax/kde.py calls them through jax.ffi.ffi_call): the same checks
// (qkernels/kde_checks.h) and the same CPU kernels (csrc/cpu/kde_impl.h) as the torch binding csrc/cpu/kde.cpp.
// Shapes, dtypes and options are checked again here although qkernels.jax checks them at trace time: these
// symbols can be called by anyone. Values (NaN / inf, index ranges) are checked here only: they exist at run time.
#include <vector>

#include "../cpu/kde_impl.h"
#include "ffi_common.h"
#include "qkernels/kde_checks.h"

namespace qkernels {
namespace jaxffi {
namespace {

ffi::Error kde_grid_fwd(ffi::ThreadPool pool, ffi::AnyBuffer points_, ffi::AnyBuffer samples_, double sigma,
                        bool derivative, ffi::Result<ffi::AnyBuffer> out_) {
  return run(pool, [&] {
    const Buffer points = view(points_), samples = view(samples_), out = view(out_);
    check_kde_grid(points, samples, sigma, "kde_grid");
    check_finite(points, "points", "kde_grid");
    check_finite(samples, "samples", "kde_grid");
    dispatch_floating(points.dtype, [&](auto zero) {
      using T = decltype(zero);
      cpu::kde_grid_forward<T>(points.const_data_ptr<T>(), samples.const_data_ptr<T>(), samples.size(0),
                               samples.size(1), points.size(1), sigma, derivative, out.mutable_data_ptr<T>());
    });
  });
}

ffi::Error kde_grid_bwd(ffi::ThreadPool pool, ffi::AnyBuffer grad_, ffi::AnyBuffer points_, ffi::AnyBuffer samples_,
                        double sigma, bool derivative, ffi::Result<ffi::AnyBuffer> gp_,
                        ffi::Result<ffi::AnyBuffer> gs_) {
  return run(pool, [&] {
    const Buffer grad = view(grad_), points = view(points_), samples = view(samples_), gp = view(gp_), gs = view(gs_);
    check_kde_grid_backward(grad, points, samples, sigma, "kde_grid_backward");
    check_like(grad, "grad", points, "points", "kde_grid_backward");
    dispatch_floating(points.dtype, [&](auto zero) {
      using T = decltype(zero);
      cpu::kde_grid_backward<T>(grad.const_data_ptr<T>(), points.const_data_ptr<T>(), samples.const_data_ptr<T>(),
                                samples.size(0), samples.size(1), points.size(1), sigma, derivative,
                                gp.mutable_data_ptr<T>(), gs.mutable_data_ptr<T>());
    });
  });
}

// cond_index as the kernel reads it: int64 (JAX gives int32 without x64).
std::vector<int64_t> cond_rows(const Buffer& cond) {
  std::vector<int64_t> out(cond.numel());
  for (int64_t i = 0; i < cond.numel(); ++i)
    out[i] = cond.dtype == DType::Int32 ? cond.const_data_ptr<int32_t>()[i] : cond.const_data_ptr<int64_t>()[i];
  return out;
}

ffi::Error cliff_fwd(ffi::ThreadPool pool, ffi::AnyBuffer z_, ffi::AnyBuffer cond_, double sigma, double a, double b,
                     int64_t K, double lu, double lb, double lk, ffi::Result<ffi::AnyBuffer> total_,
                     ffi::Result<ffi::AnyBuffer> uni_, ffi::Result<ffi::AnyBuffer> biv_,
                     ffi::Result<ffi::AnyBuffer> kl_) {
  return run(pool, [&] {
    const Buffer z = view(z_), cond = view(cond_);
    check_cliff_loss(z, cond, sigma, a, b, K, "cliff_loss", /*int32_index=*/true);
    check_finite(z, "z", "cliff_loss");
    Buffer outs[4] = {view(total_), view(uni_), view(biv_), view(kl_)};
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      const std::vector<int64_t> rows = cond_rows(cond);
      const auto terms = cpu::cliff_loss_forward<T>(z.const_data_ptr<T>(), z.size(0), z.size(1), rows.data(),
                                                    cond.size(1), {sigma, a, b, K, lu, lb, lk});
      for (int i = 0; i < 4; ++i) *outs[i].mutable_data_ptr<T>() = terms[i];
    });
  });
}

// Operands as qkernels/jax/_ffi.py orders them: the required ones, then the upstream gradients (Tensor? in the
// declaration; always given here).
ffi::Error cliff_bwd(ffi::ThreadPool pool, ffi::AnyBuffer z_, ffi::AnyBuffer cond_, ffi::AnyBuffer g_total,
                     ffi::AnyBuffer g_uni, ffi::AnyBuffer g_biv, ffi::AnyBuffer g_kl, double sigma, double a, double b,
                     int64_t K, double lu, double lb, double lk, ffi::Result<ffi::AnyBuffer> gz_) {
  return run(pool, [&] {
    const Buffer z = view(z_), cond = view(cond_), gz = view(gz_);
    const std::optional<Buffer> grads[4] = {view(g_total), view(g_uni), view(g_biv), view(g_kl)};
    check_cliff_loss_backward(grads, z, cond, sigma, a, b, K, "cliff_loss_backward", /*int32_index=*/true);
    double g[4];
    for (int i = 0; i < 4; ++i) {
      check_floating(*grads[i], "the upstream gradient", "cliff_loss_backward");
      g[i] = scalar(*grads[i]);
    }
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      const std::vector<int64_t> rows = cond_rows(cond);
      cpu::cliff_loss_backward<T>(g, z.const_data_ptr<T>(), z.size(0), z.size(1), rows.data(), cond.size(1),
                                  {sigma, a, b, K, lu, lb, lk}, gz.mutable_data_ptr<T>());
    });
  });
}

// std: absent (the default std of z, computed by the kernel) or (d,).
ffi::Error klm_fwd(ffi::ThreadPool pool, ffi::AnyBuffer z_, std::optional<ffi::AnyBuffer> std_,
                   ffi::Result<ffi::AnyBuffer> loss_, ffi::Result<ffi::AnyBuffer> lse_) {
  return run(pool, [&] {
    const Buffer z = view(z_), loss = view(loss_), lse = view(lse_);
    const std::optional<Buffer> std = view(std_);
    check_klm(z, std, "klm_loss");
    check_finite(z, "z", "klm_loss");
    if (std.has_value()) check_finite(*std, "std", "klm_loss", /*positive=*/true);
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      *loss.mutable_data_ptr<T>() = static_cast<T>(cpu::klm_forward<T>(
          z.const_data_ptr<T>(), std.has_value() ? std->const_data_ptr<T>() : nullptr, z.size(0), z.size(1),
          lse.mutable_data_ptr<T>()));
    });
  });
}

// grad_std: (d,) with std given, else (0,).
ffi::Error klm_bwd(ffi::ThreadPool pool, ffi::AnyBuffer grad_, ffi::AnyBuffer z_, ffi::AnyBuffer lse_,
                   std::optional<ffi::AnyBuffer> std_, ffi::Result<ffi::AnyBuffer> gz_,
                   ffi::Result<ffi::AnyBuffer> gs_) {
  return run(pool, [&] {
    const Buffer grad = view(grad_), z = view(z_), lse = view(lse_), gz = view(gz_), gs = view(gs_);
    const std::optional<Buffer> std = view(std_);
    check_klm_backward(grad, z, std, lse, "klm_backward");
    check_floating(grad, "grad_loss", "klm_backward");
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      cpu::klm_backward<T>(scalar(grad), z.const_data_ptr<T>(), std.has_value() ? std->const_data_ptr<T>() : nullptr,
                           lse.const_data_ptr<T>(), z.size(0), z.size(1), gz.mutable_data_ptr<T>(),
                           std.has_value() ? gs.mutable_data_ptr<T>() : nullptr);
    });
  });
}

}  // namespace
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qj = qkernels::jaxffi;

QK_FFI_TARGET("kde_grid", qk_kde_grid_fwd, qj::kde_grid_fwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<double>("sigma")
                                  .Attr<bool>("derivative")
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("kde_grid_backward", qk_kde_grid_bwd, qj::kde_grid_bwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<double>("sigma")
                                  .Attr<bool>("derivative")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("cliff_loss", qk_cliff_fwd, qj::cliff_fwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<double>("sigma")
                                  .Attr<double>("a")
                                  .Attr<double>("b")
                                  .Attr<int64_t>("num_points")
                                  .Attr<double>("lambda_uni")
                                  .Attr<double>("lambda_biv")
                                  .Attr<double>("lambda_kl")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("cliff_loss_backward", qk_cliff_bwd, qj::cliff_bwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<double>("sigma")
                                  .Attr<double>("a")
                                  .Attr<double>("b")
                                  .Attr<int64_t>("num_points")
                                  .Attr<double>("lambda_uni")
                                  .Attr<double>("lambda_biv")
                                  .Attr<double>("lambda_kl")
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("klm", qk_klm_fwd, qj::klm_fwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .OptionalArg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("klm_backward", qk_klm_bwd, qj::klm_bwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .OptionalArg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
