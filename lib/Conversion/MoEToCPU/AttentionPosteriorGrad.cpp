//===- AttentionPosteriorGrad.cpp - moe.attention_posterior_grad -> CPU ---===//
//
// Part of the MoE-MLIR project.
//
// The flash-style backward of Attention-Inform mixing for head_select =
// min_entropy (the maths is in the op description, MoEGradOps.td; the
// all-heads form stays on the portable lowering, as its forward does), at the
// forward's head h* (an operand), in streaming passes that store nothing
// N x Nk besides the result d_scores:
//  1. the forward's head means m of h* (packHeadMeans) and the forward kernel
//     (emitFlashMix with the forward's logit epilogue) recompute p and the row
//     log-sum-exp; e enters with its non-finite entries zeroed (as autograd of
//     the reference, where they get no gradient); then lse' and
//     delta_i = <dp_i, p_i> (gradRowStats);
//  2. query-major (emitFlashGrad, rows i, columns j): G = exp(z - lse'_i),
//     dz = G (<dp_i, e_j> - delta_i), stored into d_scores[b, h*] (its other
//     heads are 0), and d_u_i = Σ_j dz_ij m_j / σ²;
//  3. key-major (rows j, columns i; the same tiles with the roles swapped):
//     d_e_j = Σ_i G_ij dp_i, Σ_i dz_ij u_i and Σ_i dz_ij (a column of ones);
//  4. per key dm_j = c (Σ_i dz_ij u_i − (Σ_i dz_ij) m_j) / σ², then
//     d_v[b, h*, j] = dm_j W_h* and d_wo[:, h* block] = Σ_{b,j} dm_j ⊗ v_j
//     (one worker per row of wo, a fixed order over (b, j)).
// An h* outside [0, H) is reported first (the portable lowering's check,
// lowering::emitIndexCheck) and its batch element skipped: the passes read
// head 0 in its place (in bounds) and its rows get lse' = +inf, so that
// every weight G, and with it every gradient of the element, is 0 (the
// portable lowering's result, where no head matches h*).
// Extra memory: packed copies of u, m, e, dp (O(B·(N + Nk)·(D + K))) and
// per-worker tiles. Every sum has one writer: deterministic whatever the
// thread count.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Kernels.h"

#include "../MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/SegmentedStats.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {

