// XLA FFI handlers of latent_quantize (qkernels/jax/quantize.py calls them through jax.ffi.ffi_call): the same
// checks (qkernels/quantize_checks.h) and the same CPU kernel (csrc/cpu/quantize_impl.h) as the torch binding
// csrc/cpu/quantize.cpp. Indices are int32 or int64 (JAX without or with x64), as the output buffer says.
#include "../cpu/quantize_impl.h"
#include "ffi_common.h"
#include "qkernels/quantize_checks.h"

namespace qkernels {
namespace jaxffi {
namespace {

ffi::Error latent_quantize_fwd(ffi::ThreadPool pool, ffi::AnyBuffer z_, ffi::AnyBuffer values_,
                               ffi::Result<ffi::AnyBuffer> zq_, ffi::Result<ffi::AnyBuffer> idx_,
                               ffi::Result<ffi::AnyBuffer> loss_q_, ffi::Result<ffi::AnyBuffer> loss_c_) {
  return run(pool, [&] {
    const Buffer z = view(z_), values = view(values_), zq = view(zq_), idx = view(idx_), loss_q = view(loss_q_),
                 loss_c = view(loss_c_);
    check_codebook(z, values, "latent_quantize");
    check_finite(z, "z", "latent_quantize");
    check_finite(values, "values", "latent_quantize");
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      dispatch_index(idx.dtype, [&](auto izero) {
        using I = decltype(izero);
        // the two losses have one value (the mean squared distance), each its own gradient
        *loss_q.mutable_data_ptr<T>() = *loss_c.mutable_data_ptr<T>() = static_cast<T>(
            cpu::latent_quantize_forward<T, I>(z.const_data_ptr<T>(), values.const_data_ptr<T>(), z.size(0),
                                               z.size(1), values.size(0), values.size(1), zq.mutable_data_ptr<T>(),
                                               idx.mutable_data_ptr<I>()));
      });
    });
  });
}

ffi::Error latent_quantize_bwd(ffi::ThreadPool pool, ffi::AnyBuffer grad_zq_, ffi::AnyBuffer grad_lq_,
                               ffi::AnyBuffer grad_lc_, ffi::AnyBuffer z_, ffi::AnyBuffer values_,
                               ffi::AnyBuffer idx_, ffi::Result<ffi::AnyBuffer> gz_,
                               ffi::Result<ffi::AnyBuffer> gv_) {
  return run(pool, [&] {
    const Buffer grad_zq = view(grad_zq_), grad_lq = view(grad_lq_), grad_lc = view(grad_lc_), z = view(z_),
                 values = view(values_), idx = view(idx_), gz = view(gz_), gv = view(gv_);
    check_latent_quantize_backward(grad_zq, grad_lq, grad_lc, z, values, idx, "latent_quantize_backward",
                                   /*int32_index=*/true);
    check_floating(grad_lq, "grad_loss_quantize", "latent_quantize_backward");
    check_floating(grad_lc, "grad_loss_commit", "latent_quantize_backward");
    dispatch_floating(z.dtype, [&](auto zero) {
      using T = decltype(zero);
      dispatch_index(idx.dtype, [&](auto izero) {
        using I = decltype(izero);
        cpu::latent_quantize_backward<T, I>(grad_zq.const_data_ptr<T>(), scalar(grad_lq), scalar(grad_lc),
                                            z.const_data_ptr<T>(), values.const_data_ptr<T>(),
                                            idx.const_data_ptr<I>(), z.size(0), z.size(1), values.size(0),
                                            values.size(1), gz.mutable_data_ptr<T>(), gv.mutable_data_ptr<T>());
      });
    });
  });
}

}  // namespace
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qj = qkernels::jaxffi;

QK_FFI_TARGET("latent_quantize", qk_latent_quantize_fwd, qj::latent_quantize_fwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("latent_quantize_backward", qk_latent_quantize_bwd, qj::latent_quantize_bwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
