//===- AttentionPosterior.cpp - moe.attention_posterior -> fast CPU kernel ===//
//
// Part of the MoE-MLIR project.
//
// head_select = min_entropy (the all-heads form stays on the portable
// lowering):
//  1. Prior statistics of every attention row (max, Σ exp(s - max),
//     Σ exp(s - max)·s), one row per work item, vector<16> passes over the
//     keys (the only pass over all H heads of `scores`).
//  2. h*[b]: the mean row entropy per head and its argmin (ties to the lowest
//     head, NaN first), sequential and in the portable lowering's order.
//  3. Head means of h* only (packHeadMeans, shared with the backward kernel), m[b,j,:] = head_scale · v[b,h*,j,:] · wo_h*^T
//     (dots along wo's rows: wo is read in place, never transposed),
//     written straight into the tiled transposed key layout of the flash
//     kernel, and ‖m_j‖².
//  4. The posterior mix with the flash kernel of Flash.h: q = u, keys m,
//     logit (s + <u_i,m_j>/σ²) − ‖m_j‖²/(2σ²), -inf where s = -inf.
// Stages 1 and 3 run on the calling thread when their work is small (decode:
// waking the thread pool would cost more than the work).
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Kernels.h"

#include "../MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu {

namespace {

/// r[i] = Σ_l v[i][l] for 16 vector<16xf32>: a tree of lane-half shuffles
/// (4 levels; the order of the additions is fixed, so deterministic).
Value sumLanes(CK &k, ArrayRef<Value> v) {
  SmallVector<Value> level(v);
  for (int64_t size = kLanes; size > 1; size /= 2) {
    int64_t groups = kLanes / size, half = size / 2;
    SmallVector<int64_t> lo, hi;
    for (int64_t from : {int64_t(0), kLanes}) // x's lanes, then y's
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t t = 0; t < half; ++t) {
          lo.push_back(from + g * size + t);
          hi.push_back(from + g * size + half + t);
        }
    SmallVector<Value> next;
    for (size_t p = 0; p + 1 < level.size(); p += 2) {
      Value a = vector::ShuffleOp::create(k.b, level[p], level[p + 1], lo);
      Value c = vector::ShuffleOp::create(k.b, level[p], level[p + 1], hi);
      next.push_back(k.fadd(a, c));
    }
    level = std::move(next);
  }
  return level.front();
}

} // namespace

Value headScaleValue(CK &k, std::optional<double> scale, Value heads) {
  if (scale)
    return k.cF32(*scale);
  return k.sitofp(k.castInt(heads, k.i64()));
}

HeadMeans packHeadMeans(CK &k, const KernelOptions &opts, Value v, Value wo,
                        Value head, Value scale, Value batch, Value keys,
                        Value model, Value headDim) {
  // m[b,j,:] = head_scale · v[b,h,j,:] · wo_h^T, h = head[b], in blocks of 16
  // model columns: the dot over c runs along wo's rows (contiguous, no
  // transposed copy of wo: that copy alone is D·Dh scalar moves, the cost of
  // ~16 keys) and the block's 16 partial vectors are summed by a shuffle
  // tree. Padding keys are zeros.
  Type f32 = k.f32();
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value zeros = k.constLike(k.vf32(), 0.0);
  Value keysPad = roundUp(k, keys, kKeyTile);
  Value keysT = k.alloc(MemRefType::get({kDyn, kDyn, kDyn, kKeyTile}, f32),
                        {batch, k.divu(keysPad, k.idx(kKeyTile)), model});
  Value norm2 = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, keysPad});
  Value modelPad = roundUp(k, model, kLanes);
  Value modelChunks = k.divu(modelPad, k.idx(kLanes));
  Value headChunks = k.ceilDiv(headDim, k.idx(kLanes));
  Value lastCol = k.sub(model, c1);
  Value rowAll = k.scratch(opts, MemRefType::get({kDyn}, f32), {modelPad});
  Value meanWork = k.mul(k.mul(k.mul(batch, keys), model), headDim);
  workersIfLarge(k, opts, k.mul(batch, keysPad), meanWork,
                 [&](Value item, Value worker) {
    Value row = k.workerSlice(rowAll, worker);
    Value bi = k.divu(item, keysPad), j = k.remu(item, keysPad);
    Value inRange = k.cmpi(arith::CmpIPredicate::ult, j, keys);
    k.ifThen(inRange, [&] {
      Value h = k.castInt(k.load(head, {bi}), k.b.getIndexType());
      Value col0 = k.mul(h, headDim);
      k.forLoop(c0, modelChunks, c1, [&](Value dc) {
        Value d0 = k.mul(dc, k.idx(kLanes));
        SmallVector<Value> init(kLanes, zeros);
        SmallVector<Value> part = k.forLoop(
            c0, headChunks, c1, init,
            [&](Value cc, ValueRange acc) -> SmallVector<Value> {
              Value cb = k.mul(cc, k.idx(kLanes));
              Value count = k.sub(headDim, cb);
              Value x = k.vloadMasked(v, {bi, h, j, cb}, count, 0.0);
              Value col = k.add(col0, cb);
              SmallVector<Value> next;
              for (int64_t r = 0; r < kLanes; ++r) {
                // Columns past D repeat the last one (never stored).
                Value d = k.mins(k.add(d0, k.idx(r)), lastCol);
                Value w = k.vloadMasked(wo, {d, col}, count, 0.0);
                next.push_back(k.fma(x, w, acc[r]));
              }
              return next;
            });
        k.vstore(k.fmul(k.splat(scale, kLanes), sumLanes(k, part)), row,
                 {d0});
      });
    });
    Value n2 = k.forLoop(c0, model, c1, ValueRange{k.cF32(0.0)},
                         [&](Value d, ValueRange a) -> SmallVector<Value> {
                           Value m = k.select(inRange, k.load(row, {d}),
                                              k.cF32(0.0));
                           k.store(m, keysT,
                                   {bi, k.divu(j, k.idx(kKeyTile)), d,
                                    k.remu(j, k.idx(kKeyTile))});
                           return {k.fadd(a[0], k.fmul(m, m))};
                         })[0];
    k.store(n2, norm2, {bi, j});
  });
  return {keysT, norm2, keysPad};
}

