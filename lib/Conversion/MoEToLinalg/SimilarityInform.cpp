//===- SimilarityInform.cpp - moe.similarity_inform -> linalg + scf -------===//
//
// Part of the MoE-MLIR project.
//
// p[b,i,:] = Σ_j softmax_j(u_i^T W_s u_j / tau) e[b,j,:] without the N x N
// similarity matrix: the queries q = u W_s come from one contraction, then an
// scf.for streams the keys j with an online softmax (running max, running sum
// and a K-wide accumulator per query row, see streamKeys in Utils.h). Causal
// and key-mask exclusions turn the key's logit into -inf before the update.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

/// A contraction over D. (Not a linalg.matmul on the [B·N, D] view:
/// expand-strided-metadata of LLVM 22 crashes on a subview of a
/// memref.expand_shape whose group has two dynamic sizes, which is what the
/// [B·N, D] -> [B, N, D] view becomes for dynamic B and N.)
Value mlir::moe::linalg_lowering::projectQueries(OpBuilder &b, Location loc,
                                                 Value u, Value ws) {
  MLIRContext *ctx = b.getContext();
  SmallVector<OpFoldResult> sizes = sizesOf(b, loc, u);
  Value init = filled(b, loc, sizes, f32Const(b, loc, 0.0));
  return generic(b, loc, ValueRange{u, ws}, init,
                 {dimsMap(ctx, 4, {0, 1, 3}), dimsMap(ctx, 4, {3, 2}),
                  dimsMap(ctx, 4, {0, 1, 2})},
                 {kPar, kPar, kPar, kRed}, mulAddBody)
      .front();
}

Value mlir::moe::linalg_lowering::similarityKeyLogits(OpBuilder &b, Location l,
                                                      Value q, Value u,
                                                      Value mask, bool causal,
                                                      float tau, Value j,
                                                      Value scratch) {
  MLIRContext *ctx = b.getContext();
  // s[b,i] = <q_i, u_j>, reduced over D in f32.
  Value key = sliceAlong(b, l, u, 1, j);
  Value dot = rowDotKey(b, l, q, key, scratch);
  // Scale by 1/tau and mask, in place.
  SmallVector<Value> ins;
  SmallVector<AffineMap> maps;
  if (mask) {
    ins.push_back(sliceAlong(b, l, mask, 1, j));
    maps.push_back(dimsMap(ctx, 2, {0}));
  }
  maps.push_back(dimsMap(ctx, 2, {0, 1}));
  return generic(b, l, ins, dot, maps, {kPar, kPar},
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   Value x = arith::DivFOp::create(gb, gl, a.back(),
                                                   f32Const(gb, gl, tau));
                   Value valid =
                       arith::ConstantOp::create(gb, gl, gb.getBoolAttr(true));
                   if (causal)
                     valid = arith::CmpIOp::create(gb, gl,
                                                   arith::CmpIPredicate::ule, j,
                                                   loopIndex(gb, gl, 1));
                   if (mask)
                     valid = arith::AndIOp::create(gb, gl, valid, a[0]);
                   return SmallVector<Value>{arith::SelectOp::create(
                       gb, gl, valid, x, negInf(gb, gl))};
                 })
      .front();
}

OnlineSoftmaxState mlir::moe::linalg_lowering::streamSimilarity(
    OpBuilder &b, Location loc, Value q, Value u, Value e, Value mask,
    bool causal, float tau) {
  OpFoldResult batch = tensor::getMixedSize(b, loc, u, 0);
  OpFoldResult tokens = tensor::getMixedSize(b, loc, u, 1);
  OpFoldResult width = tensor::getMixedSize(b, loc, e, 2);
  Value numKeys = tensor::DimOp::create(b, loc, u, 1);
  auto logitsOfKey = [&](OpBuilder &kb, Location kl, Value j, Value scratch) {
    return similarityKeyLogits(kb, kl, q, u, mask, causal, tau, j, scratch);
  };
  auto valuesOfKey = [&](OpBuilder &kb, Location kl, Value j) {
    return sliceAlong(kb, kl, e, 1, j);
  };
  return streamKeys(b, loc, batch, tokens, width, numKeys, logitsOfKey,
                    valuesOfKey);
}

/// The streaming softmax of a similarity_inform op or its training form, on
/// its f32-promoted operands (q = u · ws with ws).
template <typename OpTy>
static OnlineSoftmaxState streamOperands(OpTy op, PatternRewriter &rw) {
  Location loc = op.getLoc();
  Value u = promoteToF32(rw, loc, op.getU());
  Value e = promoteToF32(rw, loc, op.getE());
  Value q = u;
  if (Value ws = op.getWs())
    q = projectQueries(rw, loc, u, promoteToF32(rw, loc, ws));
  return streamSimilarity(rw, loc, q, u, e, op.getKeyMask(), op.getCausal(),
                          op.getTau().convertToFloat());
}

LogicalResult linalg_lowering::lowerSimilarityInform(SimilarityInformOp op,
                                                     PatternRewriter &rw) {
  replaceWithCasts(rw, op,
                   normalizeRows(rw, op.getLoc(), streamOperands(op, rw)));
  return success();
}

/// select(lse == -inf, none, lse), elementwise on [B, N].
static Value selectNone(OpBuilder &b, Location loc, Value lse, Value none) {
  return arith::SelectOp::create(
      b, loc,
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, lse,
                            negInf(b, loc)),
      none, lse);
}

Value mlir::moe::linalg_lowering::rowLogSumExp(OpBuilder &b, Location loc,
                                               const OnlineSoftmaxState &s,
                                               double none) {
  MLIRContext *ctx = b.getContext();
  AffineMap bi = dimsMap(ctx, 2, {0, 1});
  Value init = tensor::EmptyOp::create(
      b, loc, tensor::getMixedSizes(b, loc, s.m), b.getF32Type());
  return kernelGeneric(
             b, loc, ValueRange{s.m, s.l}, init, {bi, bi, bi}, {kPar, kPar},
             [&](kernels::KernelBuilder &kb, ValueRange a) {
               Value lse = kernels::softmaxLogSumExp(kb, {a[0], a[1]});
               // m = -inf: no key (l = 0), whatever log(0) gives.
               Value noKey = kb.cmpf(arith::CmpFPredicate::OEQ, a[0],
                                     kb.negInfLike(kb.f32()));
               return SmallVector<Value>{kb.select(noKey, kb.cF32(none), lse)};
             })
      .front();
}

Value mlir::moe::linalg_lowering::replaceNegInf(OpBuilder &b, Location loc,
                                                Value lse, double none) {
  MLIRContext *ctx = b.getContext();
  AffineMap bi = dimsMap(ctx, 2, {0, 1});
  Value init = tensor::EmptyOp::create(
      b, loc, tensor::getMixedSizes(b, loc, lse), b.getF32Type());
  return generic(b, loc, ValueRange{lse}, init, {bi, bi}, {kPar, kPar},
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   return SmallVector<Value>{
                       selectNone(gb, gl, a[0], f32Const(gb, gl, none))};
                 })
      .front();
}

LogicalResult
linalg_lowering::lowerSimilarityInformFwd(SimilarityInformFwdOp op,
                                          PatternRewriter &rw) {
  Location loc = op.getLoc();
  OnlineSoftmaxState state = streamOperands(op, rw);
  Value lse = rowLogSumExp(rw, loc, state,
                           -std::numeric_limits<double>::infinity());
  replaceWithCasts(rw, op, {normalizeRows(rw, loc, state), lse});
  return success();
}
