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

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu {

Value headScaleValue(CpuKernelBuilder &k, std::optional<double> scale,
                     Value heads) {
  if (scale)
    return k.cF32(*scale);
  return k.sitofp(k.castInt(heads, k.i64()));
}

HeadMeans packHeadMeans(CpuKernelBuilder &k, const KernelOptions &opts, Value v,
                        Value wo, Value head, Value scale, Value batch,
                        Value keys, Value model, Value headDim) {
  // m[b,j,:] = head_scale · v[b,h,j,:] · wo_h^T, h = head[b], one key tile
  // an item, computed in its keysT layout: the tile's values transposed into
  // vT [Dh, kKeyTile] (zeros for padding keys), then for kMeanRows model
  // rows d at a time keysT[b, jt, d, :] = Σ_c wo[d, h·Dh + c] · vT[c, :] (wo
  // scalars broadcast, vectors over the tile's keys) and ‖m_j‖² summed over
  // d in the same vectors. Per key and model column, the dot over c with a
  // shuffle tree and a store into the key's column of the tile (stride 128 B,
  // a scatter) took half the decode-size forward (D = 512, Nk = 64).
  constexpr int64_t TK = kKeyTile, KV = TK / kLanes;
  const int64_t kMeanRows = opts.vectorBits >= 512 ? 4 : 2;
  Type f32 = k.f32();
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value zeros = k.constLike(k.vf32(), 0.0);
  Value keysPad = roundUp(k, keys, kKeyTile);
  Value keyTiles = k.divu(keysPad, k.idx(TK));
  Value keysT = k.alloc(MemRefType::get({kDyn, kDyn, kDyn, kKeyTile}, f32),
                        {batch, keyTiles, model});
  Value norm2 = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, keysPad});
  Value vtAll = k.scratch(opts, MemRefType::get({kDyn, TK}, f32), {headDim});
  Value meanWork = k.mul(k.mul(k.mul(batch, keys), model), headDim);
  Value scaleV = k.splat(scale, kLanes);
  Value rowsStep = k.idx(kMeanRows);
  workersIfLarge(k, opts, k.mul(batch, keyTiles), meanWork,
                 [&](Value item, Value worker) {
    Value vT = k.workerSlice(vtAll, worker);
    Value bi = k.divu(item, keyTiles), jt = k.remu(item, keyTiles);
    Value j0 = k.mul(jt, k.idx(TK));
    Value h = k.castInt(k.load(head, {bi}), k.b.getIndexType());
    Value col0 = k.mul(h, headDim);
    // vT[c, l] = v[b, h, j0 + l, c], 0 past the keys.
    k.forLoop(c0, k.idx(TK), c1, [&](Value l) {
      Value j = k.add(j0, l);
      Value in = k.cmpi(arith::CmpIPredicate::ult, j, keys);
      Value jc = k.mins(j, k.sub(keys, c1));
      k.forLoop(c0, headDim, c1, [&](Value c) {
        k.store(k.select(in, k.loadF(v, {bi, h, jc, c}), k.cF32(0.0)), vT,
                {c, l});
      });
    });
    // Rows d0 .. d0 + kMeanRows - 1 (past D: the last row again, not
    // stored); n2 accumulates ‖m_j‖² over the stored rows.
    auto rowBlock = [&](Value d0, ValueRange n2, bool whole) {
      SmallVector<Value> ds;
      for (int64_t r = 0; r < kMeanRows; ++r)
        ds.push_back(whole ? k.add(d0, k.idx(r))
                           : k.mins(k.add(d0, k.idx(r)), k.sub(model, c1)));
      SmallVector<Value> init(kMeanRows * KV, zeros);
      SmallVector<Value> acc = k.forLoop(
          c0, headDim, c1, init,
          [&](Value c, ValueRange a) -> SmallVector<Value> {
            SmallVector<Value> x;
            for (int64_t q = 0; q < KV; ++q)
              x.push_back(k.vload(vT, {c, k.idx(q * kLanes)}));
            SmallVector<Value> next;
            for (int64_t r = 0; r < kMeanRows; ++r) {
              Value w = k.splat(k.loadF(wo, {ds[r], k.add(col0, c)}), kLanes);
              for (int64_t q = 0; q < KV; ++q)
                next.push_back(k.fma(w, x[q], a[r * KV + q]));
            }
            return next;
          });
      SmallVector<Value> out(n2);
      for (int64_t r = 0; r < kMeanRows; ++r) {
        auto store = [&] {
          for (int64_t q = 0; q < KV; ++q) {
            Value m = k.fmul(scaleV, acc[r * KV + q]);
            k.vstore(m, keysT, {bi, jt, ds[r], k.idx(q * kLanes)});
          }
        };
        if (whole) {
          store();
        } else {
          k.ifThen(k.cmpi(arith::CmpIPredicate::ult, k.add(d0, k.idx(r)),
                          model),
                   store);
        }
        // (Rows past D only repeat the last one: they add nothing.)
        Value keep = whole ? Value()
                           : k.cmpi(arith::CmpIPredicate::ult,
                                    k.add(d0, k.idx(r)), model);
        for (int64_t q = 0; q < KV; ++q) {
          Value m = k.fmul(scaleV, acc[r * KV + q]);
          Value sq = k.fma(m, m, out[q]);
          out[q] = keep ? k.select(keep, sq, out[q]) : sq;
        }
      }
      return out;
    };
    Value whole = k.mul(k.divu(model, rowsStep), rowsStep);
    SmallVector<Value> n2Init(KV, zeros);
    SmallVector<Value> n2 = k.forLoop(
        c0, whole, rowsStep, n2Init,
        [&](Value d0, ValueRange a) -> SmallVector<Value> {
          return rowBlock(d0, a, true);
        });
    n2 = k.forLoop(whole, model, rowsStep, n2,
                   [&](Value d0, ValueRange a) -> SmallVector<Value> {
                     return rowBlock(d0, a, false);
                   });
    for (int64_t q = 0; q < KV; ++q)
      k.vstore(n2[q], norm2, {bi, k.add(j0, k.idx(q * kLanes))});
  });
  return {keysT, norm2, keysPad};
}

std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
posteriorLogits(Value scores, Value head, Value norm2, Value keys,
                float sigma2) {
  return [=](CpuKernelBuilder &kk, Value dot, Value bi, Value i, Value j0) {
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

  LogicalResult emit(AttentionPosteriorOp op, CpuKernelBuilder &k,
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
