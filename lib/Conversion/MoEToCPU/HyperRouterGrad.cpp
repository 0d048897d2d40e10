//===- HyperRouterGrad.cpp - moe.hyper_router_grad -> CPU kernel ----------===//
//
// Part of the MoE-MLIR project.
//
// The backward of the hypernetwork (MoEGradOps.td) in one pass over each
// weight matrix, which is what the op costs: it is memory-bound on w2
// ([E·(D+1), Dh], 67 MB at D = 1024, E = 64) and on the d_w2 it writes.
//
// 1. h = relu(w1 · emb + b1), recomputed by the forward kernel's GEMV
//    (hyperAffine, HyperRouter.cpp).
// 2. d_b2 = dout = [dw | db] flattened (the forward's split undone).
// 3. One pass over the rows r of w2 in memory order (one sequential stream
//    per worker, as the forward): d_w2[r, :] = dout[r] · h and the partial
//    dh += dout[r] · w2[r, :] of the row's block (layerBackward, with the
//    step and the ReLU's backward of MoE/Kernels/Gemv.h, shared with the GPU
//    kernel).
// 4. da = dh where h > 0 or h is NaN (PyTorch's threshold_backward), else 0;
//    d_b1 = da.
// 5. The same pass over w1: d_w1[i, :] = da[i] · emb, d_emb = w1^T · da.
//
// Determinism: the rows of a matrix are cut into blocks by its shape alone
// (at most 4 blocks for a matrix of at most kHyperInlineElements, which run on
// the calling thread, else at most kMaxBlocks blocks of >= 64 rows); each
// block accumulates its partial m^T · dy in its own scratch row, and the
// partials are summed in block order afterwards: the results are
// bit-identical whatever the thread count and the timing.
//
// A gradient nobody uses (d_w1, d_w2 of a frozen hypernetwork inside a larger
// compiled function) is not written: its buffer is allocated but never
// touched.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Gemv.h"

namespace mlir::moe::cpu_lowering {

namespace {
constexpr int64_t kMinBlockRows = 64;
constexpr int64_t kMaxBlocks = 64;

/// The backward of y = m · x through one layer, in one pass over the rows of
/// m ([R, C], any float) in memory order: dm[r, :] = dy[r] · x when `dm` is
/// set (dy [R] f32, x [C] any float); returns dx = m^T · dy ([C] f32), in
/// `dx` when set, else in a new buffer.
Value layerBackward(CpuKernelBuilder &kb, const KernelOptions &opts, Value m,
                    Value dy, Value x, Value dm, Value dx = {}) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  int64_t lanes = kb.lanes();
  Value rows = kb.dim(m, 0), cols = kb.dim(m, 1);
  Value full = kb.divu(cols, kb.idx(lanes));
  Value tail = kb.sub(cols, kb.mul(full, kb.idx(lanes)));
  Value hasTail = kb.cmpi(arith::CmpIPredicate::ne, tail, c0);
  Value vecs = kb.ceilDiv(cols, kb.idx(lanes));
  Value colsPad = kb.mul(vecs, kb.idx(lanes));
  Value zeros = kb.constLike(kb.vf32(), 0.0);

  // Row blocks, from the shape alone.
  Value small = kb.cmpi(arith::CmpIPredicate::ule, kb.mul(rows, cols),
                       kb.idx(kHyperInlineElements));
  Value blocks = kb.select(
      small, kb.mins(rows, kb.idx(CpuKernelBuilder::kInlineItems)),
      kb.mins(kb.ceilDiv(rows, kb.idx(kMinBlockRows)), kb.idx(kMaxBlocks)));
  Value blockRows = kb.ceilDiv(rows, kb.maxs(blocks, c1));
  // One partial m^T · dy per block, padded to whole vectors.
  Value partial =
      kb.alloc(MemRefType::get({kDyn, kDyn}, kb.f32()), {blocks, colsPad});

