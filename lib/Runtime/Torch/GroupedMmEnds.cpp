//===- GroupedMmEnds.cpp - moe_mlir::grouped_mm_ends with no Python call --===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CPU and AutogradCPU kernels of moe_mlir::grouped_mm_ends and the CPU
// kernel of moe_mlir::grouped_mm_ends_backward: the op the moe backend puts in
// place of transformers' grouped_mm_fallback (python/moe_mlir/experts.py
// defines both ops, their fakes, and their Python bodies for other devices).
//
// Why in C++: a decode step calls the op twice per MoE layer on a few rows,
// and through the Python custom op (its autograd wrapper, then its body) a
// call took ~17 us of which the grouped GEMM (grouped_mm_cpu) was ~4 us
// (E = 32, two rows, one thread). Here the call goes from the dispatcher to
// the kernel with no Python in between.
//
// * f32/f64 operands of one dtype: the extension's grouped GEMM
//   (moe_mlir::grouped_mm_cpu / grouped_mm_backward_cpu, ExpertOps.cpp),
//   called through the dispatcher.
// * Other dtypes: transformers' loop, one at::mm per expert with rows (what
//   the Python body does there by calling transformers' own op).
// * Autograd: grad_x and grad_w from the backward op, below autograd, both
//   contiguous (the fake's layout: in a compiled backward a w that is a view
//   can arrive with other strides than its fake had), grad_w in w's own
//   layout with `transposed` (an nn.Linear weight: no transposing copy when
//   autograd accumulates it into the parameter).
//
// The argument checks are the Python ones (ValueError, the same words), made
// before anything is allocated.
//
//===----------------------------------------------------------------------===//

#include "AutogradOps.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using moe_torch::Op;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using GroupedSig = Tensor(const Tensor &, const Tensor &, const Tensor &,
                          bool);
using GroupedBwdSig = std::tuple<Tensor, Tensor>(const Tensor &,
                                                 const Tensor &,
                                                 const Tensor &,
                                                 const Tensor &, bool, bool);
using EndsBwdSig = std::tuple<Tensor, Tensor>(const Tensor &, const Tensor &,
                                              const Tensor &, const Tensor &,
                                              bool);

void checkEnds(const Tensor &x, const Tensor &w, const Tensor &offs,
               bool transposed) {
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 3 &&
                        x.size(1) == w.size(transposed ? 2 : 1),
                    "grouped_mm_ends: x must be [S, K] and w [E, K, N] ([E, N, "
                    "K] with transposed), got ", x.sizes(), " and ",
                    w.sizes());
  TORCH_CHECK_TYPE(offs.scalar_type() == at::kInt ||
                       offs.scalar_type() == at::kLong,
                   "grouped_mm_ends: offs (the ends) must be int32 or int64, "
                   "got ", offs.scalar_type());
  TORCH_CHECK_VALUE(offs.dim() == 1 && offs.size(0) == w.size(0),
                    "grouped_mm_ends: offs must be [E] = [", w.size(0),
                    "] (the ends), got ", offs.sizes());
}

/// Operands the extension's grouped GEMM takes (its other checks, such as
/// the ends' order, are its own).
bool native(const Tensor &x, const Tensor &w) {
  auto dt = x.scalar_type();
  return (dt == at::kFloat || dt == at::kDouble) && w.scalar_type() == dt &&
         w.device().is_cpu();
}

/// The experts' row ranges [start, end) from the ends, with transformers'
/// meaning (each range starts at the previous end).
std::vector<std::pair<int64_t, int64_t>> rangesOf(const Tensor &offs,
                                                  int64_t S) {
  Tensor o = offs.to(at::kLong).contiguous();
  const int64_t *p = o.const_data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> r;
  int64_t start = 0;
  for (int64_t e = 0; e < o.numel(); ++e) {
    int64_t end = p[e];
    TORCH_CHECK_VALUE(end >= start && end <= S, "grouped_mm_ends: the ends "
                      "must not decrease and stay within the ", S,
                      " rows, got ", end, " after ", start, " (expert ", e,
                      ")");
    r.emplace_back(start, end);
    start = end;
  }
  return r;
}

/// w as [E, K, N].
Tensor kn(const Tensor &w, bool transposed) {
  return transposed ? w.transpose(1, 2) : w;
}

