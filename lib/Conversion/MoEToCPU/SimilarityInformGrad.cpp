//===- SimilarityInformGrad.cpp - moe.similarity_inform_grad -> CPU kernel ===//
//
// Part of the MoE-MLIR project.
//
// The flash-style backward of Similarity-Inform mixing (the maths is in the
// op description, MoEGradOps.td), in streaming passes none of which stores
// anything N x N. Symmetric scores (no ws, not causal) take pass 1 and one
// pass 2' that does 2-4 at once (below); otherwise:
//  1. p and the row log-sum-exp lse saved by the forward (saved(p, lse)),
//     else recomputed by the forward kernel (emitFlashMix, O(B·N)); then per
//     row lse' = lse (+inf for a row without keys, and for padding, so that
//     exp(x - lse') = 0) and delta_i = <dp_i, p_i>;
//  2. query-major (emitFlashGrad, rows i, columns j): S = exp(x - lse'_i),
//     dX = S (<dp_i, e_j> - delta_i) / tau, dq_i = Σ_j dX_ij u_j;
//  3. key-major (rows j, columns i; the same tiles with the roles swapped):
//     de_j = Σ_i S_ij dp_i and dk_j = Σ_i dX_ij q_i;
//  4. du = dk + dq·ws^T (dk + dq without ws), dws = Σ_{b,i} u_i^T dq_i.
// Extra memory: packed copies of u, q, e, dp (keys transposed, values
// padded), O(B·N·(D+K)) floats, and per-worker tiles.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {

