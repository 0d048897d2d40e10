//===- RouterZLoss.cpp - moe.router_z_loss(_grad) on the GPU --------------===//
//
// Part of the MoE-MLIR project.
//
// Behind the balance-kernels option (off until a GPU run has checked them).
// The maths are those of the CPU kernels (MoE/Kernels/Balance.h and
// OnlineSoftmax.h); only the thread layout is the GPU's:
//
//  * A warp per row for the log-sum-exp: the lanes stride over the experts
//    32 at a time, each chunk one online-softmax step (kernels::
//    onlineSoftmaxStep) with butterfly max/sum over the warp, so any E works
//    with a few registers.
//  * router_z_loss, deterministic without atomics: a block of 4 warps owns
//    the kBalanceRowsPerBlock rows of one row block (the CPU's blocks); the
//    warps leave each row's lse² in workgroup memory, and one thread sums
//    them in row order into the block's partial. A second kernel (one
//    thread) sums the partials in block order and divides by T: the CPU
//    kernel's order of additions, the same bits on every launch.
//  * router_z_loss_grad: a warp per row (rows independent), the row's lse
//    then one pass storing 2·dloss/T · lse · exp(x − lse).
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"
#include "Lowerings.h"

#include "MoE/Kernels/Balance.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

/// Threads of the row-block kernel of router_z_loss: 4 warps share the
/// kBalanceRowsPerBlock rows of a block.
static constexpr int64_t kZLossThreads = 128;

SoftmaxState mlir::moe::gpu_lowering::warpRowSoftmax(GpuKernelBuilder &kb,
                                                     Value x, Value row,
                                                     Value lane) {
  Value numExperts = kb.dim(x, 1);
  Value negInf = kb.cF32(-std::numeric_limits<double>::infinity());
  SoftmaxState start = softmaxStart(kb);
  auto reduceMax = [&](Value v) {
    return subgroupReduce(kb, v, ReduceKind::Max, kWarp);
  };
  auto reduceSum = [&](Value v) {
    return subgroupReduce(kb, v, ReduceKind::Sum, kWarp);
  };
  SmallVector<Value> state = kb.forLoop(
      kb.idx(0), numExperts, kb.idx(kWarp), {start.max, start.sum},
      [&](Value base, ValueRange acc) -> SmallVector<Value> {
        Value col = kb.add(base, lane);
        Value inRange = kb.lt(col, numExperts);
        // Lanes past E read column 0 (valid) and weigh nothing (-inf).
        Value safe = kb.select(inRange, col, kb.idx(0));
        Value v = kb.select(inRange, kb.loadF(x, {row, safe}), negInf);
        SoftmaxTile tile = onlineSoftmaxStep(kb, {acc[0], acc[1]}, {v},
                                             reduceMax, reduceSum);
        return {tile.next.max, tile.next.sum};
      });
  return {state[0], state[1]};
}

/// The row's log-sum-exp: -inf for a row of -inf, NaN for a row holding NaN.
static Value warpRowLogSumExp(GpuKernelBuilder &kb, Value x, Value row,
                              Value lane) {
  return softmaxLogSumExp(kb, warpRowSoftmax(kb, x, row, lane));
}