  kb.workers(opts, blocks, [&](Value blk, Value) {
    Value r0 = kb.mul(blk, blockRows);
    Value r1 = kb.mins(kb.add(r0, blockRows), rows);
    kb.forLoop(c0, vecs, c1, [&](Value v) {
      kb.vstore(zeros, partial, {blk, kb.mul(v, kb.idx(lanes))});
    });
    kb.forLoop(r0, r1, c1, [&](Value r) {
      Value g = kb.splat(kb.load(dy, {r}), lanes);
      // Columns [col, col + lanes): whole vectors, or the tail (`full`
      // false: masked loads and a masked d_m store; the partial's padding
      // lanes take g · 0).
      auto step = [&](Value col, bool whole) {
        Value w = kb.vloadPart(whole, m, {r, col}, tail, 0.0);
        Value p = kb.vload(partial, {blk, col});
        Value xv = dm ? kb.vloadPart(whole, x, {col}, tail, 0.0) : Value();
        kernels::LayerGradStep s = kernels::layerGradStep(kb, g, w, xv, p);
        kb.vstore(s.partial, partial, {blk, col});
        if (dm)
          kb.vstorePart(whole, s.dm, dm, {r, col}, tail);
      };
      constexpr int64_t U = 4;
      Value fullU = kb.mul(kb.divu(full, kb.idx(U)), kb.idx(U));
      kb.forLoop(c0, fullU, kb.idx(U), [&](Value c) {
        for (int64_t u = 0; u < U; ++u)
          step(kb.mul(kb.add(c, kb.idx(u)), kb.idx(lanes)), true);
      });
      kb.forLoop(fullU, full, c1,
                [&](Value c) { step(kb.mul(c, kb.idx(lanes)), true); });
      kb.ifThen(hasTail, [&] { step(kb.mul(full, kb.idx(lanes)), false); });
    });
  });

  // dx = Σ_blocks partial, in block order.
  int64_t staticCols = cast<MemRefType>(m.getType()).getDimSize(1);
  if (!dx)
    dx = kb.alloc(MemRefType::get({staticCols}, kb.f32()),
                 CpuKernelBuilder::dynamicSizes({staticCols}, {cols}));
  auto reduceAt = [&](Value col, bool whole) {
    Value s = kb.forLoop(c0, blocks, c1, ValueRange{zeros},
                        [&](Value blk, ValueRange acc) -> SmallVector<Value> {
                          return {kb.fadd(acc[0], kb.vload(partial, {blk, col}))};
                        })[0];
    kb.vstorePart(whole, s, dx, {col}, tail);
  };
  kb.forLoop(c0, full, c1,
            [&](Value c) { reduceAt(kb.mul(c, kb.idx(lanes)), true); });
  kb.ifThen(hasTail, [&] { reduceAt(kb.mul(full, kb.idx(lanes)), false); });
  return dx;
}

} // namespace

template <>
LogicalResult CPUKernel<HyperRouterGradOp>::emit(HyperRouterGradOp op,
                                                 CpuKernelBuilder &kb,
                                                 PatternRewriter &rw) const {
  KernelScope kernel = KernelScope::gradientsOf(
      kb, op, {op.getEmb(), op.getW1(), op.getB1(), op.getW2(), op.getB2()},
      {op.getDw(), op.getDb()});
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  int64_t lanes = kb.lanes();
  Value emb = kb.buffer(op.getEmb()), w1 = kb.buffer(op.getW1());
  Value b1 = kb.buffer(op.getB1()), w2 = kb.buffer(op.getW2());
  Value dw = kb.buffer(op.getDw()), db = kb.buffer(op.getDb());

  // 1. The hidden layer.
  Value h = hyperAffine(kb, opts, w1, emb, b1, /*relu=*/true);

  // 2. d_b2 = dout: row e of dw, then db[e], for each expert.
  Value dout = kernel.out(4);
  Value experts = kb.dim(dw, 0), depth = kb.dim(dw, 1);
  Value full = kb.divu(depth, kb.idx(lanes));
  Value tail = kb.sub(depth, kb.mul(full, kb.idx(lanes)));
  kb.forLoop(c0, experts, c1, [&](Value e) {
    Value base = kb.mul(e, kb.add(depth, c1));
    auto copy = [&](Value col, bool whole) {
      kb.vstorePart(whole, kb.vloadPart(whole, dw, {e, col}, tail, 0.0), dout,
                   {kb.add(base, col)}, tail);
    };
    kb.forLoop(c0, full, c1,
              [&](Value c) { copy(kb.mul(c, kb.idx(lanes)), true); });
    kb.ifThen(kb.cmpi(arith::CmpIPredicate::ne, tail, c0),
             [&] { copy(kb.mul(full, kb.idx(lanes)), false); });
    kb.store(kb.load(db, {e}), dout, {kb.add(base, depth)});
  });

  // 3. Through the output layer.
  Value dw2 = kernel.out(3);
  bool writeW2 = !op.getDW2().use_empty();
  Value dh = layerBackward(kb, opts, w2, dout, h, writeW2 ? dw2 : Value());

  // 4. Through the ReLU (unordered compare: a NaN passes dh).
  Value da = kernel.out(2);
  kb.forLoop(c0, kb.dim(b1, 0), c1, [&](Value i) {
    Value hi = kb.load(h, {i});
    kb.store(kernels::reluGrad(kb, hi, kb.load(dh, {i})), da, {i});
  });

  // 5. Through the hidden layer.
  Value dw1 = kernel.out(1);
  bool writeW1 = !op.getDW1().use_empty();
  layerBackward(kb, opts, w1, da, emb, writeW1 ? dw1 : Value(),
                kernel.out(0));

  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
