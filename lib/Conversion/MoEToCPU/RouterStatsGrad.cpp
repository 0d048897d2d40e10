//===- RouterStatsGrad.cpp - moe.router_stats_grad -> CPU kernel ----------===//
//
// Part of the MoE-MLIR project.
//
// Rows are independent: blocks of kBalanceRowsPerBlock rows go to the
// workers. Per row: the softmax state (log space), p = exp(x - lse) into the
// worker's row buffer while c = Σ p·g accumulates, then
// dlogits = (w/W) · p · (g - c) (MoE/Kernels/Balance.h) from the buffer: one
// exp per logit beyond the softmax's.
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
struct RouterStatsGradKernel : KernelPattern<RouterStatsGradOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(RouterStatsGradOp op, CK &k,
                     PatternRewriter &rw) const override {
    Value logits = op.getLogits(), mask = op.getTokenMask();
    SmallVector<Value> sz = k.sizes(logits);
    Value rows = sz[0], numExperts = sz[1];
    KernelScope kernel(k, {logits, mask, op.getWeightSum(), op.getDmeanProbs()},
                       KernelScope::outsOf(op, {sz}));
    Value x2 = k.buffer(logits), out = kernel.out(0);
    Value m = mask ? k.buffer(mask) : Value();
    Value g = k.buffer(op.getDmeanProbs());
    Value invW = k.fdiv(k.cF32(1.0), k.load(k.buffer(op.getWeightSum()), {}));
    const double negInf = -std::numeric_limits<double>::infinity();
    auto gChunk = [&](Value base) {
      return k.vloadMasked(g, {base}, k.sub(numExperts, base), 0.0);
    };
    Value rowBufs = k.scratch(opts, MemRefType::get({kDyn}, k.f32()),
                              {roundUp(k, numExperts, k.lanes())});
    k.workers(opts, balanceBlocks(k, rows), [&](Value block, Value worker) {
      Value probs = k.workerSlice(rowBufs, worker);
      balanceEachBlockRow(k, block, rows, [&](Value r) {
        Value w = m ? k.loadF(m, {r}) : k.cF32(1.0);
        Value scale = k.fmul(w, invW);
        Value shift =
            balanceProbShift(k, balanceRowSoftmax(k, x2, r, numExperts));
        auto prob = [&](Value base) {
          return softmaxFromLogSumExp(
              k, balanceChunk(k, x2, r, base, numExperts, negInf), shift);
        };
        Value c = balanceRowSum(k, numExperts, [&](Value base) {
          Value p = prob(base);
          k.vstore(p, probs, {base});
          return k.fmul(p, gChunk(base));
        });
        balanceEachChunk(k, numExperts, [&](Value base) {
          Value d = routerStatsGradEntry(k, k.vload(probs, {base}),
                                         gChunk(base), c, scale);
          k.vstoreMasked(d, out, {r, base}, k.sub(numExperts, base));
        });
      });
    });
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateRouterStatsGradKernel, RouterStatsGradKernel)

} // namespace mlir::moe::cpu
