//===- RouterStats.cpp - moe.router_stats(_grad), load_balancing_loss -----===//
//
// Part of the MoE-MLIR project.
//
// Behind the balance-kernels option (on by default since an H100 run passed
// the float64 checks, memcheck and racecheck).
// The maths are those of the CPU kernels (MoE/Kernels/Balance.h, the softmax
// of OnlineSoftmax.h, the selection order of TopK.h); only the layout is the
// GPU's:
//
//  * router_stats, deterministic without atomics: a block of 4 warps owns the
//    kBalanceRowsPerBlock rows of one row block (the CPU kernel's blocks).
//    A warp per row takes the row's softmax state (warpRowSoftmax) and its
//    k-th pick by k top-k rounds (the shared bestBelow step, a warp max of
//    the packed candidates) and leaves the row's probability shift and k-th
//    candidate in workgroup memory. Then a thread per expert walks the
//    block's rows in row order: expert e of row t is selected iff its packed
//    candidate ranks at or above the row's k-th pick (candidates are
//    distinct: the index is part of them), and it adds w_t and w_t · p_te
//    to the block's partial rows; thread 0 sums the block's weights. A
//    second kernel (a thread per expert) sums the partial rows in block
//    order, and divides the probability sums by W.
//  * router_stats_grad: a warp per row (rows independent): the row's shift,
//    c = Σ_j p_j g_j (warp sum), then (w/W) · p · (g - c) per expert.
//  * load_balancing_loss: one thread, Σ_e (counts_e / W) · P_e in expert
//    order, then · E (the linalg lowering's order).
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

/// Token t's weight: mask[t] (widened to f32), or 1 without a mask.
static Value tokenWeight(GpuKernelBuilder &kb, Value mask, Value row) {
  return mask ? kb.loadF(mask, {row}) : kb.cF32(1.0);
}

/// The packed top-k candidate of logit `v` of expert `e` (index).
// Here and below, the ops that one call takes are built one a statement, in
// the order the plain (gcc) build has always emitted them: as arguments of
// one call their order would be the C++ compiler's (gcc and clang differ).
static Value candidateOf(GpuKernelBuilder &kb, Value v, Value e) {
  Value index = kb.castInt(e, kb.i32());
  Value key = orderedKey(kb, v);
  return packCandidate(kb, key, index);
}

template <>
LogicalResult
GPULowering<RouterStatsOp>::lower(RouterStatsOp op, OpAdaptor adaptor,
                                  ConversionPatternRewriter &rewriter) const {
  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Value x = h.buffer(adaptor.getLogits());
  Value mask = adaptor.getTokenMask() ? h.buffer(adaptor.getTokenMask())
                                      : Value();
  Value counts = allocReduced(h, op.getCounts(), x);
  Value probs = allocReduced(h, op.getMeanProbs(), x);
  Value weightSum = allocReduced(h, op.getWeightSum(), x);
  Value blocks = rowBlockCount(kb, kb.dim(x, 0));
  Value experts = kb.dim(x, 1);
  const int64_t dyn = ShapedType::kDynamic;
  Value partCounts =
      h.alloc(MemRefType::get({dyn, dyn}, kb.f32()), {blocks, experts});
  Value partProbs =
      h.alloc(MemRefType::get({dyn, dyn}, kb.f32()), {blocks, experts});
  Value partWeights = h.alloc(MemRefType::get({dyn}, kb.f32()), {blocks});

  {
    SmallVector<Value> args = {x};
    if (mask)
      args.push_back(mask);
    args.append({partCounts, partProbs, partWeights});
    GPUKernel kernel(
        h, "router_stats_rows", args,
        {workgroupMemRef({kBalanceRowsPerBlock}, b.getF32Type()),
         workgroupMemRef({kBalanceRowsPerBlock}, b.getI64Type())},
        {kRowBlockThreads, 1, 1}, op.getLoc());
    GpuKernelBuilder &g = kernel.kb;
    unsigned next = 0;
    Value xs = kernel.arg(next++);
    Value ms = mask ? kernel.arg(next++) : Value();
    Value outCounts = kernel.arg(next++), outProbs = kernel.arg(next++),
          outWeights = kernel.arg(next++);
    Value shifts = kernel.workgroup(0), kth = kernel.workgroup(1);
    RowBlock rb(g, xs);
    Value numExperts = g.dim(xs, 1);
    Value lane = rb.lane;
    Value none = noCandidate(g, g.i64());

    rb.forEachRowOfWarp([&](Value r) {
      Value row = g.add(rb.first, r);
      Value shift = balanceProbShift(g, warpRowSoftmax(g, xs, row, lane));
      Value pick =
          g.forLoop(
              g.idx(0), g.idx(op.getK()), g.idx(1),
              {g.cI64(std::numeric_limits<int64_t>::max())},
              [&](Value, ValueRange prev) -> SmallVector<Value> {
                Value local =
                    g.forLoop(lane, numExperts, g.idx(kWarp), {none},
                              [&](Value e, ValueRange acc)
                                  -> SmallVector<Value> {
                                Value v = g.loadF(xs, {row, e});
                                return {bestBelow(g, acc[0],
                                                  candidateOf(g, v, e),
                                                  prev[0], none)};
                              })[0];
                return {subgroupReduce(g, local, ReduceKind::MaxI64, kWarp)};
              })[0];
      g.ifThen(g.eq(lane, g.idx(0)), [&] {
        g.store(shift, shifts, {r});
        g.store(pick, kth, {r});
      });
    });
    g.barrier();

    // A thread per expert, the block's rows in row order.
    g.forLoop(rb.tid, numExperts, g.idx(kRowBlockThreads), [&](Value e) {
      SmallVector<Value> sums = g.forLoop(
          g.idx(0), rb.count, g.idx(1), {g.cF32(0.0), g.cF32(0.0)},
          [&](Value r, ValueRange acc) -> SmallVector<Value> {
            Value row = g.add(rb.first, r);
            Value w = tokenWeight(g, ms, row);
            Value v = g.loadF(xs, {row, e});
            Value kthPick = g.load(kth, {r});
            Value selected = g.cmpi(arith::CmpIPredicate::sge,
                                    candidateOf(g, v, e), kthPick);
            Value count = g.select(selected, g.fadd(acc[0], w), acc[0]);
            Value p = softmaxFromLogSumExp(g, v, g.load(shifts, {r}));
            return {count, g.fadd(acc[1], g.fmul(w, p))};
          });
      g.store(sums[0], outCounts, {rb.block, e});
      g.store(sums[1], outProbs, {rb.block, e});
    });
    g.ifThen(g.eq(rb.tid, g.idx(0)), [&] {
      Value total = sumInOrder(g, rb.count, [&](Value r) {
        return tokenWeight(g, ms, g.add(rb.first, r));
      });
      g.store(total, outWeights, {rb.block});
    });
    kernel.launch({blocks, kb.idx(1), kb.idx(1)});
  }
  {
    // A thread per expert: the partial rows in block order.
    GPUKernel kernel(h, "router_stats_sum",
                     {partCounts, partProbs, partWeights, counts, probs,
                      weightSum},
                     {}, {options.blockSize, 1, 1}, op.getLoc());
    GpuKernelBuilder &g = kernel.kb;
    Value pc = kernel.arg(0), pp = kernel.arg(1), pw = kernel.arg(2);
    Value numBlocks = g.dim(pc, 0);
    kernel.forItem(g.dim(pc, 1), [&](Value e) {
      SmallVector<Value> sums = sumInOrder(
          g, numBlocks,
          {[&](Value blk) { return g.load(pc, {blk, e}); },
           [&](Value blk) { return g.load(pp, {blk, e}); },
           [&](Value blk) { return g.load(pw, {blk}); }});
      g.store(sums[0], kernel.arg(3), {e});
      // W = 0: NaN (0 / 0), as transformers.
      g.store(g.fdiv(sums[1], sums[2]), kernel.arg(4), {e});
      g.ifThen(g.eq(e, g.idx(0)),
               [&] { g.store(sums[2], kernel.arg(5), {}); });
    });
    kernel.launchOver(experts);
  }
  h.release(partCounts);
  h.release(partProbs);
  h.release(partWeights);
  h.finish();
  h.replace(op, {counts, probs, weightSum});
  return success();
}