LogicalResult
RouterZLossToGPU::lower(RouterZLossOp op, OpAdaptor adaptor,
                        ConversionPatternRewriter &rewriter) const {
  auto lossType = cast<RankedTensorType>(op.getLoss().getType());
  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Value x = h.buffer(adaptor.getLogits());
  Value loss = h.allocLike(lossType, {});
  Value numRows = kb.dim(x, 0);
  Value blocks = kb.ceilDiv(numRows, kb.idx(kBalanceRowsPerBlock));
  Value partial = h.alloc(MemRefType::get({ShapedType::kDynamic}, kb.f32()),
                          {blocks});

  {
    GPUKernel kernel(
        h, "router_z_loss_rows", {x, partial},
        {workgroupMemRef({kBalanceRowsPerBlock}, b.getF32Type())},
        {kZLossThreads, 1, 1}, op.getLoc());
    GpuKernelBuilder &g = kernel.kb;
    Value xs = kernel.arg(0), out = kernel.arg(1), rowSq = kernel.workgroup(0);
    Value tid = g.threadId();
    Value warp = g.divu(tid, g.idx(kWarp));
    Value lane = g.remu(tid, g.idx(kWarp));
    Value rows = g.dim(xs, 0);
    Value first = g.mul(g.blockId(), g.idx(kBalanceRowsPerBlock));
    // The block's rows: [first, first + n), n < kBalanceRowsPerBlock only in
    // the last block.
    Value n = g.minu(g.sub(rows, first), g.idx(kBalanceRowsPerBlock));
    // Warp w takes rows w, w + 4, ... of the block (uniform per warp: the
    // whole warp enters the shuffles or none of it does).
    g.forLoop(warp, n, g.idx(kZLossThreads / kWarp), [&](Value r) {
      Value lse = warpRowLogSumExp(g, xs, g.add(first, r), lane);
      g.ifThen(g.eq(lane, g.idx(0)),
               [&] { g.store(g.fmul(lse, lse), rowSq, {r}); });
    });
    g.barrier();
    g.ifThen(g.eq(tid, g.idx(0)), [&] {
      Value sum = g.forLoop(g.idx(0), n, g.idx(1), {g.cF32(0.0)},
                            [&](Value r, ValueRange acc) -> SmallVector<Value> {
                              return {g.fadd(acc[0], g.load(rowSq, {r}))};
                            })[0];
      g.store(sum, out, {g.blockId()});
    });
    kernel.launch({blocks, kb.idx(1), kb.idx(1)});
  }
  {
    // The partials in block order: T / 64 loads by one thread (a few
    // microseconds at T = 16384), the CPU kernel's order of additions.
    GPUKernel kernel(h, "router_z_loss_sum", {x, partial, loss}, {}, {1, 1, 1},
                     op.getLoc());
    GpuKernelBuilder &g = kernel.kb;
    Value xs = kernel.arg(0), parts = kernel.arg(1), out = kernel.arg(2);
    Value sum =
        g.forLoop(g.idx(0), g.dim(parts, 0), g.idx(1), {g.cF32(0.0)},
                  [&](Value i, ValueRange acc) -> SmallVector<Value> {
                    return {g.fadd(acc[0], g.load(parts, {i}))};
                  })[0];
    // T = 0: 0 / 0 = NaN, the mean of nothing.
    g.store(g.fdiv(sum, g.sitofp(g.dim(xs, 0))), out, {});
    kernel.launch({kb.idx(1), kb.idx(1), kb.idx(1)});
  }
  h.release(partial);
  h.finish();
  h.replace(op, {loss});
  return success();
}

LogicalResult
RouterZLossGradToGPU::lower(RouterZLossGradOp op, OpAdaptor adaptor,
                            ConversionPatternRewriter &rewriter) const {
  auto gradType = cast<RankedTensorType>(op.getDlogits().getType());
  HostCode h(rewriter, op);
  GpuKernelBuilder &kb = h.kb;
  Value x = h.buffer(adaptor.getLogits());
  Value dloss = h.buffer(adaptor.getDloss());
  Value grad = h.allocLike(gradType, dynamicSizesFrom(kb, gradType, x));
  int64_t block = options.blockSize;
  int64_t rowsPerBlock = block / kWarp;

  GPUKernel kernel(h, "router_z_loss_grad", {x, dloss, grad}, {},
                   {block, 1, 1}, op.getLoc());
  GpuKernelBuilder &g = kernel.kb;
  Value xs = kernel.arg(0), out = kernel.arg(2);
  Value tid = g.threadId();
  Value lane = g.remu(tid, g.idx(kWarp));
  Value row = g.add(g.mul(g.blockId(), g.idx(rowsPerBlock)),
                    g.divu(tid, g.idx(kWarp)));
  Value rows = g.dim(xs, 0), numExperts = g.dim(xs, 1);
  g.ifThen(g.lt(row, rows), [&] {
    Value lse = warpRowLogSumExp(g, xs, row, lane);
    Value scale = g.fdiv(g.fmul(g.cF32(2.0), g.load(kernel.arg(1), {})),
                         g.sitofp(rows));
    g.forLoop(lane, numExperts, g.idx(kWarp), [&](Value col) {
      Value p = softmaxFromLogSumExp(g, g.loadF(xs, {row, col}), lse);
      g.store(zLossGradEntry(g, p, lse, scale), out, {row, col});
    });
  });
  kernel.launch(
      {kb.ceilDiv(kb.dim(x, 0), kb.idx(rowsPerBlock)), kb.idx(1), kb.idx(1)});
  h.finish();
  h.replace(op, {grad});
  return success();
}
