//===- TopkRenormGrad.cpp - moe.topk_renorm_grad -> CPU kernel ------------===//
//
// Part of the MoE-MLIR project.
//
// Rows are independent: blocks of 32 rows go to the workers. Per row (O(K)):
// the selected values are read through the forward's indices, the weights
// recomputed with the forward's formula (kernels::topkWeight), c = Σ dw·w, and
// the gradient written: zeros (or -s_j c for every entry of a logits gate
// without renormalization), then kernels::topkWeightGrad at the selected
// entries. An index outside [0, K) is read clamped and never written.
//
// With 4 to 16 selections (a static k: every router's), the row keeps its k
// selections in the lanes of one vector instead (the same formulas, on
// vectors), and writes the row in vectors, instead of k-long scalar loops
// with a scalar exp per step (torch.ops.moe.topk_renorm_backward at T=16384
// K=64 k=8: 1.16 -> 0.42 ms, K=256: 1.7 -> 0.74 ms; 2 threads, Intel Xeon).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

#include <limits>
#include <optional>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;
/// Below 4 selections the scalar loops are cheaper than the vector's
/// reductions (T=16384 K=8 k=2: 0.20 ms scalar, 0.27 in lanes).
constexpr int64_t kMinLaneSel = 4;

/// kernels::emitTopkGradRow with the `sel` (<= kLanes, static) selections of
/// row `r` in the lanes of one vector: lanes >= sel are -inf padding (exp
/// gives 0 there, without forming a subnormal: CpuKernelBuilder::exp), kept out
/// of the sums.
void emitTopkGradRowInLanes(CpuKernelBuilder &kb, const TopkSpec &spec, Value r,
                            Value s2, Value i2, Value g2, Value o2,
                            Value numExperts, int64_t sel) {
  // 8 lanes when they hold the selection (one ymm: cheaper reductions).
  const int64_t n = sel <= 8 ? 8 : kLanes;
  VectorType vt = kb.vf32(n);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value zeroV = kb.constLike(vt, 0.0), negInfV = kb.negInfLike(vt);
  // The selected indices and values (an index outside [0, K) reads entry 0
  // and is never written, as in the scalar row).
  SmallVector<Value> index, inRange;
  Value vals = negInfV;
  for (int64_t l = 0; l < sel; ++l) {
    Value j = kb.castInt(kb.load(i2, {r, kb.idx(l)}), kb.index());
    Value ok = kb.andI(kb.cmpi(arith::CmpIPredicate::sge, j, c0),
                      kb.cmpi(arith::CmpIPredicate::slt, j, numExperts));
    index.push_back(j);
    inRange.push_back(ok);
    Value v = kb.loadF(s2, {r, kb.select(ok, j, c0)});
    vals = vector::InsertOp::create(kb.b, v, vals, l);
  }
  Value live = kb.cmpi(arith::CmpIPredicate::slt,
                      kb.iota(kb.castInt(c0, kb.i32()), n),
                      kb.splat(kb.castInt(kb.idx(sel), kb.i32()), n));
  auto sumLive = [&](Value v) { return kb.sum(kb.select(live, v, zeroV)); };
  Value v0, selSum, denseMax, denseSum;
  if (spec.logits) {
    v0 = kb.maxf(vals);
    selSum = sumLive(topkSelectionTerm(kb, spec, vals, v0));
    if (!spec.renormalize) {
      // Over the row's K entries, in vectors (-inf padding: exp gives 0).
      Value chunks = kb.ceilDiv(numExperts, kb.idx(n));
      auto chunk = [&](Value c) {
        Value col = kb.mul(c, kb.idx(n));
        return kb.vloadMasked(s2, {r, col}, kb.sub(numExperts, col),
                             -std::numeric_limits<double>::infinity(), n);
      };
      RowSoftmaxStats dense = rowSoftmaxStatsLoop(
          kb, vt, c0, chunks, c1, chunk, [&](Value v) { return kb.maxf(v); },
          [&](Value v) { return kb.sum(v); });
      denseMax = dense.max;
      denseSum = dense.sum;
    }
  } else {
    selSum = sumLive(topkSelectionTerm(kb, spec, vals, v0));
  }
  auto splat = [&](Value x) { return x ? kb.splat(x, n) : Value(); };
  auto weight = [&](Value v) {
    return topkWeight(kb, spec, v, splat(v0), splat(selSum), splat(denseMax),
                      splat(denseSum));
  };
  Value w = weight(vals);
  Value g = kb.vloadMasked(g2, {r, c0}, kb.idx(sel), 0.0, n);
  Value c = sumLive(kb.fmul(g, w));
  // Every entry: -w_j c (logits without renormalization), else 0.
  Value chunks = kb.ceilDiv(numExperts, kb.idx(n));
  kb.forLoop(c0, chunks, c1, [&](Value ch) {
    Value col = kb.mul(ch, kb.idx(n));
    Value count = kb.sub(numExperts, col);
    Value base = zeroV;
    if (spec.logits && !spec.renormalize)
      base = kb.fsub(zeroV, kb.fmul(weight(kb.vloadMasked(s2, {r, col}, count,
                                                       0.0, n)),
                                  kb.splat(c, n)));
    kb.vstoreMasked(base, o2, {r, col}, count);
  });
  // The selected entries, in the scalar row's order (a repeated index: the
  // last one wins).
  Value d = topkWeightGrad(kb, spec, g, w, kb.splat(c, n), splat(selSum));
  for (int64_t l = 0; l < sel; ++l)
    kb.ifThen(inRange[l], [&] {
      kb.store(vector::ExtractOp::create(kb.b, d, l), o2, {r, index[l]});
    });
}

} // namespace

template <>
LogicalResult CPUKernel<TopkRenormGradOp>::emit(TopkRenormGradOp op,
                                                CpuKernelBuilder &kb,
                                                PatternRewriter &rw) const {
  if (cast<RankedTensorType>(op.getScores().getType()).getRank() < 2)
    return rw.notifyMatchFailure(op, "rank-1 scores: portable lowering");
  if (hasStaticZeroSize(op))
    return rw.notifyMatchFailure(op, "a static zero-sized dimension");
  KernelScope kernel(
      kb, {op.getScores(), op.getIndices(), op.getDw()},
      KernelScope::outsOf(op, {kb.sizes(op.getScores())}));
  Value scores = kb.buffer(op.getScores());
  Value out = kernel.out(0);
  Value s2 = collapseRows(kb, scores), o2 = collapseRows(kb, out);
  Value i2 = collapseRows(kb, kb.buffer(op.getIndices()));
  Value g2 = collapseRows(kb, kb.buffer(op.getDw()));
  Value rows = kb.dim(s2, 0), numExperts = kb.dim(s2, 1), sel = kb.dim(i2, 1);

  TopkSpec spec = topkSpecOf(op);
  // A static k in [kMinLaneSel, kLanes]: the selections fit one vector.
  std::optional<int64_t> selLanes;
  int64_t staticSel = cast<MemRefType>(i2.getType()).getDimSize(1);
  if (!ShapedType::isDynamic(staticSel) && staticSel >= kMinLaneSel &&
      staticSel <= kLanes)
    selLanes = staticSel;
  kb.workerRows(opts, rows, kRowsPerItem, [&](Value r) {
    if (selLanes)
      emitTopkGradRowInLanes(kb, spec, r, s2, i2, g2, o2, numExperts,
                             *selLanes);
    else
      emitTopkGradRow(kb, spec, r, s2, i2, g2, o2, numExperts, sel);
  });
  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
