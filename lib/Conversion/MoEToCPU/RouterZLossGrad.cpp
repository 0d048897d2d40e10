//===- RouterZLossGrad.cpp - moe.router_z_loss_grad -> CPU kernel ---------===//
//
// Part of the MoE-MLIR project.
//
// Rows are independent: blocks of kBalanceRowsPerBlock rows on the workers.
// Per row: lse (softmax state), then dlogits = (2 dloss / T) · lse · p with
// p = exp(x - lse) (MoE/Kernels/Balance.h).
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

/// dlogits of router_z_loss_grad, row by row.
static void emitRouterZLossGrad(RouterZLossGradOp op, CpuKernelBuilder &kb, const LogitsRows &x) {
  Value rows = x.rows, numExperts = x.numExperts, x2 = x.x2;
  Value out = x.kernel.out(0);
  Value dloss = kb.load(kb.buffer(op.getDloss()), {});
  Value scale = kb.fdiv(kb.fmul(kb.cF32(2.0), dloss), indexToF32(kb, rows));
  const double negInf = -std::numeric_limits<double>::infinity();
  kb.workers(x.opts, balanceBlocks(kb, rows), [&](Value block, Value) {
    balanceEachBlockRow(kb, block, rows, [&](Value r) {
      Value lse =
          softmaxLogSumExp(kb, balanceRowSoftmax(kb, x2, r, numExperts));
      balanceEachChunk(kb, numExperts, [&](Value base) {
        Value p = softmaxFromLogSumExp(
            kb, balanceChunk(kb, x2, r, base, numExperts, negInf), lse);
        kb.vstoreMasked(zLossGradEntry(kb, p, lse, scale), out, {r, base},
                       kb.sub(numExperts, base));
      });
    });
  });
}

void populateRouterZLossGradLowering(RewritePatternSet &patterns,
                                     const KernelOptions &options) {
  patterns.add<LogitsRowKernel<RouterZLossGradOp, emitRouterZLossGrad>>(
      patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
