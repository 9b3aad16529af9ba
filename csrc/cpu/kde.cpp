// Torch binding of the CPU KDE ops (schemas: csrc/schemas.cpp): argument checks, contiguous inputs, outputs;
// the ops themselves are csrc/cpu/kde_impl.h (raw pointers, shared with the XLA FFI binding csrc/jax/kde_ffi.cpp),
// threaded by torch::stable::parallel_for (qkernels/parallel.h).
#include "qkernels/stable.h"

#include <vector>

#include "kde_impl.h"
#include "qkernels/kde_checks.h"

namespace qkernels {
namespace {

Tensor kde_grid_cpu(const Tensor& points_, const Tensor& samples_, double sigma, bool derivative) {
  check_kde_grid(points_, samples_, sigma, "kde_grid");
  const Tensor points = as_contiguous(points_), samples = as_contiguous(samples_);
  check_finite(points, "points", "kde_grid");
  check_finite(samples, "samples", "kde_grid");
  Tensor out = alloc_like(points);
  dispatch_floating(points.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::kde_grid_forward<scalar_t>(points.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(),
                                    samples.size(0), samples.size(1), points.size(1), sigma, derivative,
                                    out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<Tensor, Tensor> kde_grid_backward_cpu(const Tensor& grad_, const Tensor& points_, const Tensor& samples_,
                                                 double sigma, bool derivative) {
  check_kde_grid_backward(grad_, points_, samples_, sigma, "kde_grid_backward");
  const Tensor points = as_contiguous(points_), samples = as_contiguous(samples_);
  const Tensor grad = as_contiguous(to_dtype(grad_, points.scalar_type()));
  Tensor gp = alloc_like(points), gs = alloc_like(samples);
  dispatch_floating(points.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::kde_grid_backward<scalar_t>(grad.const_data_ptr<scalar_t>(), points.const_data_ptr<scalar_t>(),
                                     samples.const_data_ptr<scalar_t>(), samples.size(0), samples.size(1),
                                     points.size(1), sigma, derivative, gp.mutable_data_ptr<scalar_t>(),
                                     gs.mutable_data_ptr<scalar_t>());
  });
  return {gp, gs};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> cliff_loss_cpu(const Tensor& z_, const Tensor& cond_, double sigma, double a,
                                                          double b, int64_t K, double lu, double lb, double lk) {
  check_cliff_loss(z_, cond_, sigma, a, b, K, "cliff_loss");
  const Tensor z = as_contiguous(z_), cond = as_contiguous(cond_);
  check_finite(z, "z", "cliff_loss");
  std::vector<Tensor> out;
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const auto terms = cpu::cliff_loss_forward<scalar_t>(z.const_data_ptr<scalar_t>(), z.size(0), z.size(1),
                                                         cond.const_data_ptr<int64_t>(), cond.size(1),
                                                         {sigma, a, b, K, lu, lb, lk});
    for (const scalar_t value : terms) out.push_back(cpu_scalar_tensor(value, z.scalar_type(), z));
  });
  return {out[0], out[1], out[2], out[3]};
}

Tensor cliff_loss_backward_cpu(const std::optional<Tensor>& g_total, const std::optional<Tensor>& g_uni,
                               const std::optional<Tensor>& g_biv, const std::optional<Tensor>& g_kl, const Tensor& z_,
                               const Tensor& cond_, double sigma, double a, double b, int64_t K, double lu, double lb,
                               double lk) {
  const std::optional<Tensor> grads[4] = {g_total, g_uni, g_biv, g_kl};
  check_cliff_loss_backward(grads, z_, cond_, sigma, a, b, K, "cliff_loss_backward");
  double g[4];
  for (int i = 0; i < 4; ++i) g[i] = grads[i].has_value() ? cpu_scalar(*grads[i]) : 0.0;
  const Tensor z = as_contiguous(z_), cond = as_contiguous(cond_);
  Tensor gz = alloc_like(z);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::cliff_loss_backward<scalar_t>(g, z.const_data_ptr<scalar_t>(), z.size(0), z.size(1),
                                       cond.const_data_ptr<int64_t>(), cond.size(1), {sigma, a, b, K, lu, lb, lk},
                                       gz.mutable_data_ptr<scalar_t>());
  });
  return gz;
}

std::tuple<Tensor, Tensor> klm_cpu(const Tensor& z_, const std::optional<Tensor>& std_) {
  check_klm(z_, std_, "klm_loss");
  const Tensor z = as_contiguous(z_);
  check_finite(z, "z", "klm_loss");
  const std::optional<Tensor> given = std_.has_value() ? std::optional(as_contiguous(*std_)) : std::nullopt;
  if (given.has_value()) check_finite(*given, "std", "klm_loss", /*positive=*/true);
  const int64_t n = z.size(0), d = z.size(1);
  Tensor lse = alloc({n, d + 1}, z.scalar_type(), z);
  double loss = 0.0;
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    loss = cpu::klm_forward<scalar_t>(z.const_data_ptr<scalar_t>(),
                                      given.has_value() ? given->const_data_ptr<scalar_t>() : nullptr, n, d,
                                      lse.mutable_data_ptr<scalar_t>());
  });
  return {cpu_scalar_tensor(loss, z.scalar_type(), z), lse};
}

std::tuple<Tensor, Tensor> klm_backward_cpu(const Tensor& grad_loss, const Tensor& z_, const std::optional<Tensor>& std_,
                                            const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const Tensor z = as_contiguous(z_), lse = as_contiguous(lse_);
  const int64_t n = z.size(0), d = z.size(1);
  Tensor gz = alloc_like(z), gs = alloc({std_.has_value() ? d : 0}, z.scalar_type(), z);
  const std::optional<Tensor> given = std_.has_value() ? std::optional(as_contiguous(*std_)) : std::nullopt;
  const double grad = cpu_scalar(grad_loss);
  dispatch_floating(z.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    cpu::klm_backward<scalar_t>(grad, z.const_data_ptr<scalar_t>(),
                                given.has_value() ? given->const_data_ptr<scalar_t>() : nullptr,
                                lse.const_data_ptr<scalar_t>(), n, d, gz.mutable_data_ptr<scalar_t>(),
                                given.has_value() ? gs.mutable_data_ptr<scalar_t>() : nullptr);
  });
  return {gz, gs};
}

}  // namespace
}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CPU, m) {  // schemas: csrc/schemas.cpp
  m.impl("kde_grid", TORCH_BOX(&qkernels::kde_grid_cpu));
  m.impl("kde_grid_backward", TORCH_BOX(&qkernels::kde_grid_backward_cpu));
  m.impl("cliff_loss", TORCH_BOX(&qkernels::cliff_loss_cpu));
  m.impl("cliff_loss_backward", TORCH_BOX(&qkernels::cliff_loss_backward_cpu));
  m.impl("klm", TORCH_BOX(&qkernels::klm_cpu));
  m.impl("klm_backward", TORCH_BOX(&qkernels::klm_backward_cpu));
}
