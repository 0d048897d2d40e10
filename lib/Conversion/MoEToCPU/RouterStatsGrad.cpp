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
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

/// dlogits of router_stats_grad, row by row.
static void emitRouterStatsGrad(RouterStatsGradOp op, CpuKernelBuilder &kb, const LogitsRows &x) {
  Value rows = x.rows, numExperts = x.numExperts, x2 = x.x2;
  Value out = x.kernel.out(0), mask = op.getTokenMask();
  Value m = mask ? kb.buffer(mask) : Value();
  Value g = kb.buffer(op.getDmeanProbs());
  Value invW = kb.fdiv(kb.cF32(1.0), kb.load(kb.buffer(op.getWeightSum()), {}));
  const double negInf = -std::numeric_limits<double>::infinity();
  auto gChunk = [&](Value base) {
    return kb.vloadMasked(g, {base}, kb.sub(numExperts, base), 0.0);
  };
  Value rowBufs = kb.scratch(x.opts, MemRefType::get({kDyn}, kb.f32()),
                            {roundUp(kb, numExperts, kb.lanes())});
  kb.workers(x.opts, balanceBlocks(kb, rows), [&](Value block, Value worker) {
    Value probs = kb.workerSlice(rowBufs, worker);
    balanceEachBlockRow(kb, block, rows, [&](Value r) {
      Value w = m ? kb.loadF(m, {r}) : kb.cF32(1.0);
      Value scale = kb.fmul(w, invW);
      Value shift =
          balanceProbShift(kb, balanceRowSoftmax(kb, x2, r, numExperts));
      auto prob = [&](Value base) {
        return softmaxFromLogSumExp(
            kb, balanceChunk(kb, x2, r, base, numExperts, negInf), shift);
      };
      Value c = balanceRowSum(kb, numExperts, [&](Value base) {
        Value p = prob(base);
        kb.vstore(p, probs, {base});
        return kb.fmul(p, gChunk(base));
      });
      balanceEachChunk(kb, numExperts, [&](Value base) {
        Value d = routerStatsGradEntry(kb, kb.vload(probs, {base}),
                                       gChunk(base), c, scale);
        kb.vstoreMasked(d, out, {r, base}, kb.sub(numExperts, base));
      });
    });
  });
}

void populateRouterStatsGradLowering(RewritePatternSet &patterns,
                                     const KernelOptions &options) {
  patterns.add<LogitsRowKernel<RouterStatsGradOp, emitRouterStatsGrad>>(
      patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
