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
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"
#include "MoE/Kernels/TopK.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
struct RouterStatsKernel : KernelPattern<RouterStatsOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(RouterStatsOp op, CK &k,
                     PatternRewriter &rw) const override {
    Value logits = op.getLogits(), mask = op.getTokenMask();
    SmallVector<Value> sz = k.sizes(logits);
    Value rows = sz[0], numExperts = sz[1];
    KernelScope kernel(
        k, {logits, mask},
        KernelScope::outsOf(op, {{numExperts}, {numExperts}, {}}));
    Value x2 = k.buffer(logits);
    Value m = mask ? k.buffer(mask) : Value();
    const int64_t lanes = k.lanes(), cand = lanes / 2;
    Value padded = roundUp(k, numExperts, lanes);
    Value blocks = balanceBlocks(k, rows);
    auto f32Dyn2 = MemRefType::get({kDyn, kDyn}, k.f32());
    Value probSum = k.alloc(f32Dyn2, {blocks, padded});
    Value countSum = k.alloc(f32Dyn2, {blocks, padded});
    Value weightSum = k.alloc(MemRefType::get({kDyn}, k.f32()), {blocks});
    Value candidates =
        k.scratch(opts, MemRefType::get({kDyn}, k.i64()), {padded});
    Value numExpertsI32 = k.castInt(numExperts, k.i32());
    Value zeroV = k.constLike(k.vf32(), 0.0);
    Value noneV = noCandidate(k, VectorType::get({cand}, k.i64()));
    int64_t topk = op.getK();
    // A static E that is a multiple of the candidate lanes: plain loads.
    int64_t staticE = cast<RankedTensorType>(logits.getType()).getDimSize(1);
    bool fullCands = !ShapedType::isDynamic(staticE) && staticE % cand == 0;

    Value expRows = k.scratch(opts, MemRefType::get({kDyn}, k.f32()), {padded});
    k.workers(opts, blocks, [&](Value block, Value worker) {
      Value cands = k.workerSlice(candidates, worker);
      Value exps = k.workerSlice(expRows, worker);
      balanceEachChunk(k, padded, [&](Value base) {
        k.vstore(zeroV, probSum, {block, base});
        k.vstore(zeroV, countSum, {block, base});
      });
      Value total = balanceBlockRowSum(k, block, rows, [&](Value r) {
        Value w = m ? k.loadF(m, {r}) : k.cF32(1.0);
        // p = exp(x - max) / Σ from the row buffer (1/Σ read as 0 for a
        // row of -inf, whose exps are 0: p = 0; NaN stays NaN).
        SoftmaxState row = balanceRowSoftmax(k, x2, r, numExperts, exps);
        Value none = k.cmpf(arith::CmpFPredicate::OEQ, row.sum, k.cF32(0.0));
        Value inv = k.splat(
            k.select(none, k.cF32(0.0), k.fdiv(k.cF32(1.0), row.sum)), lanes);
        Value wV = k.splat(w, lanes);
        balanceEachChunk(k, numExperts, [&](Value base) {
          Value p = k.fmul(k.vload(exps, {base}), inv);
          Value sum = k.vload(probSum, {block, base});
          // w · p rounded, then added: PyTorch's (w * p).sum order.
          k.vstore(k.fadd(sum, k.fmul(wV, p)), probSum, {block, base});
        });
        // The candidates (key, index) of the row; past E: none.
        Value candChunks = k.ceilDiv(numExperts, k.idx(cand));
        k.forLoop(k.idx(0), candChunks, k.idx(1), [&](Value c) {
          Value base = k.mul(c, k.idx(cand));
          Value x = fullCands
                        ? k.vload(x2, {r, base}, cand)
                        : k.vloadMasked(x2, {r, base}, k.sub(numExperts, base),
                                        0.0, cand);
          Value lane = k.iota(k.castInt(base, k.i32()), cand);
          Value packed = packCandidate(k, orderedKey(k, x), lane);
          Value in = k.lt(lane, k.splat(numExpertsI32, cand));
          k.vstore(k.select(in, packed, noneV), cands, {base});
        });
        k.forLoop(k.idx(0), k.idx(topk), k.idx(1),
                  ValueRange{k.cI64(std::numeric_limits<int64_t>::max())},
                  [&](Value, ValueRange prev) -> SmallVector<Value> {
                    Value pick = bestCandidateBelow(k, cands, k.idx(0),
                                                    candChunks, prev[0]);
                    Value e = k.castInt(candidateIndex(k, pick), k.index());
                    Value c = k.load(countSum, {block, e});
                    k.store(k.fadd(c, w), countSum, {block, e});
                    return {pick};
                  });
        return w;
      });
      k.store(total, weightSum, {block});
    });

    // The block partials in block order.
    Value w = sumInOrder(k, weightSum, blocks);
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value wV = k.splat(w, lanes);
    balanceEachChunk(k, numExperts, [&](Value base) {
      SmallVector<Value> sums =
          k.forLoop(c0, blocks, c1, ValueRange{zeroV, zeroV},
                    [&](Value b, ValueRange acc) -> SmallVector<Value> {
                      return {k.fadd(acc[0], k.vload(countSum, {b, base})),
                              k.fadd(acc[1], k.vload(probSum, {b, base}))};
                    });
      Value count = k.sub(numExperts, base);
      k.vstoreMasked(sums[0], kernel.out(0), {base}, count);
      k.vstoreMasked(k.fdiv(sums[1], wV), kernel.out(1), {base}, count);
    });
    k.store(w, kernel.out(2), {});
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateRouterStatsKernel, RouterStatsKernel)

} // namespace mlir::moe::cpu
