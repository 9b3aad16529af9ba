// XLA FFI handlers of finite_difference_curvature, the fused reduction of Tripod's normalized Hessian penalty
// (qkernels/jax/hessian.py calls them through jax.ffi.ffi_call): the same checks (qkernels/hessian_checks.h)
// and the same CPU kernel (csrc/cpu/hessian_impl.h) as the torch binding csrc/cpu/hessian.cpp. argmax is int32
// or int64 (JAX without or with x64), as its buffer says.
#include <string_view>

#include "../cpu/hessian_impl.h"
#include "ffi_common.h"
#include "qkernels/hessian_checks.h"

namespace qkernels {
namespace jaxffi {
namespace {

ffi::Error fd_curvature_fwd(ffi::ThreadPool pool, ffi::AnyBuffer stacked_, int64_t n, int64_t k, double eps,
                            int64_t groups, bool unbiased, std::string_view reduce,
                            ffi::Result<ffi::AnyBuffer> values_, ffi::Result<ffi::AnyBuffer> argmax_) {
  return run(pool, [&] {
    const Buffer stacked = view(stacked_), values = view(values_), argmax = view(argmax_);
    const FdShape s = check_fd(stacked, n, k, eps, groups, reduce, "finite_difference_curvature");
    dispatch_floating(stacked.dtype, [&](auto zero) {
      using T = decltype(zero);
      dispatch_index(argmax.dtype, [&](auto izero) {
        using I = decltype(izero);
        cpu::fd_curvature_forward<T, I>(stacked.const_data_ptr<T>(), s, eps, unbiased,
                                        values.mutable_data_ptr<T>(), argmax.mutable_data_ptr<I>());
      });
    });
  });
}

ffi::Error fd_curvature_bwd(ffi::ThreadPool pool, ffi::AnyBuffer grad_, ffi::AnyBuffer stacked_,
                            ffi::AnyBuffer argmax_, int64_t n, int64_t k, double eps, int64_t groups, bool unbiased,
                            std::string_view reduce, ffi::Result<ffi::AnyBuffer> out_) {
  return run(pool, [&] {
    const Buffer grad = view(grad_), stacked = view(stacked_), argmax = view(argmax_), out = view(out_);
    const FdShape s = check_fd_backward(grad, stacked, argmax, n, k, eps, groups, reduce,
                                        "finite_difference_curvature_backward", /*int32_index=*/true);
    check_like(grad, "grad", stacked, "stacked", "finite_difference_curvature_backward");
    dispatch_floating(stacked.dtype, [&](auto zero) {
      using T = decltype(zero);
      dispatch_index(argmax.dtype, [&](auto izero) {
        using I = decltype(izero);
        cpu::fd_curvature_backward<T, I>(grad.const_data_ptr<T>(), stacked.const_data_ptr<T>(),
                                         argmax.const_data_ptr<I>(), s, eps, unbiased,
                                         out.mutable_data_ptr<T>());
      });
    });
  });
}

}  // namespace
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qj = qkernels::jaxffi;

QK_FFI_TARGET("finite_difference_curvature", qk_fd_curvature_fwd, qj::fd_curvature_fwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("num_perturbations")
                                  .Attr<double>("eps")
                                  .Attr<int64_t>("groups")
                                  .Attr<bool>("unbiased")
                                  .Attr<std::string_view>("reduce")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
QK_FFI_TARGET("finite_difference_curvature_backward", qk_fd_curvature_bwd, qj::fd_curvature_bwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("num_perturbations")
                                  .Attr<double>("eps")
                                  .Attr<int64_t>("groups")
                                  .Attr<bool>("unbiased")
                                  .Attr<std::string_view>("reduce")
                                  .Ret<ffi::AnyBuffer>());
