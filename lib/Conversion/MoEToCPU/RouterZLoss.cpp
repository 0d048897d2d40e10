//===- RouterZLoss.cpp - moe.router_z_loss -> CPU kernel ------------------===//
//
// Part of the MoE-MLIR project.
//
// The row log-sum-exps (softmax state, log space) squared and summed in
// blocks of kBalanceRowsPerBlock rows on the workers, each block into its own
// partial; the calling thread sums the partials in block order and divides by
// T: the same bits for any thread count.
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

namespace mlir::moe::cpu_lowering {
using namespace kernels;

/// The z-loss: Σ lse² over the rows, / T.
static void emitRouterZLoss(RouterZLossOp, CpuKernelBuilder &kb, const LogitsRows &x) {
  Value rows = x.rows, numExperts = x.numExperts, x2 = x.x2;
  Value blocks = balanceBlocks(kb, rows);
  Value partial = kb.alloc(MemRefType::get({kDyn}, kb.f32()), {blocks});
  kb.workers(x.opts, blocks, [&](Value block, Value) {
    Value sum = balanceBlockRowSum(kb, block, rows, [&](Value r) {
      Value lse =
          softmaxLogSumExp(kb, balanceRowSoftmax(kb, x2, r, numExperts));
      return kb.fmul(lse, lse);
    });
    kb.store(sum, partial, {block});
  });
  Value total = sumInOrder(kb, partial, blocks);
  kb.store(kb.fdiv(total, indexToF32(kb, rows)), x.kernel.out(0), {});
}

void populateRouterZLossLowering(RewritePatternSet &patterns,
                                 const KernelOptions &options) {
  patterns.add<LogitsRowKernel<RouterZLossOp, emitRouterZLoss>>(
      patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
