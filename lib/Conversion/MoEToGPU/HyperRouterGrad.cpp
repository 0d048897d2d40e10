//===- HyperRouterGrad.cpp - moe.hyper_router_grad on the GPU -------------===//
//
// Part of the MoE-MLIR project.
//
// The backward of the hypernetwork (MoEGradOps.td) with the maths shared with
// the CPU kernel (MoE/Kernels/Gemv.h), one stream of kernels:
//
// 1. h = relu(w1 · emb + b1): the forward's warp-per-row GEMV (Gemv.h).
// 2. d_b2 = dout = [dw | db] flattened: a thread per entry
//    (kernels::hyperSlot, the forward's split undone).
// 3. Through w2: a thread block per 64 rows, a thread per column (the warp's
//    loads of a row coalesced): d_w2[r, c] = dout[r] · h[c] and the block's
//    partial Σ_r dout[r] · w2[r, c] over its rows in order
//    (kernels::layerGradStep) into its row of a [blocks, Dh] scratch.
// 4. dh[c] = the blocks' partials summed by a warp per column in a fixed
//    order (lane l: blocks l, l + 32, ...; then a butterfly), and through the
//    ReLU (kernels::reluGrad): d_b1 = da.
// 5. Steps 3 and 4 through w1 with dy = da, x = emb: d_w1 and d_emb.
//
// Deterministic: the blocks and both orders of summation are fixed by the
// shape, no float atomics. The passes over w2 and d_w2 are what the op costs
// (memory-bound); with a frozen hypernetwork (d_w1, d_w2 unused: the torch
// op's weight_grads=False) their outer products are not written and their
// results are not allocated (a dead tensor.empty stands in).
//
//===----------------------------------------------------------------------===//

#include "Gemv.h"
#include "HostCode.h"
#include "Reductions.h"
#include "Lowerings.h"

#include "MoE/Kernels/Gemv.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