struct AttentionPosteriorGradKernel
    : KernelPattern<AttentionPosteriorGradOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(AttentionPosteriorGradOp op, CK &k,
                     PatternRewriter &rw) const override {
    if (op.getHeadSelect() != HeadSelect::min_entropy)
      return rw.notifyMatchFailure(op, "head_select = all: portable lowering");
    if (hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    Value headCount = getValueOrCreateConstantIndexOp(
        rw, op.getLoc(),
        tensor::getMixedSize(rw, op.getLoc(), op.getScores(), 1));
    if (failed(checkIndexOperand(rw, op, op.getHead(), headCount,
                                 lowering::IndexErrorOp::AttentionHead)))
      return failure();
    // d_scores, d_u, d_v, d_wo, d_e.
    KernelScope kernel = KernelScope::gradientsOf(
        k, op, {op.getScores(), op.getU(), op.getV(), op.getWo(), op.getE()},
        {op.getHead(), op.getDp()});
    Type f32 = k.f32();
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value scores = k.buffer(op.getScores()), u = k.buffer(op.getU());
    Value v = k.buffer(op.getV()), wo = k.buffer(op.getWo());
    Value eIn = k.buffer(op.getE()), headIn = k.buffer(op.getHead());
    Value dp = k.buffer(op.getDp());
    Value batch = k.dim(scores, 0), heads = k.dim(scores, 1);
    // h*[b] in [0, H) (reported above when not).
    Value headsI32 = k.castInt(heads, k.i32());
    auto headInRange = [&](Value bi) {
      return idInRange(k, k.load(headIn, {bi}), headsI32);
    };
    // The heads the passes read: 0 for a skipped batch element.
    Value head = k.alloc(MemRefType::get({kDyn}, k.i32()), {batch});
    k.forLoop(c0, batch, c1, [&](Value bi) {
      Value h = k.load(headIn, {bi});
      Value ok = idInRange(k, h, headsI32);
      k.store(k.select(ok, h, k.cI32(0)), head, {bi});
    });
    Value rows = k.dim(scores, 2), keys = k.dim(scores, 3);
    Value model = k.dim(u, 2), headDim = k.dim(v, 3), width = k.dim(eIn, 2);
    float sigma = op.getSigma().convertToFloat();
    float sigma2 = sigma * sigma;
    Value zeros = k.constLike(k.vf32(), 0.0);
    auto rank3 = MemRefType::get({kDyn, kDyn, kDyn}, f32);
    auto headOf = [&](CK &kk, Value bi) {
      return kk.castInt(kk.load(head, {bi}), kk.b.getIndexType());
    };
    auto widthLoop = [&](Value n, function_ref<void(Value col, Value count)>
                                      body) {
      k.forLoop(c0, k.ceilDiv(n, k.idx(kLanes)), c1, [&](Value c) {
        Value col = k.mul(c, k.idx(kLanes));
        body(col, k.sub(n, col));
      });
    };
    // kChains chunks of kLanes columns a step (counts <= 0 past the end:
    // masked to nothing), for the sums below that run over a long index:
    // one accumulator a chunk would wait on the FMA latency each step; four
    // independent ones do not, and each element's sum keeps its order.
    constexpr int64_t kChains = 4;
    auto chunkGroups =
        [&](Value n,
            function_ref<void(ArrayRef<Value> cols, ArrayRef<Value> counts)>
                body) {
          k.forLoop(c0, k.ceilDiv(n, k.idx(kChains * kLanes)), c1,
                    [&](Value g) {
                      SmallVector<Value> cols, counts;
                      for (int64_t q = 0; q < kChains; ++q) {
                        Value col = k.idx(q * kLanes);
                        col = k.add(k.mul(g, k.idx(kChains * kLanes)), col);
                        Value count = k.sub(n, col);
                        // (A chunk past the end reads and writes nothing;
                        // its index is 0 to stay inside the memref.)
                        cols.push_back(k.select(
                            k.cmpi(arith::CmpIPredicate::sgt, count, c0), col,
                            c0));
                        counts.push_back(count);
                      }
                      body(cols, counts);
                    });
        };

    // e with its non-finite entries zeroed (they get no gradient and enter
    // <dp_i, e_j> as 0, as in autograd of the reference).
    Value e = k.alloc(rank3, {batch, keys, width});
    Value posInfV = k.constLike(k.vf32(), std::numeric_limits<float>::infinity());
    // to = from ([B, Nk, K] f32, or e itself) where e is finite, else 0.
    auto zeroWhereENonFinite = [&](Value from, Value to) {
      k.forLoop(c0, batch, c1, [&](Value bi) {
        k.forLoop(c0, keys, c1, [&](Value j) {
          widthLoop(width, [&](Value col, Value count) {
            Value x = k.vloadMasked(eIn, {bi, j, col}, count, 0.0);
            Value finite =
                k.cmpf(arith::CmpFPredicate::ONE, k.fabs(x), posInfV);
            Value y =
                from == eIn ? x : k.vloadMasked(from, {bi, j, col}, count, 0.0);
            k.vstoreMasked(k.select(finite, y, zeros), to, {bi, j, col}, count);
          });
        });
      });
    };
    zeroWhereENonFinite(eIn, e);

    // 1. Head means of h*, p and lse recomputed by the forward kernel.
    Value scale = headScaleValue(k, op.getEffectiveHeadScale(), heads);
    HeadMeans means =
        packHeadMeans(k, opts, v, wo, head, scale, batch, keys, model, headDim);
    Value keysPad = means.keysPad;
    Value modelPad = roundUp(k, model, kLanes);
    Value rowsPad = roundUp(k, rows, kKeyTile);
    auto logits = posteriorLogits(scores, head, means.norm2, keys, sigma2);
    Value p = k.alloc(rank3, {batch, rows, width});
    Value lse = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rows});
    FlashSpec fwd = flashSpec(k, u, means.keysT, keysPad, e, p, batch, rows,
                              keys, model, logits);
    fwd.lse = lse;
    fwd.tilesPerBlock = 1; // as the forward's (AttentionPosterior.cpp)
    emitFlashMix(k, opts, fwd);
    Value widthPad = fwd.widthPad;
    auto [lseRow, delta] =
        gradRowStats(k, lse, p, dp, batch, rows, width, widthPad, rowsPad);
    // A skipped batch element: lse' = +inf on its rows, so G = 0.
    Value posInf = k.cF32(std::numeric_limits<float>::infinity());
    k.forLoop(c0, batch, c1, [&](Value bi) {
      k.ifThen(k.notI1(headInRange(bi)), [&] {
        k.forLoop(c0, rowsPad, c1, [&](Value i) {
          k.store(posInf, lseRow, {bi, i});
        });
      });
    });

    // m as rows [B, keysPad, modelPad] (zero padding): the values of the
    // query-major pass and the rows of the key-major pass.
    Value mValues = k.alloc(rank3, {batch, keysPad, modelPad});
    k.forLoop(c0, batch, c1, [&](Value bi) {
      k.forLoop(c0, keysPad, c1, [&](Value j) {
        Value jt = k.divu(j, k.idx(kKeyTile)), jl = k.remu(j, k.idx(kKeyTile));
        k.forLoop(c0, modelPad, c1, [&](Value d) {
          Value in = k.cmpi(arith::CmpIPredicate::ult, d, model);
          Value dc = k.mins(d, k.sub(model, c1));
          k.store(k.select(in, k.load(means.keysT, {bi, jt, dc, jl}),
                           k.cF32(0.0)),
                  mValues, {bi, j, d});
        });
      });
    });

    // d_scores: zero on every head but h*, whose entries pass 2 writes.
    Value dScores = kernel.out(0);
    k.workers(opts, k.mul(k.mul(batch, heads), rows), [&](Value item, Value) {
      Value i = k.remu(item, rows), bh = k.divu(item, rows);
      Value h = k.remu(bh, heads), bi = k.divu(bh, heads);
      widthLoop(keys, [&](Value col, Value count) {
        k.vstoreMasked(zeros, dScores, {bi, h, i, col}, count);
      });
    });

    Value invS2 = k.constLike(k.vf32(), 1.0 / sigma2);

    // 2. Query-major: dz into d_scores, d_u.
    Value eT = packKeysT(k, opts, e, batch, keys, width);
    Value du = kernel.out(1);
    FlashGradSpec byQuery({u, means.keysT, model}, {dp, eT, width}, batch, rows,
                          keys);
    byQuery.weights = [&](CK &kk, Value sDot, Value gDot, Value, Value bi,
                          Value i, Value j0) -> std::pair<Value, Value> {
      Value z = logits(kk, sDot, bi, i, j0);
      Value g = softmaxFromLogSumExp(kk, z, kk.load(lseRow, {bi, i}));
      Value d = kk.splat(kk.load(delta, {bi, i}), kLanes);
      Value dz = kk.fmul(g, kk.fsub(gDot, d));
      // Rows past the end repeat the last row: the same values again.
      kk.vstoreMasked(dz, dScores, {bi, headOf(kk, bi), i, j0},
                      kk.sub(keys, j0));
      return {g, kk.fmul(dz, invS2)};
    };
    byQuery.accumulators.push_back({mValues, du, model, modelPad, true});
    emitFlashGrad(k, opts, byQuery);

    // 3. Key-major: d_e, Σ_i dz u_i and Σ_i dz.
    Value uT = packKeysT(k, opts, u, batch, rows, model);
    Value dpT = packKeysT(k, opts, dp, batch, rows, width);
    Value dpValues = packValues(k, dp, batch, rows, width, rowsPad, widthPad).first;
    Value uValues = packValues(k, u, batch, rows, model, rowsPad, modelPad).first;
    Value ones = k.alloc(rank3, {batch, rowsPad, k.idx(kLanes)});
    Value onesV = k.constLike(k.vf32(), 1.0);
    k.forLoop(c0, batch, c1, [&](Value bi) {
      k.forLoop(c0, rowsPad, c1, [&](Value i) {
        k.vstore(onesV, ones, {bi, i, c0});
      });
    });
    Value de = kernel.out(4);
    Value dzU = k.alloc(rank3, {batch, keys, model});
    Value dzSum = k.alloc(rank3, {batch, keys, c1});
    Value lastRow = k.sub(rows, c1);
    FlashGradSpec byKey({mValues, uT, model}, {e, dpT, width}, batch, keys,
                        rows);
    byKey.weights = [&](CK &kk, Value sDot, Value gDot, Value, Value bi,
                        Value j, Value i0) -> std::pair<Value, Value> {
      // Row j is a key: the scores of queries i0 .. i0 + 15 against it (a
      // strided gather; padding queries read the last row and get lse' =
      // +inf, so G = 0).
      Value h = headOf(kk, bi);
      SmallVector<Value> lanes;
      for (int64_t l = 0; l < kLanes; ++l) {
        Value i = kk.mins(kk.add(i0, kk.idx(l)), lastRow);
        lanes.push_back(kk.loadF(scores, {bi, h, i, j}));
      }
      Value s = vector::FromElementsOp::create(kk.b, kk.vf32(), lanes);
      Value s2 = kk.constLike(kk.vf32(), sigma2);
      Value n = kk.splat(kk.load(means.norm2, {bi, j}), kLanes);
      Value z = kk.fsub(kk.fadd(s, kk.fdiv(sDot, s2)),
                        kk.fdiv(kk.fmul(kk.constLike(kk.vf32(), 0.5), n), s2));
      Value masked =
          kk.cmpf(arith::CmpFPredicate::OEQ, s, kk.negInfLike(kk.vf32()));
      Value g = softmaxFromLogSumExp(kk, z, kk.vload(lseRow, {bi, i0}));
      g = kk.select(masked, zeros, g);
      Value d = kk.vload(delta, {bi, i0});
      return {g, kk.fmul(g, kk.fsub(gDot, d))};
    };
    byKey.accumulators.push_back({dpValues, de, width, widthPad, false});
    byKey.accumulators.push_back({uValues, dzU, model, modelPad, true});
    byKey.accumulators.push_back({ones, dzSum, c1, k.idx(kLanes), true});
    emitFlashGrad(k, opts, byKey);
    // d_e is 0 at a non-finite e entry.
    zeroWhereENonFinite(de, de);

    // 4. dm (c/σ² folded in), d_v and d_wo.
    Value dm = k.alloc(rank3, {batch, keys, model});
    Value dv = kernel.out(2);
    Value cOverS2 = k.splat(k.fdiv(scale, k.cF32(sigma2)), kLanes);
    Value meanWork = k.mul(k.mul(k.mul(batch, keys), model), headDim);
    workersIfLarge(k, opts, k.mul(batch, keys), meanWork,
                   [&](Value item, Value) {
      Value bi = k.divu(item, keys), j = k.remu(item, keys);
      Value h = headOf(k, bi);
      Value r = k.splat(k.load(dzSum, {bi, j, c0}), kLanes);
      widthLoop(model, [&](Value col, Value count) {
        Value a = k.vloadMasked(dzU, {bi, j, col}, count, 0.0);
        Value mj = k.vloadMasked(mValues, {bi, j, col}, count, 0.0);
        k.vstoreMasked(k.fmul(k.fsub(a, k.fmul(r, mj)), cOverS2), dm,
                       {bi, j, col}, count);
      });
      k.forLoop(c0, heads, c1, [&](Value hh) {
        Value chosen = k.cmpi(arith::CmpIPredicate::eq, hh, h);
        Value col0 = k.mul(hh, headDim);
        chunkGroups(headDim, [&](ArrayRef<Value> cols, ArrayRef<Value> counts) {
          // d_v[b,h,j,c] = Σ_d dm[b,j,d] wo[d, h·Dh + c] (0 off h*)
          SmallVector<Value> init(kChains, zeros);
          SmallVector<Value> acc = k.forLoop(
              c0, k.select(chosen, model, c0), c1, init,
              [&](Value d, ValueRange a) -> SmallVector<Value> {
                Value m = k.splat(k.load(dm, {bi, j, d}), kLanes);
                SmallVector<Value> next;
                for (int64_t q = 0; q < kChains; ++q) {
                  Value at = k.add(col0, cols[q]);
                  Value w = k.vloadMasked(wo, {d, at}, counts[q], 0.0);
                  next.push_back(k.fma(m, w, a[q]));
                }
                return next;
              });
          for (int64_t q = 0; q < kChains; ++q)
            k.vstoreMasked(acc[q], dv, {bi, hh, j, cols[q]}, counts[q]);
        });
      });
    });
    Value cols = k.mul(heads, headDim);
    Value dwo = kernel.out(3);
    workersIfLarge(k, opts, model, meanWork, [&](Value d, Value) {
      widthLoop(cols, [&](Value col, Value count) {
        k.vstoreMasked(zeros, dwo, {d, col}, count);
      });
      k.forLoop(c0, batch, c1, [&](Value bi) {
        Value h = headOf(k, bi);
        Value col0 = k.mul(h, headDim);
        chunkGroups(headDim, [&](ArrayRef<Value> cols, ArrayRef<Value> counts) {
          SmallVector<Value> at, init;
          for (int64_t q = 0; q < kChains; ++q) {
            at.push_back(k.add(col0, cols[q]));
            init.push_back(k.vloadMasked(dwo, {d, at[q]}, counts[q], 0.0));
          }
          SmallVector<Value> acc = k.forLoop(
              c0, keys, c1, init,
              [&](Value j, ValueRange a) -> SmallVector<Value> {
                Value m = k.splat(k.load(dm, {bi, j, d}), kLanes);
                SmallVector<Value> next;
                for (int64_t q = 0; q < kChains; ++q) {
                  Value x =
                      k.vloadMasked(v, {bi, h, j, cols[q]}, counts[q], 0.0);
                  next.push_back(k.fma(m, x, a[q]));
                }
                return next;
              });
          for (int64_t q = 0; q < kChains; ++q)
            k.vstoreMasked(acc[q], dwo, {d, at[q]}, counts[q]);
        });
      });
    });

    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateAttentionPosteriorGradKernel, AttentionPosteriorGradKernel)

} // namespace mlir::moe::cpu
