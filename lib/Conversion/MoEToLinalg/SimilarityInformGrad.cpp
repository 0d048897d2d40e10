//===- SimilarityInformGrad.cpp - moe.similarity_inform_grad -> linalg ----===//
//
// Part of the MoE-MLIR project.
//
// The portable backward of Similarity-Inform mixing (maths in MoEGradOps.td),
// streaming like the forward lowering, never N x N:
//  1. p and lse saved by the forward (saved(p, lse)), else recomputed by its
//     key loop (streamKeys: lse = m + log(l)); lse' = lse, +inf for a row
//     without keys (then exp(x - lse') = 0); delta[b,i] = <dp_i, p_i>;
//  2. a second scf.for over the keys j: the logits of key j against every row
//     (similarityKeyLogits, shared with the forward), S = exp(x - lse'),
//     dX = S (<dp_i, e_j> - delta_i) / tau, then dq += dX ⊗ u_j and the rows
//     de[:, j] = Σ_i S dp_i and dk[:, j] = Σ_i dX q_i;
//  3. du = dk + dq · ws^T (dk + dq without ws), dws = Σ_{b,i} u_i^T dq_i.
// Every sum runs in a fixed order (deterministic).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

LogicalResult
linalg_lowering::lowerSimilarityInformGrad(SimilarityInformGradOp op,
                                           PatternRewriter &rw) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  Value u = promoteToF32(rw, loc, op.getU());
  Value e = promoteToF32(rw, loc, op.getE());
  Value dp = op.getDp();
  Value ws = op.getWs() ? promoteToF32(rw, loc, op.getWs()) : Value();
  Value q = ws ? projectQueries(rw, loc, u, ws) : u;
  Value mask = op.getKeyMask();
  bool causal = op.getCausal();
  float tau = op.getTau().convertToFloat();
  OpFoldResult batch = tensor::getMixedSize(rw, loc, u, 0);
  OpFoldResult tokens = tensor::getMixedSize(rw, loc, u, 1);
  OpFoldResult depth = tensor::getMixedSize(rw, loc, u, 2);
  OpFoldResult width = tensor::getMixedSize(rw, loc, e, 2);
  Value numKeys = tensor::DimOp::create(rw, loc, u, 1);
  Value zero = f32Const(rw, loc, 0.0);
  Type f32 = rw.getF32Type();

  // 1. p, lse' (+inf for a row without keys, so that exp(x - lse') = 0) and
  // delta: saved by the forward, else recomputed by its key loop.
  constexpr double posInf = std::numeric_limits<double>::infinity();
  Value p, lse;
  if (op.getP()) {
    p = op.getP();
    lse = replaceNegInf(rw, loc, op.getLse(), posInf);
  } else {
    OnlineSoftmaxState state =
        streamSimilarity(rw, loc, q, u, e, mask, causal, tau);
    p = normalizeRows(rw, loc, state);
    lse = rowLogSumExp(rw, loc, state, posInf);
  }
  AffineMap bi = dimsMap(ctx, 2, {0, 1});
  Value delta =
      generic(rw, loc, ValueRange{dp, p},
              filled(rw, loc, {batch, tokens}, zero),
              {dimsMap(ctx, 3, {0, 1, 2}), dimsMap(ctx, 3, {0, 1, 2}),
               dimsMap(ctx, 3, {0, 1})},
              {kPar, kPar, kRed}, mulAddBody)
          .front();

  // 2. The key loop.
  Value dq0 = loopFilled(rw, loc, {batch, tokens, depth}, zero);
  Value dk0 = loopFilled(rw, loc, {batch, tokens, depth}, zero);
  Value de0 = loopFilled(rw, loc, {batch, tokens, width}, zero);
  SmallVector<Value> scratch;
  for (int n = 0; n < 4; ++n)
    scratch.push_back(loopScratch(rw, loc, {batch, tokens}, f32));
  AffineMap b3i = dimsMap(ctx, 3, {0, 2}), b3ik = dimsMap(ctx, 3, {0, 2, 1}),
            b3k = dimsMap(ctx, 3, {0, 1});
  auto loop = scf::ForOp::create(
      rw, loc, indexConst(rw, loc, 0), numKeys, indexConst(rw, loc, 1),
      ValueRange{dq0, de0, dk0, scratch[0], scratch[1], scratch[2],
                 scratch[3]},
      [&](OpBuilder &lb, Location ll, Value j, ValueRange it) {
        Value x =
            similarityKeyLogits(lb, ll, q, u, mask, causal, tau, j, it[3]);
        Value g = rowDotKey(lb, ll, dp, sliceAlong(lb, ll, e, 1, j), it[4]);
        SmallVector<Value> sdx = kernelGeneric(
            lb, ll, ValueRange{x, lse, delta, g}, ValueRange{it[5], it[6]},
            {bi, bi, bi, bi, bi, bi}, {kPar, kPar},
            [&](kernels::KernelBuilder &kb, ValueRange a) {
              kernels::SoftmaxGrad sg = kernels::softmaxGradFromLogSumExp(
                  kb, a[0], a[1], a[3], [&] { return a[2]; });
              return SmallVector<Value>{sg.prob,
                                        kb.fdiv(sg.dlogit, kb.cF32(tau))};
            });
        // dq[b,i,:] += dX[b,i] u[b,j,:]
        Value dq = generic(lb, ll, ValueRange{sdx[1], sliceAlong(lb, ll, u, 1, j)},
                           it[0],
                           {dimsMap(ctx, 3, {0, 1}), dimsMap(ctx, 3, {0, 2}),
                            dimsMap(ctx, 3, {0, 1, 2})},
                           {kPar, kPar, kPar}, mulAddBody)
                       .front();
        // de[b,j,:] = Σ_i S[b,i] dp[b,i,:]; dk[b,j,:] = Σ_i dX[b,i] q[b,i,:]
        auto keyRow = [&](Value w, Value rows, OpFoldResult n) {
          return generic(lb, ll, ValueRange{w, rows},
                         filled(lb, ll, {batch, n}, zero), {b3i, b3ik, b3k},
                         {kPar, kPar, kRed}, mulAddBody)
              .front();
        };
        Value de = insertAlong(lb, ll, keyRow(sdx[0], dp, width), it[1], 1, j);
        Value dk = insertAlong(lb, ll, keyRow(sdx[1], q, depth), it[2], 1, j);
        scf::YieldOp::create(lb, ll,
                             ValueRange{dq, de, dk, x, g, sdx[0], sdx[1]});
      });
  Value dq = loop.getResult(0), de = loop.getResult(1),
        dk = loop.getResult(2);

  // 3. du and dws.
  Value du;
  if (ws) {
    // du[b,i,c] = dk[b,i,c] + Σ_d dq[b,i,d] ws[c,d]
    du = generic(rw, loc, ValueRange{dq, ws}, dk,
                 {dimsMap(ctx, 4, {0, 1, 3}), dimsMap(ctx, 4, {2, 3}),
                  dimsMap(ctx, 4, {0, 1, 2})},
                 {kPar, kPar, kPar, kRed}, mulAddBody)
             .front();
  } else {
    AffineMap all = dimsMap(ctx, 3, {0, 1, 2});
    du = generic(rw, loc, ValueRange{dq}, dk, {all, all}, {kPar, kPar, kPar},
                 [](OpBuilder &gb, Location gl, ValueRange a) {
                   return SmallVector<Value>{
                       arith::AddFOp::create(gb, gl, a[1], a[0])};
                 })
             .front();
  }
  SmallVector<Value> results{du, de};
  if (ws) {
    // dws[d,c] = Σ_{b,i} u[b,i,d] dq[b,i,c]
    results.push_back(
        generic(rw, loc, ValueRange{u, dq}, filled(rw, loc, {depth, depth}, zero),
                {dimsMap(ctx, 4, {2, 3, 0}), dimsMap(ctx, 4, {2, 3, 1}),
                 dimsMap(ctx, 4, {0, 1})},
                {kPar, kPar, kRed, kRed}, mulAddBody)
            .front());
  }
  replaceWithCasts(rw, op, results);
  return success();
}