template <>
LogicalResult GPULowering<RouterStatsGradOp>::lower(
    RouterStatsGradOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  Value mask = adaptor.getTokenMask();
  lowerWarpRowKernel(
      rewriter, op, op.getDlogits(), adaptor.getLogits(),
      {mask, adaptor.getWeightSum(), adaptor.getDmeanProbs()},
      "router_stats_grad", options.blockSize, [&](WarpRowKernel &k) {
        GpuKernelBuilder &g = k.g;
        unsigned next = 1;
        Value ms = mask ? k.kernel.arg(next++) : Value();
        Value ws = k.kernel.arg(next++), gs = k.kernel.arg(next++);
        Value xs = k.x, row = k.w.row, lane = k.w.lane;
        Value shift = balanceProbShift(g, warpRowSoftmax(g, xs, row, lane));
        Value partial =
            g.forLoop(lane, k.numExperts, g.idx(kWarp), {g.cF32(0.0)},
                      [&](Value e, ValueRange acc) -> SmallVector<Value> {
                        Value p = softmaxFromLogSumExp(
                            g, g.loadF(xs, {row, e}), shift);
                        return {g.fadd(acc[0], g.fmul(p, g.load(gs, {e})))};
                      })[0];
        Value c = subgroupReduce(g, partial, ReduceKind::Sum, kWarp);
        Value weightTotal = g.load(ws, {});
        Value scale = g.fdiv(tokenWeight(g, ms, row), weightTotal);
        g.forLoop(lane, k.numExperts, g.idx(kWarp), [&](Value e) {
          Value p = softmaxFromLogSumExp(g, g.loadF(xs, {row, e}), shift);
          g.store(routerStatsGradEntry(g, p, g.load(gs, {e}), c, scale), k.out,
                  {row, e});
        });
      });
  return success();
}

template <>
LogicalResult GPULowering<LoadBalancingLossOp>::lower(
    LoadBalancingLossOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  auto lossType = cast<RankedTensorType>(op.getLoss().getType());
  HostCode h(rewriter, op);
  Value counts = h.buffer(adaptor.getCounts());
  Value probs = h.buffer(adaptor.getMeanProbs());
  Value weightSum = h.buffer(adaptor.getWeightSum());
  Value loss = h.allocLike(lossType, {});
  GPUKernel kernel(h, "load_balancing_loss",
                   {counts, probs, weightSum, loss}, {}, {1, 1, 1},
                   op.getLoc());
  GpuKernelBuilder &g = kernel.kb;
  Value cs = kernel.arg(0), ps = kernel.arg(1);
  Value w = g.load(kernel.arg(2), {});
  Value numExperts = g.dim(cs, 0);
  Value sum = sumInOrder(g, numExperts, [&](Value e) {
    Value p = g.load(ps, {e});
    Value share = g.fdiv(g.load(cs, {e}), w);
    return g.fmul(share, p);
  });
  g.store(g.fmul(sum, g.sitofp(numExperts)), kernel.arg(3), {});
  kernel.launch({h.kb.idx(1), h.kb.idx(1), h.kb.idx(1)});
  h.finish();
  h.replace(op, {loss});
  return success();
}
