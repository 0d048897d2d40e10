//===- RouteGrad.cpp - moe.route_grad -> CPU kernel -----------------------===//
//
// Part of the MoE-MLIR project.
//
// Rows are independent: blocks of 32 rows go to the workers. Per row: the k
// selected logits are read through the forward's indices, their scores f(x)
// and derivatives f'(x) computed together (kernels::routeScoreAndDerivative:
// a custom score region with its symbolic derivative, or a preset), the sums
// S = Σ f and C = Σ dw·f taken (renormalize), the row zeroed in vectors and
// a (dw - C/S) / S · f'(x) added at each selected expert
// (kernels::routeGradOfLogit). O(E + k) a row; nothing is saved by the
// forward besides its outputs.
//
// With a static k <= 16 (every router's) the k selections sit in the lanes
// of one vector (8 lanes up to k = 8), so f and f' are the vector polynomials
// of the forward kernel's scoring step instead of k scalar libm calls; other
// k run the same formulas in scalar loops. An index outside [0, E) is read
// clamped and never written; a repeated index accumulates.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Route.h"

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;

void zeroRow(CpuKernelBuilder &kb, Value out, Value r, Value numExperts) {
  Value zero = kb.constLike(kb.vf32(), 0.0);
  kb.forLoop(kb.idx(0), kb.ceilDiv(numExperts, kb.idx(kLanes)), kb.idx(1),
             [&](Value c) {
               Value col = kb.mul(c, kb.idx(kLanes));
               kb.vstoreMasked(zero, out, {r, col}, kb.sub(numExperts, col));
             });
}

/// The row with its `sel` (static, <= kLanes) picks in the lanes of one
/// vector; pad lanes (x = 0) are kept out of the sums and never stored.
void emitRowInLanes(CpuKernelBuilder &kb, const RouteSpec &spec, Value x,
                    Value idx, Value dw, Value out, Value r, Value numExperts,
                    int64_t sel) {
  const int64_t n = sel <= 8 ? 8 : kLanes;
  VectorType vt = kb.vf32(n);
  Value zeroV = kb.constLike(vt, 0.0);
  SmallVector<RouteGradPick> picks;
  Value vals = zeroV;
  for (int64_t l = 0; l < sel; ++l) {
    picks.push_back(routeGradReadPick(kb, x, idx, r, kb.idx(l), numExperts));
    vals = vector::InsertOp::create(kb.b, picks.back().logit, vals, l);
  }
  auto [s, ds] = routeScoreAndDerivative(kb, spec, vals);
  Value g = kb.vloadMasked(dw, {r, kb.idx(0)}, kb.idx(sel), 0.0, n);
  Value sSum, cSum;
  if (spec.renormalize) {
    Value live = kb.cmpi(arith::CmpIPredicate::slt, kb.iota(kb.cI32(0), n),
                         kb.splat(kb.cI32(sel), n));
    sSum = kb.splat(kb.sum(kb.select(live, s, zeroV)), n);
    cSum = kb.splat(kb.sum(kb.select(live, kb.fmul(g, s), zeroV)), n);
  }
  Value d = routeGradOfLogit(kb, spec, g, ds, sSum, cSum);
  zeroRow(kb, out, r, numExperts);
  for (int64_t l = 0; l < sel; ++l)
    routeGradAddAt(kb, picks[l], vector::ExtractOp::create(kb.b, d, l), out, r);
}

/// The same in scalar loops over the picks (a dynamic or larger k).
void emitRow(CpuKernelBuilder &kb, const RouteSpec &spec, Value x, Value idx,
             Value dw, Value out, Value r, Value numExperts, Value sel) {
  auto [sSum, cSum] =
      routeGradRowSums(kb, spec, x, idx, dw, r, numExperts, sel);
  zeroRow(kb, out, r, numExperts);
  routeGradRowAdds(kb, spec, x, idx, dw, out, r, numExperts, sel, sSum, cSum);
}

} // namespace

template <>
LogicalResult CPUKernel<RouteGradOp>::emit(RouteGradOp op, CpuKernelBuilder &kb,
                                           PatternRewriter &rw) const {
  KernelScope kernel(kb, {op.getLogits(), op.getIndices(), op.getDw()},
                     KernelScope::outsOf(op, {kb.sizes(op.getLogits())}));
  Value x = kb.buffer(op.getLogits()), idx = kb.buffer(op.getIndices());
  Value dw = kb.buffer(op.getDw()), out = kernel.out(0);
  Value rows = kb.dim(x, 0), numExperts = kb.dim(x, 1);
  RouteSpec spec = routeGradSpecOf(op);
  int64_t staticSel = cast<MemRefType>(idx.getType()).getDimSize(1);
  bool inLanes = !ShapedType::isDynamic(staticSel) && staticSel <= kLanes;
  Value sel = kb.dim(idx, 1);
  kb.workerRows(opts, rows, kRowsPerItem, [&](Value r) {
    if (inLanes)
      emitRowInLanes(kb, spec, x, idx, dw, out, r, numExperts, staticSel);
    else
      emitRow(kb, spec, x, idx, dw, out, r, numExperts, sel);
  });
  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
