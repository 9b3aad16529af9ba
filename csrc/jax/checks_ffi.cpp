// The JAX front-end's run-time value check (qkernels/jax/_ffi.py check_values): the identity on one float32 /
// float64 buffer that fails, with the torch front-end's message, when a value is NaN or inf (or, with `positive`,
// not > 0). For values no kernel reads itself: the Hessian penalties' latents, scales and fn outputs (the stacked
// batch and fn are jax.numpy and the user's code), FSQ's latents (elementwise jax.numpy). The checks are
// qkernels/checks.h's, so QKERNELS_CHECK_FINITE=0 turns them off as it does the kernels'.
#include <cstring>
#include <string>
#include <string_view>

#include "ffi_common.h"

namespace qkernels {
namespace jaxffi {
namespace {

ffi::Error check_values(ffi::ThreadPool pool, ffi::AnyBuffer x_, std::string_view op, std::string_view name,
                        bool positive, ffi::Result<ffi::AnyBuffer> out_) {
  return run(pool, [&] {
    const Buffer x = view(x_), out = view(out_);
    const std::string op_s(op), name_s(name);
    check_floating(x, name_s.c_str(), op_s.c_str());
    check_finite(x, name_s.c_str(), op_s.c_str(), positive);
    if (out.data != x.data)  // aliased unless XLA had to keep the input alive
      std::memcpy(out.data, x.data, static_cast<size_t>(x.numel()) * (x.dtype == DType::Float32 ? 4 : 8));
  });
}

}  // namespace
}  // namespace jaxffi
}  // namespace qkernels

namespace ffi = xla::ffi;
namespace qj = qkernels::jaxffi;

QK_FFI_HELPER("check_values", "cpu", qk_check_values, qj::check_values,
              ffi::Ffi::Bind()
                  .Ctx<ffi::ThreadPool>()
                  .Arg<ffi::AnyBuffer>()
                  .Attr<std::string_view>("op")
                  .Attr<std::string_view>("name")
                  .Attr<bool>("positive")
                  .Ret<ffi::AnyBuffer>());
