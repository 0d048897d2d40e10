//===- RouterStats.cpp - moe.router_stats -> CPU kernel -------------------===//
//
// Part of the MoE-MLIR project.
//
// One pass over the logits. The tokens are cut into blocks of
// kBalanceRowsPerBlock rows (MoE/Kernels/Balance.h), spread over the workers;
// each block owns a row of the partial buffers (Σ w·p and Σ w·[selected] per
// expert, Σ w). Per row: the softmax state over its lane chunks (max, then
// exp(x - max) kept in the worker's row buffer and summed), then
// p = exp(x - max) / Σ added into the block's partial, and the row's packed
// candidates (MoE/Kernels/TopK.h) of which k rounds of a vector max pick the
// selection (moe.topk_renorm's order), each adding w to its expert's count.
// Then the calling thread sums the block partials in block order and divides
// by W. No partial depends on which worker ran the block: the same bits for
// any thread count.
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"
#include "MoE/Kernels/TopK.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

/// The counts, the mean probabilities and W of router_stats.
static void emitRouterStats(RouterStatsOp op, CpuKernelBuilder &kb, const LogitsRows &x) {
  Value rows = x.rows, numExperts = x.numExperts, x2 = x.x2;
  Value mask = op.getTokenMask();
  Value m = mask ? kb.buffer(mask) : Value();
  const int64_t lanes = kb.lanes(), cand = lanes / 2;
  Value padded = roundUp(kb, numExperts, lanes);
  Value blocks = balanceBlocks(kb, rows);
  auto f32Dyn2 = MemRefType::get({kDyn, kDyn}, kb.f32());
  Value probSum = kb.alloc(f32Dyn2, {blocks, padded});
  Value countSum = kb.alloc(f32Dyn2, {blocks, padded});
  Value weightSum = kb.alloc(MemRefType::get({kDyn}, kb.f32()), {blocks});
  Value candidates =
      kb.scratch(x.opts, MemRefType::get({kDyn}, kb.i64()), {padded});
  Value numExpertsI32 = kb.castInt(numExperts, kb.i32());
  Value zeroV = kb.constLike(kb.vf32(), 0.0);
  Value noneV = noCandidate(kb, VectorType::get({cand}, kb.i64()));
  int64_t topk = op.getK();
  // A static E that is a multiple of the candidate lanes: plain loads.
  int64_t staticE = cast<RankedTensorType>(op.getLogits().getType()).getDimSize(1);
  bool fullCands = !ShapedType::isDynamic(staticE) && staticE % cand == 0;

  Value expRows = kb.scratch(x.opts, MemRefType::get({kDyn}, kb.f32()), {padded});
  kb.workers(x.opts, blocks, [&](Value block, Value worker) {
    Value cands = kb.workerSlice(candidates, worker);
    Value exps = kb.workerSlice(expRows, worker);
    balanceEachChunk(kb, padded, [&](Value base) {
      kb.vstore(zeroV, probSum, {block, base});
      kb.vstore(zeroV, countSum, {block, base});
    });
    Value total = balanceBlockRowSum(kb, block, rows, [&](Value r) {
      Value w = m ? kb.loadF(m, {r}) : kb.cF32(1.0);
      // p = exp(x - max) / Σ from the row buffer (1/Σ read as 0 for a
      // row of -inf, whose exps are 0: p = 0; NaN stays NaN).
      SoftmaxState row = balanceRowSoftmax(kb, x2, r, numExperts, exps);
      Value none = kb.cmpf(arith::CmpFPredicate::OEQ, row.sum, kb.cF32(0.0));
      Value inv = kb.splat(
          kb.select(none, kb.cF32(0.0), kb.fdiv(kb.cF32(1.0), row.sum)), lanes);
      Value wV = kb.splat(w, lanes);
      balanceEachChunk(kb, numExperts, [&](Value base) {
        Value p = kb.fmul(kb.vload(exps, {base}), inv);
        Value sum = kb.vload(probSum, {block, base});
        // w · p rounded, then added: PyTorch's (w * p).sum order.
        kb.vstore(kb.fadd(sum, kb.fmul(wV, p)), probSum, {block, base});
      });
      // The candidates (key, index) of the row; past E: none.
      Value candChunks = kb.ceilDiv(numExperts, kb.idx(cand));
      kb.forLoop(kb.idx(0), candChunks, kb.idx(1), [&](Value c) {
        Value base = kb.mul(c, kb.idx(cand));
        Value x = fullCands
                      ? kb.vload(x2, {r, base}, cand)
                      : kb.vloadMasked(x2, {r, base}, kb.sub(numExperts, base),
                                      0.0, cand);
        Value lane = kb.iota(kb.castInt(base, kb.i32()), cand);
        Value packed = packCandidate(kb, orderedKey(kb, x), lane);
        Value in = kb.lt(lane, kb.splat(numExpertsI32, cand));
        kb.vstore(kb.select(in, packed, noneV), cands, {base});
      });
      kb.forLoop(kb.idx(0), kb.idx(topk), kb.idx(1),
                ValueRange{kb.cI64(std::numeric_limits<int64_t>::max())},
                [&](Value, ValueRange prev) -> SmallVector<Value> {
                  Value pick = bestCandidateBelow(kb, cands, kb.idx(0),
                                                  candChunks, prev[0]);
                  Value e = kb.castInt(candidateIndex(kb, pick), kb.index());
                  Value c = kb.load(countSum, {block, e});
                  kb.store(kb.fadd(c, w), countSum, {block, e});
                  return {pick};
                });
      return w;
    });
    kb.store(total, weightSum, {block});
  });

  // The block partials in block order.
  Value w = sumInOrder(kb, weightSum, blocks);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value wV = kb.splat(w, lanes);
  balanceEachChunk(kb, numExperts, [&](Value base) {
    SmallVector<Value> sums =
        kb.forLoop(c0, blocks, c1, ValueRange{zeroV, zeroV},
                  [&](Value b, ValueRange acc) -> SmallVector<Value> {
                    return {kb.fadd(acc[0], kb.vload(countSum, {b, base})),
                            kb.fadd(acc[1], kb.vload(probSum, {b, base}))};
                  });
    Value count = kb.sub(numExperts, base);
    kb.vstoreMasked(sums[0], x.kernel.out(0), {base}, count);
    kb.vstoreMasked(kb.fdiv(sums[1], wV), x.kernel.out(1), {base}, count);
  });
  kb.store(w, x.kernel.out(2), {});
}

void populateRouterStatsLowering(RewritePatternSet &patterns,
                                 const KernelOptions &options) {
  patterns.add<LogitsRowKernel<RouterStatsOp, emitRouterStats>>(
      patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