std::function<Value(CK &, Value, Value, Value, Value)>
posteriorLogits(Value scores, Value head, Value norm2, Value keys,
                float sigma2) {
  return [=](CK &kk, Value dot, Value bi, Value i, Value j0) {
    double negInf = -std::numeric_limits<double>::infinity();
    Value h = kk.castInt(kk.load(head, {bi}), kk.b.getIndexType());
    Value s = kk.vloadMasked(scores, {bi, h, i, j0}, kk.sub(keys, j0), negInf);
    Value n = kk.vload(norm2, {bi, j0});
    Value s2 = kk.constLike(kk.vf32(), sigma2);
    Value logit =
        kk.fsub(kk.fadd(s, kk.fdiv(dot, s2)),
                kk.fdiv(kk.fmul(kk.constLike(kk.vf32(), 0.5), n), s2));
    Value masked =
        kk.cmpf(arith::CmpFPredicate::OEQ, s, kk.negInfLike(kk.vf32()));
    return kk.select(masked, kk.negInfLike(kk.vf32()), logit);
  };
}

namespace {

struct AttentionPosteriorKernel
    : KernelPattern<AttentionPosteriorOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(AttentionPosteriorOp op, CK &k,
                     PatternRewriter &rw) const override {
    if (op.getHeadSelect() != HeadSelect::min_entropy)
      return rw.notifyMatchFailure(op, "head_select = all: portable lowering");
    // p [B, N, K] and head [B].
    SmallVector<Value> sSizes = k.sizes(op.getScores());
    Value widthSize = k.sizes(op.getE())[2];
    KernelScope kernel(
        k, {op.getScores(), op.getU(), op.getV(), op.getWo(), op.getE()},
        KernelScope::outsOf(op, {{sSizes[0], sSizes[2], widthSize},
                                 {sSizes[0]}}));
    ImplicitLocOpBuilder &b = k.b;
    Type f32 = k.f32(), i32 = k.i32();
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value scores = k.buffer(op.getScores()), u = k.buffer(op.getU());
    Value v = k.buffer(op.getV()), wo = k.buffer(op.getWo());
    Value e = k.buffer(op.getE());
    Value batch = k.dim(scores, 0), heads = k.dim(scores, 1);
    Value rows = k.dim(scores, 2), keys = k.dim(scores, 3);
    Value model = k.dim(u, 2), headDim = k.dim(v, 3);
    float sigma = op.getSigma().convertToFloat();
    float sigma2 = sigma * sigma;
    double negInf = -std::numeric_limits<double>::infinity();

    // 1. Prior statistics per attention row.
    auto statType = MemRefType::get({kDyn, kDyn, kDyn}, f32);
    Value pMax = k.alloc(statType, {batch, heads, rows});
    Value pSum = k.alloc(statType, {batch, heads, rows});
    Value pSumS = k.alloc(statType, {batch, heads, rows});
    Value keyChunks = k.ceilDiv(keys, k.idx(kLanes));
    Value zeros = k.constLike(k.vf32(), 0.0);
    Value negInfV = k.negInfLike(k.vf32());
    Value statWork = k.mul(k.mul(k.mul(batch, heads), rows), keys);
    workersIfLarge(k, opts, k.mul(k.mul(batch, heads), rows), statWork,
                   [&](Value item, Value) {
      Value i = k.remu(item, rows);
      Value bh = k.divu(item, rows);
      Value h = k.remu(bh, heads), bi = k.divu(bh, heads);
      auto chunk = [&](Value c) {
        Value j0 = k.mul(c, k.idx(kLanes));
        return k.vloadMasked(scores, {bi, h, i, j0}, k.sub(keys, j0), negInf);
      };
      Value mx =
          k.maxf(k.forLoop(c0, keyChunks, c1, ValueRange{negInfV},
                           [&](Value c, ValueRange a) -> SmallVector<Value> {
                             return {k.fmax(a[0], chunk(c))};
                           })[0]);
      Value mv = k.splat(mx, kLanes);
      SmallVector<Value> sums =
          k.forLoop(c0, keyChunks, c1, ValueRange{zeros, zeros},
                    [&](Value c, ValueRange a) -> SmallVector<Value> {
                      Value s = chunk(c);
                      Value t = k.exp(k.fsub(s, mv));
                      Value masked =
                          k.cmpf(arith::CmpFPredicate::OEQ, s, negInfV);
                      // 0 · log 0 = 0: a masked key adds nothing.
                      Value ts = k.select(masked, zeros, k.fmul(t, s));
                      return {k.fadd(a[0], t), k.fadd(a[1], ts)};
                    });
      k.store(mx, pMax, {bi, h, i});
      k.store(k.sum(sums[0]), pSum, {bi, h, i});
      k.store(k.sum(sums[1]), pSumS, {bi, h, i});
    });

    // 2. h* per batch element.
    Value head = kernel.out(1);
    Value numHeadsI32 = k.castInt(heads, i32);
    k.forLoop(c0, batch, c1, [&](Value bi) {
      SmallVector<Value> best = k.forLoop(
          c0, heads, c1,
          ValueRange{k.cF32(std::numeric_limits<double>::infinity()),
                     numHeadsI32},
          [&](Value h, ValueRange it) -> SmallVector<Value> {
            SmallVector<Value> tot = k.forLoop(
                c0, rows, c1, ValueRange{k.cF32(0.0), k.cF32(0.0)},
                [&](Value i, ValueRange a) -> SmallVector<Value> {
                  Value mx = k.load(pMax, {bi, h, i});
                  Value se = k.load(pSum, {bi, h, i});
                  Value sw = k.load(pSumS, {bi, h, i});
                  Value valid =
                      k.cmpf(arith::CmpFPredicate::UNE, mx, k.negInfLike(f32));
                  Value lse = k.fadd(mx, k.log(se));
                  Value entropy = k.fsub(lse, k.fdiv(sw, se));
                  return {
                      k.fadd(a[0], k.select(valid, entropy, k.cF32(0.0))),
                      k.fadd(a[1], k.select(valid, k.cF32(1.0), k.cF32(0.0)))};
                });
            Value some = k.cmpf(arith::CmpFPredicate::OGT, tot[1], k.cF32(0.0));
            Value mean = k.select(some, k.fdiv(tot[0], tot[1]), k.cF32(0.0));
            Value hI = k.castInt(h, i32);
            Value take = lowering::ranksBefore(b, b.getLoc(), mean, hI, it[0],
                                               it[1], /*descending=*/false);
            return {k.select(take, mean, it[0]), k.select(take, hI, it[1])};
          });
      k.store(best[1], head, {bi});
    });

    // 3. Head means of h*, written straight into the flash kernel's tiled
    //    transposed key layout.
    Value scale = headScaleValue(k, op.getEffectiveHeadScale(), heads);
    HeadMeans means =
        packHeadMeans(k, opts, v, wo, head, scale, batch, keys, model, headDim);
    Value keysPad = means.keysPad, keysT = means.keysT, norm2 = means.norm2;

    // 4. The posterior mix.
    Value out = kernel.out(0);
    FlashSpec mix =
        flashSpec(k, u, keysT, keysPad, e, out, batch, rows, keys, model,
                  posteriorLogits(scores, head, norm2, keys, sigma2));
    mix.tilesPerBlock = 1; // the logits stream the scores rows
    emitFlashMix(k, opts, mix);

    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateAttentionPosteriorKernel, AttentionPosteriorKernel)

} // namespace mlir::moe::cpu
