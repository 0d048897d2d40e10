//===- RouterZLoss.cpp - moe.router_z_loss(_grad) on the GPU --------------===//
//
// Part of the MoE-MLIR project.
//
// Behind the balance-kernels option (on by default since an H100 run passed
// the float64 checks, memcheck and racecheck).
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

#include "HostCode.h"
#include "Reductions.h"
#include "Lowerings.h"
#include "RowKernels.h"

#include "MoE/Kernels/Balance.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

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

template <>
LogicalResult
GPULowering<RouterZLossOp>::lower(RouterZLossOp op, OpAdaptor adaptor,
                                  ConversionPatternRewriter &rewriter) const {
  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Value x = h.buffer(adaptor.getLogits());
  Value loss = allocReduced(h, op.getLoss(), x);
  Value blocks = rowBlockCount(kb, kb.dim(x, 0));
  Value partial = h.alloc(MemRefType::get({ShapedType::kDynamic}, kb.f32()),
                          {blocks});

  {
    GPUKernel kernel(
        h, "router_z_loss_rows", {x, partial},
        {workgroupMemRef({kBalanceRowsPerBlock}, b.getF32Type())},
        {kRowBlockThreads, 1, 1}, op.getLoc());
    GpuKernelBuilder &g = kernel.kb;
    Value xs = kernel.arg(0), out = kernel.arg(1), rowSq = kernel.workgroup(0);
    RowBlock rb(g, xs);
    rb.forEachRowOfWarp([&](Value r) {
      Value lse = warpRowLogSumExp(g, xs, g.add(rb.first, r), rb.lane);
      g.ifThen(g.eq(rb.lane, g.idx(0)),
               [&] { g.store(g.fmul(lse, lse), rowSq, {r}); });
    });
    g.barrier();
    g.ifThen(g.eq(rb.tid, g.idx(0)), [&] {
      Value sum =
          sumInOrder(g, rb.count, [&](Value r) { return g.load(rowSq, {r}); });
      g.store(sum, out, {rb.block});
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
    Value sum = sumInOrder(g, g.dim(parts, 0),
                           [&](Value i) { return g.load(parts, {i}); });
    // T = 0: 0 / 0 = NaN, the mean of nothing.
    g.store(g.fdiv(sum, g.sitofp(g.dim(xs, 0))), out, {});
    kernel.launch({kb.idx(1), kb.idx(1), kb.idx(1)});
  }
  h.release(partial);
  h.finish();
  h.replace(op, {loss});
  return success();
}

template <>
LogicalResult GPULowering<RouterZLossGradOp>::lower(
    RouterZLossGradOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  lowerWarpRowKernel(
      rewriter, op, op.getDlogits(), adaptor.getLogits(), {adaptor.getDloss()},
      "router_z_loss_grad", options.blockSize, [&](WarpRowKernel &k) {
        GpuKernelBuilder &g = k.g;
        Value lse = warpRowLogSumExp(g, k.x, k.w.row, k.w.lane);
        // One op a statement: built as arguments of one call, their order
        // would be the C++ compiler's (gcc and clang differ). T first, then
        // dloss: the order the plain (gcc) build has always emitted.
        Value count = g.sitofp(k.rows);
        Value dl = g.load(k.kernel.arg(1), {});
        Value scale = g.fdiv(g.fmul(g.cF32(2.0), dl), count);
        g.forLoop(k.w.lane, k.numExperts, g.idx(kWarp), [&](Value col) {
          Value p = softmaxFromLogSumExp(g, g.loadF(k.x, {k.w.row, col}), lse);
          g.store(zLossGradEntry(g, p, lse, scale), k.out, {k.w.row, col});
        });
      });
  return success();
}
