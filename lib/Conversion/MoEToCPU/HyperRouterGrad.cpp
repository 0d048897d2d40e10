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
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Gemv.h"

namespace mlir::moe::cpu {

namespace {
constexpr int64_t kMinBlockRows = 64;
constexpr int64_t kMaxBlocks = 64;

/// The backward of y = m · x through one layer, in one pass over the rows of
/// m ([R, C], any float) in memory order: dm[r, :] = dy[r] · x when `dm` is
/// set (dy [R] f32, x [C] any float); returns dx = m^T · dy ([C] f32), in
/// `dx` when set, else in a new buffer.
Value layerBackward(CpuKernelBuilder &k, const KernelOptions &opts, Value m,
                    Value dy, Value x, Value dm, Value dx = {}) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  int64_t lanes = k.lanes();
  Value rows = k.dim(m, 0), cols = k.dim(m, 1);
  Value full = k.divu(cols, k.idx(lanes));
  Value tail = k.sub(cols, k.mul(full, k.idx(lanes)));
  Value hasTail = k.cmpi(arith::CmpIPredicate::ne, tail, c0);
  Value vecs = k.ceilDiv(cols, k.idx(lanes));
  Value colsPad = k.mul(vecs, k.idx(lanes));
  Value zeros = k.constLike(k.vf32(), 0.0);

  // Row blocks, from the shape alone.
  Value small = k.cmpi(arith::CmpIPredicate::ule, k.mul(rows, cols),
                       k.idx(kHyperInlineElements));
  Value blocks = k.select(
      small, k.mins(rows, k.idx(CpuKernelBuilder::kInlineItems)),
      k.mins(k.ceilDiv(rows, k.idx(kMinBlockRows)), k.idx(kMaxBlocks)));
  Value blockRows = k.ceilDiv(rows, k.maxs(blocks, c1));
  // One partial m^T · dy per block, padded to whole vectors.
  Value partial =
      k.alloc(MemRefType::get({kDyn, kDyn}, k.f32()), {blocks, colsPad});

  k.workers(opts, blocks, [&](Value blk, Value) {
    Value r0 = k.mul(blk, blockRows);
    Value r1 = k.mins(k.add(r0, blockRows), rows);
    k.forLoop(c0, vecs, c1, [&](Value v) {
      k.vstore(zeros, partial, {blk, k.mul(v, k.idx(lanes))});
    });
    k.forLoop(r0, r1, c1, [&](Value r) {
      Value g = k.splat(k.load(dy, {r}), lanes);
      // Columns [col, col + lanes): whole vectors, or the tail (`full`
      // false: masked loads and a masked d_m store; the partial's padding
      // lanes take g · 0).
      auto step = [&](Value col, bool whole) {
        Value w = k.vloadPart(whole, m, {r, col}, tail, 0.0);
        Value p = k.vload(partial, {blk, col});
        Value xv = dm ? k.vloadPart(whole, x, {col}, tail, 0.0) : Value();
        kernels::LayerGradStep s = kernels::layerGradStep(k, g, w, xv, p);
        k.vstore(s.partial, partial, {blk, col});
        if (dm)
          k.vstorePart(whole, s.dm, dm, {r, col}, tail);
      };
      constexpr int64_t U = 4;
      Value fullU = k.mul(k.divu(full, k.idx(U)), k.idx(U));
      k.forLoop(c0, fullU, k.idx(U), [&](Value c) {
        for (int64_t u = 0; u < U; ++u)
          step(k.mul(k.add(c, k.idx(u)), k.idx(lanes)), true);
      });
      k.forLoop(fullU, full, c1,
                [&](Value c) { step(k.mul(c, k.idx(lanes)), true); });
      k.ifThen(hasTail, [&] { step(k.mul(full, k.idx(lanes)), false); });
    });
  });

  // dx = Σ_blocks partial, in block order.
  int64_t staticCols = cast<MemRefType>(m.getType()).getDimSize(1);
  if (!dx)
    dx = k.alloc(MemRefType::get({staticCols}, k.f32()),
                 CpuKernelBuilder::dynamicSizes({staticCols}, {cols}));
  auto reduceAt = [&](Value col, bool whole) {
    Value s = k.forLoop(c0, blocks, c1, ValueRange{zeros},
                        [&](Value blk, ValueRange acc) -> SmallVector<Value> {
                          return {k.fadd(acc[0], k.vload(partial, {blk, col}))};
                        })[0];
    k.vstorePart(whole, s, dx, {col}, tail);
  };
  k.forLoop(c0, full, c1,
            [&](Value c) { reduceAt(k.mul(c, k.idx(lanes)), true); });
  k.ifThen(hasTail, [&] { reduceAt(k.mul(full, k.idx(lanes)), false); });
  return dx;
}

struct HyperRouterGradKernel : KernelPattern<HyperRouterGradOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(HyperRouterGradOp op, CpuKernelBuilder &k,
                     PatternRewriter &rw) const override {
    if (hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    KernelScope kernel = KernelScope::gradientsOf(
        k, op, {op.getEmb(), op.getW1(), op.getB1(), op.getW2(), op.getB2()},
        {op.getDw(), op.getDb()});
    Value c0 = k.idx(0), c1 = k.idx(1);
    int64_t lanes = k.lanes();
    Value emb = k.buffer(op.getEmb()), w1 = k.buffer(op.getW1());
    Value b1 = k.buffer(op.getB1()), w2 = k.buffer(op.getW2());
    Value dw = k.buffer(op.getDw()), db = k.buffer(op.getDb());

    // 1. The hidden layer.
    Value h = hyperAffine(k, opts, w1, emb, b1, /*relu=*/true);

    // 2. d_b2 = dout: row e of dw, then db[e], for each expert.
    Value dout = kernel.out(4);
    Value experts = k.dim(dw, 0), depth = k.dim(dw, 1);
    Value full = k.divu(depth, k.idx(lanes));
    Value tail = k.sub(depth, k.mul(full, k.idx(lanes)));
    k.forLoop(c0, experts, c1, [&](Value e) {
      Value base = k.mul(e, k.add(depth, c1));
      auto copy = [&](Value col, bool whole) {
        k.vstorePart(whole, k.vloadPart(whole, dw, {e, col}, tail, 0.0), dout,
                     {k.add(base, col)}, tail);
      };
      k.forLoop(c0, full, c1,
                [&](Value c) { copy(k.mul(c, k.idx(lanes)), true); });
      k.ifThen(k.cmpi(arith::CmpIPredicate::ne, tail, c0),
               [&] { copy(k.mul(full, k.idx(lanes)), false); });
      k.store(k.load(db, {e}), dout, {k.add(base, depth)});
    });

    // 3. Through the output layer.
    Value dw2 = kernel.out(3);
    bool writeW2 = !op.getDW2().use_empty();
    Value dh = layerBackward(k, opts, w2, dout, h, writeW2 ? dw2 : Value());

    // 4. Through the ReLU (unordered compare: a NaN passes dh).
    Value da = kernel.out(2);
    k.forLoop(c0, k.dim(b1, 0), c1, [&](Value i) {
      Value hi = k.load(h, {i});
      k.store(kernels::reluGrad(k, hi, k.load(dh, {i})), da, {i});
    });

    // 5. Through the hidden layer.
    Value dw1 = kernel.out(1);
    bool writeW1 = !op.getDW1().use_empty();
    layerBackward(k, opts, w1, da, emb, writeW1 ? dw1 : Value(),
                  kernel.out(0));

    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateHyperRouterGradKernel, HyperRouterGradKernel)

} // namespace mlir::moe::cpu
