//===- SimilarityInform.cpp - moe.similarity_inform -> fast CPU kernel ----===//
//
// Part of the MoE-MLIR project.
//
// The flash-style mixing kernel of Flash.h with q = u (or u·ws, one
// vectorized projection pass), keys u transposed once into [B, D, Npad], and
// the logit epilogue x = dot / tau, -inf where the key is masked (key_mask,
// causal j > i, or padding). Peak extra memory: the packed keys, values and
// queries, O(N·(D+K)) floats.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;

namespace {
constexpr int64_t kDyn = ShapedType::kDynamic;

struct SimilarityInformKernel : KernelPattern<SimilarityInformOp> {
  using KernelPattern::KernelPattern;

  LogicalResult matchAndRewrite(SimilarityInformOp op,
                                PatternRewriter &rw) const override {
    ImplicitLocOpBuilder b(op.getLoc(), rw);
    CK k(b);
    Type f32 = k.f32();
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value u = k.buffer(op.getU()), e = k.buffer(op.getE());
    Value mask = op.getKeyMask() ? k.buffer(op.getKeyMask()) : Value();
    Value batch = k.dim(u, 0), rows = k.dim(u, 1), depth = k.dim(u, 2);
    Value width = k.dim(e, 2);
    Value keysPad = roundUp(k, rows, kKeyTile);
    Value widthPad = roundUp(k, width, kLanes);
    bool causal = op.getCausal();
    float tau = op.getTau().convertToFloat();

    // Keys transposed per key tile: kT[b, j / TK, d, j % TK] = u[b, j, d],
    // zero padding. One item per (b, key tile).
    Value keyTiles = k.divu(keysPad, k.idx(kKeyTile));
    Value keysT = k.alloc(MemRefType::get({kDyn, kDyn, kDyn, kKeyTile}, f32),
                          {batch, keyTiles, depth});
    k.workers(opts, k.mul(batch, keyTiles), [&](Value item, Value) {
      Value bi = k.divu(item, keyTiles), jt = k.remu(item, keyTiles);
      Value last = k.sub(rows, c1);
      k.forLoop(c0, k.idx(kKeyTile), c1, [&](Value jj) {
        Value j = k.add(k.mul(jt, k.idx(kKeyTile)), jj);
        Value in = k.cmpi(arith::CmpIPredicate::ult, j, rows);
        Value jc = k.mins(j, last);
        k.forLoop(c0, depth, c1, [&](Value d) {
          Value x = k.loadF(u, {bi, jc, d});
          k.store(k.select(in, x, k.cF32(0.0)), keysT, {bi, jt, d, jj});
        });
      });
    });

    // Key validity (padding and key_mask) as 1.0 / 0.0, when needed.
    auto uType = cast<RankedTensorType>(op.getU().getType());
    bool padded = uType.isDynamicDim(1) || uType.getDimSize(1) % kKeyTile != 0;
    Value keyValid;
    if (mask || padded) {
      keyValid = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, keysPad});
      k.forLoop(c0, batch, c1, [&](Value bi) {
        k.forLoop(c0, keysPad, c1, [&](Value j) {
          Value in = k.cmpi(arith::CmpIPredicate::ult, j, rows);
          if (mask) {
            Value m = k.load(mask, {bi, k.mins(j, k.sub(rows, c1))});
            in = k.andI(in, m);
          }
          k.store(k.select(in, k.cF32(1.0), k.cF32(0.0)), keyValid, {bi, j});
        });
      });
    }

    // Queries: u, or q = u · ws (vector over the output features).
    Value q = u;
    if (op.getWs()) {
      Value ws = k.buffer(op.getWs());
      q = k.alloc(MemRefType::get({kDyn, kDyn, kDyn}, f32),
                  {batch, rows, depth});
      Value chunks = k.ceilDiv(depth, k.idx(kLanes));
      k.workers(opts, k.mul(batch, rows), [&](Value item, Value) {
        Value bi = k.divu(item, rows), i = k.remu(item, rows);
        k.forLoop(c0, chunks, c1, [&](Value c) {
          Value col = k.mul(c, k.idx(kLanes));
          Value count = k.sub(depth, col);
          Value acc =
              k.forLoop(c0, depth, c1, ValueRange{k.constLike(k.vf32(), 0.0)},
                        [&](Value d, ValueRange a) -> SmallVector<Value> {
                          Value x = k.splat(k.loadF(u, {bi, i, d}), kLanes);
                          Value w = k.vloadMasked(ws, {d, col}, count, 0.0);
                          return {k.fma(x, w, a[0])};
                        })[0];
          k.vstoreMasked(acc, q, {bi, i, col}, count);
        });
      });
    }

    auto [values, nonFinite] =
        packValues(k, e, batch, rows, width, keysPad, widthPad);
    Value out =
        k.alloc(MemRefType::get({kDyn, kDyn, kDyn}, f32), {batch, rows, width});

    FlashSpec spec;
    spec.q = q;
    spec.keysT = keysT;
    spec.values = values;
    spec.out = out;
    spec.batch = batch;
    spec.rows = rows;
    spec.keys = rows;
    spec.depth = depth;
    spec.width = width;
    spec.widthPad = widthPad;
    spec.valuesNonFinite = nonFinite;
    spec.causal = causal;
    spec.logits = [&](CK &kk, Value dot, Value bi, Value i, Value j0) {
      Value x = kk.fdiv(dot, kk.constLike(kk.vf32(), tau));
      Value valid;
      if (keyValid)
        valid = kk.cmpf(arith::CmpFPredicate::ONE, kk.vload(keyValid, {bi, j0}),
                        kk.constLike(kk.vf32(), 0.0));
      if (causal) {
        Value js = kk.iota(kk.castInt(j0, kk.i32()), kLanes);
        Value before = kk.cmpi(arith::CmpIPredicate::sle, js,
                               kk.splat(kk.castInt(i, kk.i32()), kLanes));
        valid = valid ? kk.andI(valid, before) : before;
      }
      if (!valid)
        return x;
      return kk.select(valid, x, kk.negInfLike(kk.vf32()));
    };
    emitFlashMix(k, opts, spec);

    Value p = k.tensor(out);
    if (p.getType() != op.getP().getType())
      p = tensor::CastOp::create(b, op.getP().getType(), p);
    rw.replaceOp(op, p);
    return success();
  }
};
} // namespace

void mlir::moe::cpu::populateSimilarityInformKernel(RewritePatternSet &p,
                                                    const KernelOptions &o) {
  p.add<SimilarityInformKernel>(p.getContext(), o);
}