Tensor groupedMmEnds(const Tensor &x, const Tensor &w, const Tensor &offs,
                     bool transposed) {
  checkEnds(x, w, offs, transposed);
  if (native(x, w)) {
    static const Op<GroupedSig> op("moe_mlir::grouped_mm_cpu");
    return op(x, w, offs, transposed);
  }
  Tensor wk = kn(w, transposed);
  Tensor out = at::zeros({x.size(0), wk.size(2)}, x.options());
  auto ranges = rangesOf(offs, x.size(0));
  for (size_t e = 0; e < ranges.size(); ++e) {
    auto [a, b] = ranges[e];
    if (b == a)
      continue;
    Tensor rows = out.narrow(0, a, b - a);
    at::mm_out(rows, x.narrow(0, a, b - a), wk[e]);
  }
  return out;
}

std::tuple<Tensor, Tensor> groupedMmEndsBackward(const Tensor &grad,
                                                 const Tensor &x,
                                                 const Tensor &w,
                                                 const Tensor &offs,
                                                 bool transposed) {
  checkEnds(x, w, offs, transposed);
  Tensor wk = kn(w, transposed);
  TORCH_CHECK_VALUE(grad.dim() == 2 && grad.size(0) == x.size(0) &&
                        grad.size(1) == wk.size(2),
                    "grouped_mm_ends_backward: grad must be [", x.size(0),
                    ", ", wk.size(2), "], got ", grad.sizes());
  if (native(x, w) && grad.scalar_type() == x.scalar_type()) {
    static const Op<GroupedBwdSig> op("moe_mlir::grouped_mm_backward_cpu");
    auto [gx, gw] = op(grad.contiguous(), x, w, offs, false, transposed);
    return {gx.contiguous(), gw.contiguous()};
  }
  Tensor gx = at::zeros_like(x, at::MemoryFormat::Contiguous);
  Tensor gw = at::zeros(wk.sizes(), wk.options()); // [E, K, N]
  auto ranges = rangesOf(offs, x.size(0));
  for (size_t e = 0; e < ranges.size(); ++e) {
    auto [a, b] = ranges[e];
    if (b == a)
      continue;
    Tensor g = grad.narrow(0, a, b - a), gxRows = gx.narrow(0, a, b - a);
    Tensor gwe = gw[e];
    at::mm_out(gxRows, g, wk[e].t());
    at::mm_out(gwe, x.narrow(0, a, b - a).t(), g);
  }
  return {gx, transposed ? gw.transpose(1, 2).contiguous() : gw};
}

class GroupedMmEndsFn : public torch::autograd::Function<GroupedMmEndsFn> {
public:
  static Tensor forward(AutogradContext *ctx, const Tensor &x, const Tensor &w,
                        const Tensor &offs, bool transposed) {
    ctx->save_for_backward({x, w, offs});
    ctx->saved_data["transposed"] = transposed;
    static const Op<GroupedSig> op("moe_mlir::grouped_mm_ends");
    return op(x, w, offs, transposed);
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    bool transposed = ctx->saved_data["transposed"].toBool();
    if (!grads[0].defined())
      return {Tensor(), Tensor(), Tensor(), Tensor()};
    static const Op<EndsBwdSig> op("moe_mlir::grouped_mm_ends_backward");
    auto [gx, gw] = op(grads[0], saved[0], saved[1], saved[2], transposed);
    return moe_torch::differentiableOnce(
        {ctx->needs_input_grad(0) ? gx : Tensor(),
         ctx->needs_input_grad(1) ? gw : Tensor(), Tensor(), Tensor()},
        "moe_mlir.grouped_mm_ends");
  }
};

Tensor groupedMmEndsAutograd(const Tensor &x, const Tensor &w,
                             const Tensor &offs, bool transposed) {
  if (!moe_torch::needsGraph(x, w)) {
    static const Op<GroupedSig> op("moe_mlir::grouped_mm_ends");
    return op(x, w, offs, transposed);
  }
  return GroupedMmEndsFn::apply(x, w, offs, transposed);
}

} // namespace

// The schemas are python/moe_mlir/experts.py's (torch.library.custom_op).
TORCH_LIBRARY_IMPL(moe_mlir, CPU, m) {
  m.impl("grouped_mm_ends", &groupedMmEnds);
  m.impl("grouped_mm_ends_backward", &groupedMmEndsBackward);
}

TORCH_LIBRARY_IMPL(moe_mlir, AutogradCPU, m) {
  m.impl("grouped_mm_ends", &groupedMmEndsAutograd);
}
