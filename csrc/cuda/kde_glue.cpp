// STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA) glue for the KDE kernels (klm, kde_grid; Cliff has no CUDA C++
// kernel: it runs on the triton backend): checks, allocation, stream, then the raw-pointer
// launchers of csrc/cuda/kde.cu. Built only with CUDA torch. The O(n d) pre- and post-processing of KLM
// (y = z / std, the loss mean, the std gradient) are kernels there too (klm_scale, klm_loss, klm_unscale).
#include "glue.h"
#include "kde.cuh"
#include "qkernels/kde.h"
#include "qkernels/kde_checks.h"

#include <cmath>

namespace qkernels {
namespace {

// y = z / s with s the given std or the default one; s, mean and var (the default std's, for its backward)
// are the rows of `stats` (3, d).
// Also zeroes `tickets` for the KLM kernel that follows.
template <typename scalar_t>
void scale(const Tensor& z, const std::optional<Tensor>& std, const Tensor& stats, const Tensor& y,
           const Tensor& tickets, cudaStream_t stream, const char* op) {
  const int64_t n = z.size(0), d = z.size(1);
  scalar_t* st = stats.mutable_data_ptr<scalar_t>();
  check_cuda(cuda::klm_scale<scalar_t>(z.const_data_ptr<scalar_t>(),
                                       std.has_value() ? std->const_data_ptr<scalar_t>() : nullptr, st, st + d,
                                       st + 2 * d, y.mutable_data_ptr<scalar_t>(), tickets.mutable_data_ptr<int>(),
                                       n, d, stream),
             op);
}

std::tuple<Tensor, Tensor> klm_cuda(const Tensor& z_, const std::optional<Tensor>& std_) {
  check_klm(z_, std_, "klm_loss");
  const OnDevice on(z_);
  const Tensor z = as_contiguous(z_);
  const std::optional<Tensor> std = std_.has_value() ? std::optional(as_contiguous(*std_)) : std::nullopt;
  const int64_t n = z.size(0), d = z.size(1);
  const ScalarType dtype = z.scalar_type();
  const double f = silverman_factor(double(n), double(d));
  const double c = double(d - 1) * std::log(double(n)) - double(d) * std::log(f);
  Tensor stats = alloc({3, d}, dtype, z), y = alloc_like(z), lse = alloc({n, d + 1}, dtype, z);
  Tensor loss = alloc({}, dtype, z);
  Tensor ws = alloc({cuda::klm_workspace(n, d, dtype == ScalarType::Double, false)}, dtype, z);
  Tensor tickets = alloc({cuda::klm_tickets(n)}, ScalarType::Int, z);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    scale<scalar_t>(z, std, stats, y, tickets, on.stream(), "klm");
    check_cuda(cuda::klm_fwd<scalar_t>(y.const_data_ptr<scalar_t>(), lse.mutable_data_ptr<scalar_t>(),
                                       ws.mutable_data_ptr<scalar_t>(), tickets.mutable_data_ptr<int>(), n, d,
                                       -0.5 / (f * f), on.stream()),
               "klm");
    check_cuda(cuda::klm_loss<scalar_t>(lse.const_data_ptr<scalar_t>(), loss.mutable_data_ptr<scalar_t>(), n, d, c,
                                        on.stream()),
               "klm");
  });
  return {loss, lse};
}