namespace {
/// Rows of m per thread block of the layer kernel: enough blocks to fill
/// the GPU on w2 (E·(D+1) rows), a scratch of rows / 64 partial rows.
constexpr int64_t kBlockRows = 64;
/// Rows of the layer kernel's loop step (loads in flight per thread).
constexpr int64_t kRowUnroll = 4;
constexpr int64_t kColumnsPerSumBlock = kKernelThreads / kWarp;

/// A thread per entry r of dout [R]: dw[e, c], or db[e] for c = D.
void launchDout(HostCode &h, Value dwBuf, Value dbBuf, Value doutBuf,
                Location loc) {
  GPUKernel kernel(h, "hyper_router_grad_dout", {dwBuf, dbBuf, doutBuf}, {},
                   {kKernelThreads, 1, 1}, loc);
  GpuKernelBuilder &kb = kernel.kb;
  Value dw = kernel.arg(0), db = kernel.arg(1), dout = kernel.arg(2);
  kernel.forItem(kb.dim(dout, 0), [&](Value r) {
    kernels::HyperSlot slot = kernels::hyperSlot(kb, r, kb.dim(dw, 1));
    Value v = kb.ifElse(
        slot.isBias, {kb.f32()},
        [&]() -> SmallVector<Value> { return {kb.load(db, {slot.expert})}; },
        [&]() -> SmallVector<Value> {
          return {kb.load(dw, {slot.expert, slot.column})};
        })[0];
    kb.store(v, dout, {r});
  });
  kernel.launchOver(h.kb.dim(doutBuf, 0));
}

/// Step 3 for m [R, C] (any float): arguments m, dy [R] f32, x [C] (any
/// float), partial [blocks, C] f32, then dm [R, C] f32 when `writeDm`; a
/// block per kBlockRows rows.
void launchLayer(HostCode &h, ValueRange args, bool writeDm, Value blocks,
                 Location loc) {
  GPUKernel kernel(h, "hyper_router_grad_layer", args, {},
                   {kKernelThreads, 1, 1}, loc);
  GpuKernelBuilder &kb = kernel.kb;
  Value m = kernel.arg(0), dy = kernel.arg(1), x = kernel.arg(2),
        partial = kernel.arg(3);
  Value dm = writeDm ? kernel.arg(4) : Value();
  Value blk = kb.blockId();
  Value rows = kb.dim(m, 0), cols = kb.dim(m, 1);
  Value r0 = kb.mul(blk, kb.idx(kBlockRows));
  Value r1 = kb.mins(kb.add(r0, kb.idx(kBlockRows)), rows);
  kb.forLoop(kb.threadId(), cols, kb.idx(kKernelThreads), [&](Value c) {
    Value xv = dm ? kb.loadF(x, {c}) : Value();
    // Rows [r, r + n) in order; their loads come first so that n loads of
    // the memory-bound pass are in flight at once (the order of the sum is
    // the rows', whatever n).
    auto rowsFrom = [&](Value r, int64_t n, Value acc) {
      SmallVector<Value> g, w;
      for (int64_t i = 0; i < n; ++i) {
        Value ri = kb.add(r, kb.idx(i));
        g.push_back(kb.load(dy, {ri}));
        w.push_back(kb.loadF(m, {ri, c}));
      }
      for (int64_t i = 0; i < n; ++i) {
        kernels::LayerGradStep s =
            kernels::layerGradStep(kb, g[i], w[i], xv, acc);
        if (dm)
          kb.store(s.dm, dm, {kb.add(r, kb.idx(i)), c});
        acc = s.partial;
      }
      return acc;
    };
    Value span = kb.sub(r1, r0);
    Value r4 = kb.add(
        r0, kb.mul(kb.divu(span, kb.idx(kRowUnroll)), kb.idx(kRowUnroll)));
    Value acc = kb.forLoop(r0, r4, kb.idx(kRowUnroll), ValueRange{kb.cF32(0.0)},
                           [&](Value r, ValueRange a) -> SmallVector<Value> {
                             return {rowsFrom(r, kRowUnroll, a[0])};
                           })[0];
    acc = kb.forLoop(r4, r1, kb.idx(1), ValueRange{acc},
                     [&](Value r, ValueRange a) -> SmallVector<Value> {
                       return {rowsFrom(r, 1, a[0])};
                     })[0];
    kb.store(acc, partial, {blk, c});
  });
  kernel.launch({blocks, h.kb.idx(1), h.kb.idx(1)});
}

/// Step 4: a warp per column c of partial [blocks, C]: dx[c] = Σ_blocks, then
/// through the ReLU of h [C] when `gated`. Arguments partial, dx [C] f32,
/// then h.
void launchSum(HostCode &h, ValueRange args, bool gated, Value columns,
               Location loc) {
  GPUKernel kernel(h, "hyper_router_grad_sum", args, {}, {kKernelThreads, 1, 1},
                   loc);
  GpuKernelBuilder &kb = kernel.kb;
  Value partial = kernel.arg(0), dx = kernel.arg(1);
  Value warp = kb.divu(kb.threadId(), kb.idx(kWarp));
  Value lane = kb.remu(kb.threadId(), kb.idx(kWarp));
  Value c = kb.add(kb.mul(kb.blockId(), kb.idx(kColumnsPerSumBlock)), warp);
  Value cols = kb.dim(partial, 1);
  Value active = kb.lt(c, cols);
  // Every lane takes part in the butterfly; a warp past the last column
  // sums the last one and stores nothing.
  Value safe = kb.select(active, c, kb.sub(cols, kb.idx(1)));
  Value part = kb.forLoop(
      lane, kb.dim(partial, 0), kb.idx(kWarp), ValueRange{kb.cF32(0.0)},
      [&](Value blk, ValueRange a) -> SmallVector<Value> {
        return {kb.fadd(a[0], kb.load(partial, {blk, safe}))};
      })[0];
  Value sum = subgroupReduce(kb, part, ReduceKind::Sum, kWarp);
  kb.ifThen(kb.andI(active, kb.eq(lane, kb.idx(0))), [&] {
    Value v = sum;
    if (gated)
      v = kernels::reluGrad(kb, kb.load(kernel.arg(2), {c}), sum);
    kb.store(v, dx, {c});
  });
  GpuKernelBuilder &hk = h.kb;
  kernel.launch(
      {hk.ceilDiv(columns, hk.idx(kColumnsPerSumBlock)), hk.idx(1), hk.idx(1)});
}

/// Steps 3 and 4 for one layer y = m · x: dm (null: not written) and
/// dx = m^T · dy, gated by the ReLU of `gate` when set.
void layerBackward(HostCode &h, Value m, Value dy, Value x, Value dm, Value dx,
                   Value gate, Location loc) {
  GpuKernelBuilder &kb = h.kb;
  Value rows = kb.dim(m, 0), cols = kb.dim(m, 1);
  Value blocks = kb.ceilDiv(rows, kb.idx(kBlockRows));
  Value partial = h.alloc(
      MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic}, kb.f32()),
      {blocks, cols});
  SmallVector<Value> args = {m, dy, x, partial};
  if (dm)
    args.push_back(dm);
  launchLayer(h, args, bool(dm), blocks, loc);
  SmallVector<Value> sumArgs = {partial, dx};
  if (gate)
    sumArgs.push_back(gate);
  launchSum(h, sumArgs, bool(gate), cols, loc);
  h.release(partial);
}
} // namespace

