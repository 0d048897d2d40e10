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
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {

} // namespace

template <>
LogicalResult
CPUKernel<SimilarityInformGradOp>::emit(SimilarityInformGradOp op,
                                        CpuKernelBuilder &kb,
                                        PatternRewriter &rw) const {
  // du [B, N, D], de [B, N, K] and dws [D, D].
  SmallVector<Value> uSizes = kb.sizes(op.getU());
  SmallVector<SmallVector<Value>> outSizes = {
      uSizes, {uSizes[0], uSizes[1], kb.sizes(op.getE())[2]}};
  if (op.getWs())
    outSizes.push_back({uSizes[2], uSizes[2]});
  KernelScope kernel(kb,
                     {op.getU(), op.getE(), op.getDp(), op.getKeyMask(),
                      op.getWs(), op.getP(), op.getLse()},
                     KernelScope::outsOf(op, outSizes));
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value u = kb.buffer(op.getU()), e = kb.buffer(op.getE());
  Value dp = kb.buffer(op.getDp());
  Value mask = op.getKeyMask() ? kb.buffer(op.getKeyMask()) : Value();
  Value ws = op.getWs() ? kb.buffer(op.getWs()) : Value();
  Value batch = kb.dim(u, 0), rows = kb.dim(u, 1), depth = kb.dim(u, 2);
  Value width = kb.dim(e, 2);
  Value keysPad = roundUp(kb, rows, kKeyTile);
  Value depthPad = roundUp(kb, depth, kLanes);
  bool causal = op.getCausal();
  // The pairs a pass visits: causal keeps j <= i, which is the band below
  // the diagonal seen from the queries and above it from the keys.
  auto band = [&](FlashGradSpec::Band causalBand) {
    return causal ? causalBand : FlashGradSpec::Band::All;
  };
  float tau = op.getTau().convertToFloat();
  auto rank3 = MemRefType::get({kDyn, kDyn, kDyn}, f32);

  Value keyValid = keyValidity(kb, mask, batch, rows, keysPad);
  FlashLogitSpec logitSpec =
      similarityInformLogit(tau, causal, static_cast<bool>(mask));
  auto logits = scaledMaskedLogits(keyValid, logitSpec);
  Value q = ws ? projectRows(kb, opts, u, ws, batch, rows, depth, depth) : u;

  // 1. p and lse: saved by the forward (similarity_inform_fwd), else
  // recomputed by the forward kernel.
  Value uT = packKeysT(kb, opts, u, batch, rows, depth);
  Value p, lse;
  if (op.getP()) {
    p = kb.buffer(op.getP());
    lse = kb.buffer(op.getLse());
  } else {
    p = kb.alloc(rank3, {batch, rows, width});
    lse = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rows});
    FlashSpec fwd = flashSpec(kb, q, uT, keysPad, e, p, batch, rows, rows,
                              depth, logits, causal);
    fwd.lse = lse;
    emitFlashMix(kb, opts, fwd);
  }
  Value widthPad = roundUp(kb, width, kLanes);

  // lse' and delta, padded to keysPad (vector loads in the key-major pass).
  auto [lseRow, delta] =
      gradRowStats(kb, lse, p, dp, batch, rows, width, widthPad, keysPad);

  Value invTau = kb.constLike(kb.vf32(), 1.0 / tau);
  Value zeros = kb.constLike(kb.vf32(), 0.0);

  Value eT = packKeysT(kb, opts, e, batch, rows, width);
  auto [uValues, uNonFinite] =
      packValues(kb, u, batch, rows, depth, keysPad, depthPad);
  (void)uNonFinite;
  Value dpT = packKeysT(kb, opts, dp, batch, rows, width);
  auto [dpValues, dpNonFinite] =
      packValues(kb, dp, batch, rows, width, keysPad, widthPad);
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
    emitFlashGrad(kb, opts, pass);
    kernel.replace(rw, op);
    return success();
  }

  // 2. Query-major: dq.
  Value dq = kb.alloc(rank3, {batch, rows, depth});
  FlashGradSpec byQuery({q, uT, depth}, {dp, eT, width}, batch, rows, rows,
                        band(FlashGradSpec::Band::Lower));
  byQuery.weights = [&](CpuKernelBuilder &kk, Value sDot, Value gDot, Value,
                        Value bi, Value i,
                        Value j0) -> std::pair<Value, Value> {
    SoftmaxGrad sg =
        queryRowGrad(kk, logits, lseRow, delta, sDot, gDot, bi, i, j0);
    return {sg.prob, kk.fmul(sg.dlogit, invTau)};
  };
  byQuery.accumulators.push_back({uValues, dq, depth, depthPad, true});
  emitFlashGrad(kb, opts, byQuery);

  // 3. Key-major: de and dk.
  Value qT = ws ? packKeysT(kb, opts, q, batch, rows, depth) : uT;
  Value qValues = uValues;
  if (ws)
    qValues = packValues(kb, q, batch, rows, depth, keysPad, depthPad).first;
  Value de = kernel.out(1);
  // dk is du itself without ws.
  Value dk = ws ? kb.alloc(rank3, {batch, rows, depth}) : kernel.out(0);
  FlashGradSpec byKey({u, qT, depth}, {e, dpT, width}, batch, rows, rows,
                      band(FlashGradSpec::Band::Upper));
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
  emitFlashGrad(kb, opts, byKey);

  // 4. du and dws.
  Value du;
  if (ws) {
    // du = dk + dq · ws^T.
    Value wsT = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {depth, depth});
    kb.forLoop(c0, depth, c1, [&](Value r) {
      kb.forLoop(c0, depth, c1, [&](Value c) {
        kb.store(kb.loadF(ws, {c, r}), wsT, {r, c});
      });
    });
    du = projectRows(kb, opts, dq, wsT, batch, rows, depth, depth, dk,
                     kernel.out(0));
  } else {
    du = dk;
    forEachRowChunk(kb, opts, batch, rows, depth,
                    [&](Value bi, Value i, Value col, Value count) {
                      Value x = kb.vloadMasked(dk, {bi, i, col}, count, 0.0);
                      Value y = kb.vloadMasked(dq, {bi, i, col}, count, 0.0);
                      kb.vstoreMasked(kb.fadd(x, y), du, {bi, i, col}, count);
                    });
  }
  if (ws) {
    // dws[d, :] = Σ_{b,i} u[b,i,d] dq[b,i,:]: one worker per row d, a fixed
    // order over (b, i).
    Value dws = kernel.out(2);
    Value chunks = kb.divu(depthPad, kb.idx(kLanes));
    kb.workers(opts, depth, [&](Value d, Value) {
      kb.forLoop(c0, chunks, c1, [&](Value c) {
        Value col = kb.mul(c, kb.idx(kLanes));
        Value count = kb.sub(depth, col);
        Value acc = kb.forLoop(
            c0, batch, c1, ValueRange{zeros},
            [&](Value bi, ValueRange a) -> SmallVector<Value> {
              return kb.forLoop(
                  c0, rows, c1, a,
                  [&](Value i, ValueRange a2) -> SmallVector<Value> {
                    Value x = kb.splat(kb.loadF(u, {bi, i, d}), kLanes);
                    Value g = kb.vloadMasked(dq, {bi, i, col}, count, 0.0);
                    return {kb.fma(x, g, a2[0])};
                  });
            })[0];
        kb.vstoreMasked(acc, dws, {d, col}, count);
      });
    });
  }

  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
