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
#include "Lowerings.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu_lowering {

Value headScaleValue(CpuKernelBuilder &kb, std::optional<double> scale,
                     Value heads) {
  if (scale)
    return kb.cF32(*scale);
  return kb.sitofp(kb.castInt(heads, kb.i64()));
}

HeadMeans packHeadMeans(CpuKernelBuilder &kb, const KernelOptions &opts, Value v,
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
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  Value keysPad = roundUp(kb, keys, kKeyTile);
  Value keyTiles = kb.divu(keysPad, kb.idx(TK));
  Value keysT = kb.alloc(MemRefType::get({kDyn, kDyn, kDyn, kKeyTile}, f32),
                        {batch, keyTiles, model});
  Value norm2 = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, keysPad});
  Value vtAll = kb.scratch(opts, MemRefType::get({kDyn, TK}, f32), {headDim});
  Value meanWork = kb.mul(kb.mul(kb.mul(batch, keys), model), headDim);
  Value scaleV = kb.splat(scale, kLanes);
  Value rowsStep = kb.idx(kMeanRows);
  workersIfLarge(kb, opts, kb.mul(batch, keyTiles), meanWork,
                 [&](Value item, Value worker) {
    Value vT = kb.workerSlice(vtAll, worker);
    Value bi = kb.divu(item, keyTiles), jt = kb.remu(item, keyTiles);
    Value j0 = kb.mul(jt, kb.idx(TK));
    Value h = kb.castInt(kb.load(head, {bi}), kb.b.getIndexType());
    Value col0 = kb.mul(h, headDim);
    // vT[c, l] = v[b, h, j0 + l, c], 0 past the keys.
    kb.forLoop(c0, kb.idx(TK), c1, [&](Value l) {
      Value j = kb.add(j0, l);
      Value in = kb.cmpi(arith::CmpIPredicate::ult, j, keys);
      Value jc = kb.mins(j, kb.sub(keys, c1));
      kb.forLoop(c0, headDim, c1, [&](Value c) {
        kb.store(kb.select(in, kb.loadF(v, {bi, h, jc, c}), kb.cF32(0.0)), vT,
                {c, l});
      });
    });
    // Rows d0 .. d0 + kMeanRows - 1 (past D: the last row again, not
    // stored); n2 accumulates ‖m_j‖² over the stored rows.
    auto rowBlock = [&](Value d0, ValueRange n2, bool whole) {
      SmallVector<Value> ds;
      for (int64_t r = 0; r < kMeanRows; ++r)
        ds.push_back(whole ? kb.add(d0, kb.idx(r))
                           : kb.mins(kb.add(d0, kb.idx(r)), kb.sub(model, c1)));
      SmallVector<Value> init(kMeanRows * KV, zeros);
      SmallVector<Value> acc = kb.forLoop(
          c0, headDim, c1, init,
          [&](Value c, ValueRange a) -> SmallVector<Value> {
            SmallVector<Value> x;
            for (int64_t q = 0; q < KV; ++q)
              x.push_back(kb.vload(vT, {c, kb.idx(q * kLanes)}));
            SmallVector<Value> next;
            for (int64_t r = 0; r < kMeanRows; ++r) {
              Value w = kb.splat(kb.loadF(wo, {ds[r], kb.add(col0, c)}), kLanes);
              for (int64_t q = 0; q < KV; ++q)
                next.push_back(kb.fma(w, x[q], a[r * KV + q]));
            }
            return next;
          });
      SmallVector<Value> out(n2);
      for (int64_t r = 0; r < kMeanRows; ++r) {
        auto store = [&] {
          for (int64_t q = 0; q < KV; ++q) {
            Value m = kb.fmul(scaleV, acc[r * KV + q]);
            kb.vstore(m, keysT, {bi, jt, ds[r], kb.idx(q * kLanes)});
          }
        };
        if (whole) {
          store();
        } else {
          kb.ifThen(kb.cmpi(arith::CmpIPredicate::ult, kb.add(d0, kb.idx(r)),
                          model),
                   store);
        }
        // (Rows past D only repeat the last one: they add nothing.)
        Value keep = whole ? Value()
                           : kb.cmpi(arith::CmpIPredicate::ult,
                                    kb.add(d0, kb.idx(r)), model);
        for (int64_t q = 0; q < KV; ++q) {
          Value m = kb.fmul(scaleV, acc[r * KV + q]);
          Value sq = kb.fma(m, m, out[q]);
          out[q] = keep ? kb.select(keep, sq, out[q]) : sq;
        }
      }
      return out;
    };
    Value whole = kb.mul(kb.divu(model, rowsStep), rowsStep);
    SmallVector<Value> n2Init(KV, zeros);
    SmallVector<Value> n2 = kb.forLoop(
        c0, whole, rowsStep, n2Init,
        [&](Value d0, ValueRange a) -> SmallVector<Value> {
          return rowBlock(d0, a, true);
        });
    n2 = kb.forLoop(whole, model, rowsStep, n2,
                   [&](Value d0, ValueRange a) -> SmallVector<Value> {
                     return rowBlock(d0, a, false);
                   });
    for (int64_t q = 0; q < KV; ++q)
      kb.vstore(n2[q], norm2, {bi, kb.add(j0, kb.idx(q * kLanes))});
  });
  return {keysT, norm2, keysPad};
}

