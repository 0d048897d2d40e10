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
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
struct RouterZLossGradKernel : KernelPattern<RouterZLossGradOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(RouterZLossGradOp op, CK &k,
                     PatternRewriter &rw) const override {
    Value logits = op.getLogits();
    SmallVector<Value> sz = k.sizes(logits);
    Value rows = sz[0], numExperts = sz[1];
    KernelScope kernel(k, {logits, op.getDloss()},
                       KernelScope::outsOf(op, {sz}));
    Value x2 = k.buffer(logits), out = kernel.out(0);
    Value dloss = k.load(k.buffer(op.getDloss()), {});
    Value scale = k.fdiv(k.fmul(k.cF32(2.0), dloss), indexToF32(k, rows));
    const double negInf = -std::numeric_limits<double>::infinity();
    k.workers(opts, balanceBlocks(k, rows), [&](Value block, Value) {
      balanceEachBlockRow(k, block, rows, [&](Value r) {
        Value lse =
            softmaxLogSumExp(k, balanceRowSoftmax(k, x2, r, numExperts));
        balanceEachChunk(k, numExperts, [&](Value base) {
          Value p = softmaxFromLogSumExp(
              k, balanceChunk(k, x2, r, base, numExperts, negInf), lse);
          k.vstoreMasked(zLossGradEntry(k, p, lse, scale), out, {r, base},
                         k.sub(numExperts, base));
        });
      });
    });
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateRouterZLossGradKernel, RouterZLossGradKernel)

} // namespace mlir::moe::cpu
