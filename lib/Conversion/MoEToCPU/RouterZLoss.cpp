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

  LogicalResult emit(RouterZLossOp op, CpuKernelBuilder &kb,
                     PatternRewriter &rw) const override {
    Value logits = op.getLogits();
    SmallVector<Value> sz = kb.sizes(logits);
    Value rows = sz[0], numExperts = sz[1];
    KernelScope kernel(kb, {logits}, KernelScope::outsOf(op, {{}}));
    Value x2 = kb.buffer(logits);
    Value blocks = balanceBlocks(kb, rows);
    Value partial = kb.alloc(MemRefType::get({kDyn}, kb.f32()), {blocks});
    kb.workers(opts, blocks, [&](Value block, Value) {
      Value sum = balanceBlockRowSum(kb, block, rows, [&](Value r) {
        Value lse =
            softmaxLogSumExp(kb, balanceRowSoftmax(kb, x2, r, numExperts));
        return kb.fmul(lse, lse);
      });
      kb.store(sum, partial, {block});
    });
    Value total = sumInOrder(kb, partial, blocks);
    kb.store(kb.fdiv(total, indexToF32(kb, rows)), kernel.out(0), {});
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateRouterZLossKernel, RouterZLossKernel)

} // namespace mlir::moe::cpu
