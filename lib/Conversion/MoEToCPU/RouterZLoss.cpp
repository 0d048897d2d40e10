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
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
struct RouterZLossKernel : KernelPattern<RouterZLossOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(RouterZLossOp op, CK &k,
                     PatternRewriter &rw) const override {
    Value logits = op.getLogits();
    SmallVector<Value> sz = k.sizes(logits);
    Value rows = sz[0], numExperts = sz[1];
    KernelScope kernel(k, {logits}, KernelScope::outsOf(op, {{}}));
    Value x2 = k.buffer(logits);
    Value blocks = balanceBlocks(k, rows);
    Value partial = k.alloc(MemRefType::get({kDyn}, k.f32()), {blocks});
    k.workers(opts, blocks, [&](Value block, Value) {
      Value sum = balanceBlockRowSum(k, block, rows, [&](Value r) {
        Value lse =
            softmaxLogSumExp(k, balanceRowSoftmax(k, x2, r, numExperts));
        return k.fmul(lse, lse);
      });
      k.store(sum, partial, {block});
    });
    Value total = sumInOrder(k, partial, blocks);
    k.store(k.fdiv(total, indexToF32(k, rows)), kernel.out(0), {});
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateRouterZLossKernel, RouterZLossKernel)

} // namespace mlir::moe::cpu