std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
posteriorLogits(Value scores, Value head, Value norm2, Value keys,
                double sigma) {
  kernels::FlashLogitSpec spec = kernels::attentionPosteriorLogit(sigma);
  return [=](CpuKernelBuilder &kk, Value dot, Value bi, Value i, Value j0) {
    double negInf = -std::numeric_limits<double>::infinity();
    Value h = kk.castInt(kk.load(head, {bi}), kk.b.getIndexType());
    Value s = kk.vloadMasked(scores, {bi, h, i, j0}, kk.sub(keys, j0), negInf);
    return kernels::flashLogit(
        kk, spec, dot,
        [&] {
          // The GPU's bias[b, j] (attention_head_means), here per key tile.
          Value n = kk.vload(norm2, {bi, j0});
          return kk.fdiv(n, kk.constLike(kk.vf32(), -2.0 * sigma * sigma));
        },
        [&] { return s; },
        [&] {
          // Padding keys load s = -inf; UNE keeps a NaN score's NaN.
          return kk.cmpf(arith::CmpFPredicate::UNE, s, kk.negInfLike(kk.vf32()));
        });
  };
}

template <>
LogicalResult CPUKernel<AttentionPosteriorOp>::emit(AttentionPosteriorOp op,
                                                    CpuKernelBuilder &kb,
                                                    PatternRewriter &rw) const {
  if (failed(matchMinEntropyHead(op, rw)))
    return failure();
  // p [B, N, K] and head [B].
  SmallVector<Value> sSizes = kb.sizes(op.getScores());
  Value widthSize = kb.sizes(op.getE())[2];
  KernelScope kernel(
      kb, {op.getScores(), op.getU(), op.getV(), op.getWo(), op.getE()},
      KernelScope::outsOf(op, {{sSizes[0], sSizes[2], widthSize},
                               {sSizes[0]}}));
  ImplicitLocOpBuilder &b = kb.b;
  Type f32 = kb.f32(), i32 = kb.i32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value scores = kb.buffer(op.getScores()), u = kb.buffer(op.getU());
  Value v = kb.buffer(op.getV()), wo = kb.buffer(op.getWo());
  Value e = kb.buffer(op.getE());
  Value batch = kb.dim(scores, 0), heads = kb.dim(scores, 1);
  Value rows = kb.dim(scores, 2), keys = kb.dim(scores, 3);
  Value model = kb.dim(u, 2), headDim = kb.dim(v, 3);
  double negInf = -std::numeric_limits<double>::infinity();

  // 1. Prior statistics per attention row.
  auto statType = MemRefType::get({kDyn, kDyn, kDyn}, f32);
  Value pMax = kb.alloc(statType, {batch, heads, rows});
  Value pSum = kb.alloc(statType, {batch, heads, rows});
  Value pSumS = kb.alloc(statType, {batch, heads, rows});
  Value keyChunks = kb.ceilDiv(keys, kb.idx(kLanes));
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  Value negInfV = kb.negInfLike(kb.vf32());
  Value statWork = kb.mul(kb.mul(kb.mul(batch, heads), rows), keys);
  workersIfLarge(kb, opts, kb.mul(kb.mul(batch, heads), rows), statWork,
                 [&](Value item, Value) {
    Value i = kb.remu(item, rows);
    Value bh = kb.divu(item, rows);
    Value h = kb.remu(bh, heads), bi = kb.divu(bh, heads);
    auto chunk = [&](Value c) {
      Value j0 = kb.mul(c, kb.idx(kLanes));
      return kb.vloadMasked(scores, {bi, h, i, j0}, kb.sub(keys, j0), negInf);
    };
    Value mx =
        kb.maxf(kb.forLoop(c0, keyChunks, c1, ValueRange{negInfV},
                         [&](Value c, ValueRange a) -> SmallVector<Value> {
                           return {kb.fmax(a[0], chunk(c))};
                         })[0]);
    Value mv = kb.splat(mx, kLanes);
    SmallVector<Value> sums =
        kb.forLoop(c0, keyChunks, c1, ValueRange{zeros, zeros},
                  [&](Value c, ValueRange a) -> SmallVector<Value> {
                    Value s = chunk(c);
                    Value t = kb.exp(kb.fsub(s, mv));
                    Value masked =
                        kb.cmpf(arith::CmpFPredicate::OEQ, s, negInfV);
                    // 0 · log 0 = 0: a masked key adds nothing.
                    Value ts = kb.select(masked, zeros, kb.fmul(t, s));
                    return {kb.fadd(a[0], t), kb.fadd(a[1], ts)};
                  });
    kb.store(mx, pMax, {bi, h, i});
    kb.store(kb.sum(sums[0]), pSum, {bi, h, i});
    kb.store(kb.sum(sums[1]), pSumS, {bi, h, i});
  });

  // 2. h* per batch element.
  Value head = kernel.out(1);
  Value numHeadsI32 = kb.castInt(heads, i32);
  kb.forLoop(c0, batch, c1, [&](Value bi) {
    SmallVector<Value> best = kb.forLoop(
        c0, heads, c1,
        ValueRange{kb.cF32(std::numeric_limits<double>::infinity()),
                   numHeadsI32},
        [&](Value h, ValueRange it) -> SmallVector<Value> {
          SmallVector<Value> tot = kb.forLoop(
              c0, rows, c1, ValueRange{kb.cF32(0.0), kb.cF32(0.0)},
              [&](Value i, ValueRange a) -> SmallVector<Value> {
                Value mx = kb.load(pMax, {bi, h, i});
                Value se = kb.load(pSum, {bi, h, i});
                Value sw = kb.load(pSumS, {bi, h, i});
                Value valid =
                    kb.cmpf(arith::CmpFPredicate::UNE, mx, kb.negInfLike(f32));
                Value lse = kb.fadd(mx, kb.log(se));
                Value entropy = kb.fsub(lse, kb.fdiv(sw, se));
                return {
                    kb.fadd(a[0], kb.select(valid, entropy, kb.cF32(0.0))),
                    kb.fadd(a[1], kb.select(valid, kb.cF32(1.0), kb.cF32(0.0)))};
              });
          Value some = kb.cmpf(arith::CmpFPredicate::OGT, tot[1], kb.cF32(0.0));
          Value mean = kb.select(some, kb.fdiv(tot[0], tot[1]), kb.cF32(0.0));
          Value hI = kb.castInt(h, i32);
          Value take = linalg_lowering::ranksBefore(
              b, b.getLoc(), mean, hI, it[0], it[1], /*descending=*/false);
          return {kb.select(take, mean, it[0]), kb.select(take, hI, it[1])};
        });
    kb.store(best[1], head, {bi});
  });

  // 3. Head means of h*, written straight into the flash kernel's tiled
  //    transposed key layout.
  Value scale = headScaleValue(kb, op.getEffectiveHeadScale(), heads);
  HeadMeans means =
      packHeadMeans(kb, opts, v, wo, head, scale, batch, keys, model, headDim);
  Value keysPad = means.keysPad, keysT = means.keysT, norm2 = means.norm2;

  // 4. The posterior mix.
  Value out = kernel.out(0);
  FlashSpec mix =
      flashSpec(kb, u, keysT, keysPad, e, out, batch, rows, keys, model,
                posteriorLogits(scores, head, norm2, keys,
                                op.getSigma().convertToDouble()));
  mix.tilesPerBlock = 1; // the logits stream the scores rows
  emitFlashMix(kb, opts, mix);

  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