template <>
LogicalResult GPULowering<HyperRouterGradOp>::lower(
    HyperRouterGradOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  Location loc = op.getLoc();
  HostCode h(rewriter, op);
  GpuKernelBuilder &kb = h.kb;
  Value emb = h.buffer(adaptor.getEmb()), w1 = h.buffer(adaptor.getW1()),
        b1 = h.buffer(adaptor.getB1()), w2 = h.buffer(adaptor.getW2()),
        b2 = h.buffer(adaptor.getB2()), dw = h.buffer(adaptor.getDw()),
        db = h.buffer(adaptor.getDb());
  // Each gradient is shaped like its parameter; d_w1 and d_w2 only when used.
  SmallVector<Value> params = {emb, w1, b1, w2, b2};
  SmallVector<Value> grads;
  for (auto [n, result, param] : llvm::enumerate(op->getResults(), params)) {
    auto type = cast<RankedTensorType>(result.getType());
    bool weight = n == 1 || n == 3;
    grads.push_back(weight && result.use_empty()
                        ? Value()
                        : h.allocLike(type, dynamicSizesFrom(kb, type, param)));
  }
  Value dEmb = grads[0], dW1 = grads[1], dB1 = grads[2], dW2 = grads[3],
        dB2 = grads[4];

  // 1. The hidden layer.
  Value hidden = h.alloc(MemRefType::get({ShapedType::kDynamic}, kb.f32()),
                         {kb.dim(w1, 0)});
  launchGemv(h, "hyper_router_grad_hidden", {w1, emb, b1, hidden}, loc,
             /*relu=*/true, [](GPUKernel &kernel, Value row, Value v) {
               kernel.kb.store(v, kernel.arg(3), {row});
             });

  // 2. d_b2 = dout.
  launchDout(h, dw, db, dB2, loc);

  // 3-4. Through w2 and the ReLU: d_w2, d_b1 = da.
  layerBackward(h, w2, dB2, hidden, dW2, dB1, hidden, loc);
  // 5. Through w1: d_w1, d_emb.
  layerBackward(h, w1, dB1, emb, dW1, dEmb, Value(), loc);
  h.release(hidden);
  h.finish();

  // The dead stand-ins live outside the op's moe.kernel: their sizes come
  // from the tensor operands, not from the kernel's buffers.
  SmallVector<Value> paramTensors = {adaptor.getEmb(), adaptor.getW1(),
                                     adaptor.getB1(), adaptor.getW2(),
                                     adaptor.getB2()};
  SmallVector<Value> results;
  for (auto [result, grad, param] :
       llvm::zip_equal(op->getResults(), grads, paramTensors)) {
    auto type = cast<RankedTensorType>(result.getType());
    if (grad) {
      results.push_back(h.tensor(grad, type));
      continue;
    }
    SmallVector<Value> sizes;
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (type.isDynamicDim(d))
        sizes.push_back(tensor::DimOp::create(rewriter, loc, param, d));
    results.push_back(tensor::EmptyOp::create(rewriter, loc, type.getShape(),
                                              type.getElementType(), sizes)
                          .getResult());
  }
  rewriter.replaceOp(op, results);
  return success();
}