struct SimilarityInformGradKernel
    : KernelPattern<SimilarityInformGradOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(SimilarityInformGradOp op, CpuKernelBuilder &k,
                     PatternRewriter &rw) const override {
    if (hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    // du [B, N, D], de [B, N, K] and dws [D, D].
    SmallVector<Value> uSizes = k.sizes(op.getU());
    SmallVector<SmallVector<Value>> outSizes = {
        uSizes, {uSizes[0], uSizes[1], k.sizes(op.getE())[2]}};
    if (op.getWs())
      outSizes.push_back({uSizes[2], uSizes[2]});
    KernelScope kernel(k,
                       {op.getU(), op.getE(), op.getDp(), op.getKeyMask(),
                        op.getWs(), op.getP(), op.getLse()},
                       KernelScope::outsOf(op, outSizes));
    Type f32 = k.f32();
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value u = k.buffer(op.getU()), e = k.buffer(op.getE());
    Value dp = k.buffer(op.getDp());
    Value mask = op.getKeyMask() ? k.buffer(op.getKeyMask()) : Value();
    Value ws = op.getWs() ? k.buffer(op.getWs()) : Value();
    Value batch = k.dim(u, 0), rows = k.dim(u, 1), depth = k.dim(u, 2);
    Value width = k.dim(e, 2);
    Value keysPad = roundUp(k, rows, kKeyTile);
    Value depthPad = roundUp(k, depth, kLanes);
    bool causal = op.getCausal();
    float tau = op.getTau().convertToFloat();
    auto rank3 = MemRefType::get({kDyn, kDyn, kDyn}, f32);

    Value keyValid = keyValidity(k, mask, batch, rows, keysPad);
    FlashLogitSpec logitSpec =
        similarityInformLogit(tau, causal, static_cast<bool>(mask));
    auto logits = scaledMaskedLogits(keyValid, logitSpec);
    Value q = ws ? projectRows(k, opts, u, ws, batch, rows, depth, depth) : u;

    // 1. p and lse: saved by the forward (similarity_inform_fwd), else
    // recomputed by the forward kernel.
    Value uT = packKeysT(k, opts, u, batch, rows, depth);
    Value p, lse;
    if (op.getP()) {
      p = k.buffer(op.getP());
      lse = k.buffer(op.getLse());
    } else {
      p = k.alloc(rank3, {batch, rows, width});
      lse = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rows});
      FlashSpec fwd = flashSpec(k, q, uT, keysPad, e, p, batch, rows, rows,
                                depth, logits, causal);
      fwd.lse = lse;
      emitFlashMix(k, opts, fwd);
    }
    Value widthPad = roundUp(k, width, kLanes);

    // lse' and delta, padded to keysPad (vector loads in the key-major pass).
    auto [lseRow, delta] =
        gradRowStats(k, lse, p, dp, batch, rows, width, widthPad, keysPad);

    Value invTau = k.constLike(k.vf32(), 1.0 / tau);
    Value zeros = k.constLike(k.vf32(), 0.0);

    Value eT = packKeysT(k, opts, e, batch, rows, width);
    auto [uValues, uNonFinite] =
        packValues(k, u, batch, rows, depth, keysPad, depthPad);
    (void)uNonFinite;
    Value dpT = packKeysT(k, opts, dp, batch, rows, width);
    auto [dpValues, dpNonFinite] =
        packValues(k, dp, batch, rows, width, keysPad, widthPad);
    (void)dpNonFinite;

    // 2'. Symmetric scores (no ws, not causal): x_ij = x_ji, so one
    // query-major pass serves both roles of a pair. From the score dot x_ij
    // and the cotangent dots g_ij = <dp_i, e_j> and g_ji = <e_i, dp_j>:
    //   S_ij = exp(x_ij - lse'_i) (key j valid),
    //   S_ji = exp(x_ij - lse'_j) (key i valid),
    //   du_i = Σ_j (dX_ij + dX_ji) u_j,  de_i = Σ_j S_ji dp_j,
    // with dX_ij = S_ij (g_ij - delta_i) / tau. One score dot per pair
    // instead of two, and no dq/dk to add: D + 2K multiply-adds of dots and
    // D + K of accumulation per pair, against 2D + 2K and 2D + K.
    if (!ws && !causal) {
      FlashGradSpec pass({u, uT, depth}, {dp, eT, width}, batch, rows, rows);
      pass.cotangentT = FlashGradSpec::Dot{e, dpT, width};
      pass.weights = [&](CpuKernelBuilder &kk, Value sDot, Value gDot,
                         Value tDot, Value bi, Value i,
                         Value j0) -> std::pair<Value, Value> {
        Value sIJ = softmaxFromLogSumExp(kk, logits(kk, sDot, bi, i, j0),
                                         kk.load(lseRow, {bi, i}));
        Value dIJ = kk.fmul(
            sIJ, kk.fsub(gDot, kk.splat(kk.load(delta, {bi, i}), kLanes)));
        // Row j's softmax over its keys, at key i (padding rows j have
        // lse' = +inf: 0).
        Value x = kk.fdiv(sDot, kk.constLike(kk.vf32(), tau));
        Value sJI = softmaxFromLogSumExp(kk, x, kk.vload(lseRow, {bi, j0}));
        Value iValid = kk.cmpf(arith::CmpFPredicate::ONE,
                               kk.load(keyValid, {bi, i}), kk.cF32(0.0));
        sJI = kk.select(iValid, sJI, zeros);
        Value dJI = kk.fmul(sJI, kk.fsub(tDot, kk.vload(delta, {bi, j0})));
        return {sJI, kk.fmul(kk.fadd(dIJ, dJI), invTau)};
      };
      pass.accumulators.push_back({dpValues, kernel.out(1), width, widthPad,
                                   false});
      pass.accumulators.push_back({uValues, kernel.out(0), depth, depthPad,
                                   true});
      emitFlashGrad(k, opts, pass);
      kernel.replace(rw, op);
      return success();
    }

    // 2. Query-major: dq.
    Value dq = k.alloc(rank3, {batch, rows, depth});
    FlashGradSpec byQuery({q, uT, depth}, {dp, eT, width}, batch, rows, rows,
                          causal ? FlashGradSpec::Band::Lower
                                 : FlashGradSpec::Band::All);
    byQuery.weights = [&](CpuKernelBuilder &kk, Value sDot, Value gDot, Value,
                          Value bi, Value i,
                          Value j0) -> std::pair<Value, Value> {
      SoftmaxGrad sg =
          queryRowGrad(kk, logits, lseRow, delta, sDot, gDot, bi, i, j0);
      return {sg.prob, kk.fmul(sg.dlogit, invTau)};
    };
    byQuery.accumulators.push_back({uValues, dq, depth, depthPad, true});
    emitFlashGrad(k, opts, byQuery);

    // 3. Key-major: de and dk.
    Value qT = ws ? packKeysT(k, opts, q, batch, rows, depth) : uT;
    Value qValues = uValues;
    if (ws)
      qValues = packValues(k, q, batch, rows, depth, keysPad, depthPad).first;
    Value de = kernel.out(1);
    // dk is du itself without ws.
    Value dk = ws ? k.alloc(rank3, {batch, rows, depth}) : kernel.out(0);
    FlashGradSpec byKey({u, qT, depth}, {e, dpT, width}, batch, rows, rows,
                        causal ? FlashGradSpec::Band::Upper
                               : FlashGradSpec::Band::All);
    byKey.weights = [&](CpuKernelBuilder &kk, Value sDot, Value gDot, Value,
                        Value bi, Value j,
                        Value i0) -> std::pair<Value, Value> {
      // Row j is a key: masked keys and (causal) queries i < j get nothing;
      // padding queries have lse' = +inf, so S = 0.
      // The forward's logit (MoE/Kernels/FlashLogit.h) with the roles of
      // row and lanes swapped.
      Value x = flashScaledLogit(kk, logitSpec, sDot);
      Value valid = flashKeyKept(
          kk, logitSpec, /*inRange=*/Value(),
          [&] {
            return kk.cmpf(arith::CmpFPredicate::ONE,
                           kk.splat(kk.load(keyValid, {bi, j}), kLanes), zeros);
          },
          [&] {
            Value is = kk.iota(kk.castInt(i0, kk.i32()), kLanes);
            return kk.cmpi(arith::CmpIPredicate::sge, is,
                           kk.splat(kk.castInt(j, kk.i32()), kLanes));
          });
      Value s = softmaxFromLogSumExp(kk, x, kk.vload(lseRow, {bi, i0}));
      s = kk.select(valid, s, zeros);
      Value d = kk.vload(delta, {bi, i0});
      return {s, kk.fmul(kk.fmul(s, kk.fsub(gDot, d)), invTau)};
    };
    byKey.accumulators.push_back({dpValues, de, width, widthPad, false});
    byKey.accumulators.push_back({qValues, dk, depth, depthPad, true});
    emitFlashGrad(k, opts, byKey);

    // 4. du and dws.
    Value du;
    if (ws) {
      // du = dk + dq · ws^T.
      Value wsT = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {depth, depth});
      k.forLoop(c0, depth, c1, [&](Value r) {
        k.forLoop(c0, depth, c1, [&](Value c) {
          k.store(k.loadF(ws, {c, r}), wsT, {r, c});
        });
      });
      du = projectRows(k, opts, dq, wsT, batch, rows, depth, depth, dk,
                       kernel.out(0));
    } else {
      du = dk;
      forEachRowChunk(k, opts, batch, rows, depth,
                      [&](Value bi, Value i, Value col, Value count) {
                        Value x = k.vloadMasked(dk, {bi, i, col}, count, 0.0);
                        Value y = k.vloadMasked(dq, {bi, i, col}, count, 0.0);
                        k.vstoreMasked(k.fadd(x, y), du, {bi, i, col}, count);
                      });
    }
    if (ws) {
      // dws[d, :] = Σ_{b,i} u[b,i,d] dq[b,i,:]: one worker per row d, a fixed
      // order over (b, i).
      Value dws = kernel.out(2);
      Value chunks = k.divu(depthPad, k.idx(kLanes));
      k.workers(opts, depth, [&](Value d, Value) {
        k.forLoop(c0, chunks, c1, [&](Value c) {
          Value col = k.mul(c, k.idx(kLanes));
          Value count = k.sub(depth, col);
          Value acc = k.forLoop(
              c0, batch, c1, ValueRange{zeros},
              [&](Value bi, ValueRange a) -> SmallVector<Value> {
                return k.forLoop(
                    c0, rows, c1, a,
                    [&](Value i, ValueRange a2) -> SmallVector<Value> {
                      Value x = k.splat(k.loadF(u, {bi, i, d}), kLanes);
                      Value g = k.vloadMasked(dq, {bi, i, col}, count, 0.0);
                      return {k.fma(x, g, a2[0])};
                    });
              })[0];
          k.vstoreMasked(acc, dws, {d, col}, count);
        });
      });
    }

    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateSimilarityInformGradKernel, SimilarityInformGradKernel)

} // namespace mlir::moe::cpu