std::tuple<Tensor, Tensor> klm_backward_cuda(const Tensor& grad_loss, const Tensor& z_, const std::optional<Tensor>& std_,
                                             const Tensor& lse_) {
  check_klm_backward(grad_loss, z_, std_, lse_, "klm_backward");
  const OnDevice on(z_);
  const Tensor z = as_contiguous(z_), lse = as_contiguous(lse_);
  const std::optional<Tensor> std = std_.has_value() ? std::optional(as_contiguous(*std_)) : std::nullopt;
  const int64_t n = z.size(0), d = z.size(1);
  const ScalarType dtype = z.scalar_type();
  const Tensor gl = as_contiguous(to_dtype(grad_loss, dtype));  // a device scalar: no host sync
  const double f = silverman_factor(double(n), double(d));
  Tensor stats = alloc({3, d}, dtype, z), y = alloc_like(z), gy = alloc_like(z), gz = alloc_like(z);
  Tensor gs = alloc({std.has_value() ? d : 0}, dtype, z);
  Tensor ws = alloc({cuda::klm_workspace(n, d, dtype == ScalarType::Double, true)}, dtype, z);
  Tensor tickets = alloc({cuda::klm_tickets(n)}, ScalarType::Int, z);
  dispatch_floating(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    scale<scalar_t>(z, std, stats, y, tickets, on.stream(), "klm_backward");
    check_cuda(cuda::klm_bwd<scalar_t>(y.const_data_ptr<scalar_t>(), lse.const_data_ptr<scalar_t>(),
                                       gy.mutable_data_ptr<scalar_t>(), ws.mutable_data_ptr<scalar_t>(),
                                       tickets.mutable_data_ptr<int>(), n, d, -0.5 / (f * f), 1.0 / (f * f),
                                       1.0 / double(n), on.stream()),
               "klm_backward");
    // z = y * std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j, plus the default std's share in dz
    const scalar_t* st = stats.const_data_ptr<scalar_t>();
    check_cuda(cuda::klm_unscale<scalar_t>(gy.const_data_ptr<scalar_t>(), gl.const_data_ptr<scalar_t>(),
                                           z.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(), st, st + d,
                                           st + 2 * d, !std.has_value(), gz.mutable_data_ptr<scalar_t>(),
                                           std.has_value() ? gs.mutable_data_ptr<scalar_t>() : nullptr, n, d,
                                           on.stream()),
               "klm_backward");
  });
  return {gz, gs};
}

Tensor kde_grid_cuda(const Tensor& points_, const Tensor& samples_, double sigma, bool derivative) {
  check_kde_grid(points_, samples_, sigma, "kde_grid");
  const OnDevice on(points_);
  const Tensor points = as_contiguous(points_), samples = as_contiguous(samples_);
  Tensor out = alloc_like(points);
  dispatch_floating(points.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::kde_grid_fwd<scalar_t>(points.const_data_ptr<scalar_t>(), samples.const_data_ptr<scalar_t>(),
                                            out.mutable_data_ptr<scalar_t>(), samples.size(0), samples.size(1),
                                            points.size(1), sigma, derivative, on.stream()),
               "kde_grid");
  });
  return out;
}

std::tuple<Tensor, Tensor> kde_grid_backward_cuda(const Tensor& grad_, const Tensor& points_, const Tensor& samples_,
                                                  double sigma, bool derivative) {
  check_kde_grid_backward(grad_, points_, samples_, sigma, "kde_grid_backward");
  const OnDevice on(points_);
  const Tensor points = as_contiguous(points_), samples = as_contiguous(samples_);
  const Tensor grad = as_contiguous(to_dtype(grad_, points.scalar_type()));
  Tensor gp = alloc_like(points), gs = alloc_like(samples);
  dispatch_floating(points.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    check_cuda(cuda::kde_grid_bwd<scalar_t>(grad.const_data_ptr<scalar_t>(), points.const_data_ptr<scalar_t>(),
                                            samples.const_data_ptr<scalar_t>(), gp.mutable_data_ptr<scalar_t>(),
                                            gs.mutable_data_ptr<scalar_t>(), samples.size(0), samples.size(1),
                                            points.size(1), sigma, derivative, on.stream()),
               "kde_grid_backward");
  });
  return {gp, gs};
}

}  // namespace
}  // namespace qkernels

STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA, m) {
  m.impl("kde_grid", TORCH_BOX(&qkernels::kde_grid_cuda));
  m.impl("kde_grid_backward", TORCH_BOX(&qkernels::kde_grid_backward_cuda));
  m.impl("klm", TORCH_BOX(&qkernels::klm_cuda));
  m.impl("klm_backward", TORCH_BOX(&qkernels::klm_backward_cuda));
}
