//===- AttentionPosterior.cpp - moe.attention_posterior -> linalg + scf ---===//
//
// Part of the MoE-MLIR project.
//
// Three phases, none of which stores an N x Nk tensor:
//  1. Prior statistics per attention row, read straight from `scores`:
//     max, Σ exp(s - max) and Σ exp(s - max)·s. For head_select = min_entropy
//     they give the row entropy lse - Σ_j A_ij s_ij, its mean over the rows
//     that have an unmasked key, and h* (argmin; ties to the lowest head, NaN
//     is the minimum).
//  2. Head means m[b,j,:] = head_scale · v[b,h,j,:] · wo[:, h·Dh:(h+1)·Dh]^T:
//     per batch element, a linalg.transpose and a linalg.matmul on slices at
//     the data-dependent head.
//  3. The posterior softmax_j(s_ij + <u_i, m_j>/σ² − ‖m_j‖²/(2σ²)) streamed
//     over the keys (online softmax, streamKeys in Utils.h).
// head_select = all repeats 2–3 for every head in an scf.for and mixes the
// per-head results with a second online softmax over the heads whose logits
// are z_h = logsumexp_j(log A_h + log N) = lse_j(posterior logits) − lse_j(s).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {

/// Per-row statistics of the prior attention softmax, each [B, H, N].
struct PriorStats {
  Value max, sumExp, sumExpScore;
};

class AttentionPosteriorEmitter {
public:
  /// The same emitter, building with `nb` (inside a loop body).
  AttentionPosteriorEmitter(OpBuilder &nb, Location nl,
                            const AttentionPosteriorEmitter &o)
      : b(nb), loc(nl), ctx(o.ctx), op(o.op), scores(o.scores), u(o.u),
        v(o.v), wo(o.wo), e(o.e), batch(o.batch), heads(o.heads),
        queries(o.queries), keys(o.keys), model(o.model),
        headDim(o.headDim), width(o.width), sigma2(o.sigma2) {}

  AttentionPosteriorEmitter(OpBuilder &b, Location loc, AttentionPosteriorOp op)
      : b(b), loc(loc), ctx(b.getContext()), op(op), scores(op.getScores()),
        v(op.getV()), wo(op.getWo()) {
    u = promoteToF32(b, loc, op.getU());
    e = promoteToF32(b, loc, op.getE());
    // Every size is read from the operand that has it static, if one does, so
    // that the slices and inits below agree on their static shapes.
    auto size = [&](std::initializer_list<std::pair<Value, int64_t>> dims) {
      for (auto [value, dim] : dims)
        if (!cast<RankedTensorType>(value.getType()).isDynamicDim(dim))
          return tensor::getMixedSize(b, loc, value, dim);
      return tensor::getMixedSize(b, loc, dims.begin()->first,
                                  dims.begin()->second);
    };
    batch = size({{scores, 0}, {u, 0}, {v, 0}, {e, 0}});
    heads = size({{scores, 1}, {v, 1}});
    queries = size({{scores, 2}, {u, 1}});
    keys = size({{scores, 3}, {v, 2}, {e, 1}});
    model = size({{u, 2}, {wo, 0}});
    headDim = size({{v, 3}});
    width = size({{e, 2}});
    float sigma = op.getSigma().convertToFloat();
    sigma2 = sigma * sigma;
  }

  /// Phase 1: row max, Σ exp(s − max), Σ exp(s − max)·s (masked terms 0).
  PriorStats priorStats() {
    SmallVector<OpFoldResult> shape = {batch, heads, queries};
    AffineMap all = dimsMap(ctx, 4, {0, 1, 2, 3}), row = dimsMap(ctx, 4, {0, 1, 2});
    Value max =
        generic(b, loc, scores, filled(b, loc, shape, negInf(b, loc)),
                {all, row}, {kPar, kPar, kPar, kRed},
                [](OpBuilder &gb, Location gl, ValueRange a) {
                  Value s = toF32(gb, gl, a[0]);
                  return SmallVector<Value>{
                      arith::MaximumFOp::create(gb, gl, a[1], s)};
                })
            .front();
    Value zero = f32Const(b, loc, 0.0);
    SmallVector<Value> sums = generic(
        b, loc, ValueRange{scores, max},
        ValueRange{filled(b, loc, shape, zero), filled(b, loc, shape, zero)},
        {all, row, row, row}, {kPar, kPar, kPar, kRed},
        [](OpBuilder &gb, Location gl, ValueRange a) {
          Value s = toF32(gb, gl, a[0]);
          Value t = math::ExpOp::create(gb, gl,
                                        arith::SubFOp::create(gb, gl, s, a[1]));
          Value masked = arith::CmpFOp::create(
              gb, gl, arith::CmpFPredicate::OEQ, s, negInf(gb, gl));
          // 0 · log 0 = 0: a masked key adds nothing (t·s would be 0·−inf).
          Value ts = arith::SelectOp::create(
              gb, gl, masked, f32Const(gb, gl, 0.0),
              arith::MulFOp::create(gb, gl, t, s));
          return SmallVector<Value>{arith::AddFOp::create(gb, gl, a[2], t),
                                    arith::AddFOp::create(gb, gl, a[3], ts)};
        });
    return {max, sums[0], sums[1]};
  }

  /// h*[b] = argmin_h of the mean entropy over the rows with an unmasked key.
  Value selectMinEntropyHead(const PriorStats &prior) {
    Value zero = f32Const(b, loc, 0.0);
    SmallVector<OpFoldResult> bh = {batch, heads};
    AffineMap row = dimsMap(ctx, 3, {0, 1, 2}), head = dimsMap(ctx, 3, {0, 1});
    SmallVector<Value> totals = generic(
        b, loc, ValueRange{prior.max, prior.sumExp, prior.sumExpScore},
        ValueRange{filled(b, loc, bh, zero), filled(b, loc, bh, zero)},
        {row, row, row, head, head}, {kPar, kPar, kRed},
        [](OpBuilder &gb, Location gl, ValueRange a) {
          Value max = a[0], se = a[1], sw = a[2];
          // NaN rows are kept (une) so that NaN reaches the argmin.
          Value valid = arith::CmpFOp::create(
              gb, gl, arith::CmpFPredicate::UNE, max, negInf(gb, gl));
          Value lse = arith::AddFOp::create(gb, gl, max,
                                            math::LogOp::create(gb, gl, se));
          Value entropy = arith::SubFOp::create(
              gb, gl, lse, arith::DivFOp::create(gb, gl, sw, se));
          Value z = f32Const(gb, gl, 0.0);
          return SmallVector<Value>{
              arith::AddFOp::create(
                  gb, gl, a[3], arith::SelectOp::create(gb, gl, valid, entropy, z)),
              arith::AddFOp::create(
                  gb, gl, a[4],
                  arith::SelectOp::create(gb, gl, valid, f32Const(gb, gl, 1.0),
                                          z))};
        });

    Type i32 = b.getI32Type();
    Value numHeads = indexTo(
        b, loc, getValueOrCreateConstantIndexOp(b, loc, heads), i32);
    AffineMap bh2 = dimsMap(ctx, 2, {0, 1}), b2 = dimsMap(ctx, 2, {0});
    SmallVector<Value> best = generic(
        b, loc, totals,
        ValueRange{filled(b, loc, {batch},
                          f32Const(b, loc, std::numeric_limits<double>::infinity())),
                   filled(b, loc, {batch}, numHeads)},
        {bh2, bh2, b2, b2}, {kPar, kRed},
        [&](OpBuilder &gb, Location gl, ValueRange a) {
          Value some = arith::CmpFOp::create(gb, gl, arith::CmpFPredicate::OGT,
                                             a[1], f32Const(gb, gl, 0.0));
          // A head with no valid row has mean 0.
          Value mean = arith::SelectOp::create(
              gb, gl, some, arith::DivFOp::create(gb, gl, a[0], a[1]),
              f32Const(gb, gl, 0.0));
          Value h = indexTo(gb, gl, loopIndex(gb, gl, 1), i32);
          Value take = ranksBefore(gb, gl, mean, h, a[2], a[3],
                                   /*descending=*/false);
          return SmallVector<Value>{
              arith::SelectOp::create(gb, gl, take, mean, a[2]),
              arith::SelectOp::create(gb, gl, take, h, a[3])};
        });
    return best[1];
  }

  /// Phase 2: head means m [B, Nk, D] and their squared norms [B, Nk] for the
  /// head `head[b]` of every batch element.
  std::pair<Value, Value> headMeans(Value head) {
    Type f32 = b.getF32Type();
    Value m0 = tensor::EmptyOp::create(b, loc, {batch, keys, model}, f32);
    Value c0 = indexConst(b, loc, 0), c1 = indexConst(b, loc, 1);
    Value numBatch = getValueOrCreateConstantIndexOp(b, loc, batch);
    auto loop = scf::ForOp::create(
        b, loc, c0, numBatch, c1, ValueRange{m0},
        [&](OpBuilder &lb, Location ll, Value bi, ValueRange it) {
          Value h = toIndex(lb, ll, tensor::ExtractOp::create(lb, ll, head, bi));
          OpFoldResult one = lb.getIndexAttr(1), zero = lb.getIndexAttr(0);
          // v[b, h] : [Nk, Dh]
          Type vElt = cast<RankedTensorType>(v.getType()).getElementType();
          Value vbh = tensor::ExtractSliceOp::create(
              lb, ll, tensorTypeOf({keys, headDim}, vElt), v,
              {bi, h, zero, zero}, {one, one, keys, headDim},
              {one, one, one, one});
          vbh = promoteToF32(lb, ll, vbh);
          // wo[:, h·Dh : (h+1)·Dh] : [D, Dh], transposed to [Dh, D].
          Value col = arith::MulIOp::create(
              lb, ll, h, getValueOrCreateConstantIndexOp(lb, ll, headDim));
          Type woElt = cast<RankedTensorType>(wo.getType()).getElementType();
          Value block = tensor::ExtractSliceOp::create(
              lb, ll, tensorTypeOf({model, headDim}, woElt), wo, {zero, col},
              {model, headDim}, {one, one});
          block = promoteToF32(lb, ll, block);
          Value blockT = linalg::TransposeOp::create(
                             lb, ll, block,
                             tensor::EmptyOp::create(lb, ll, {headDim, model}, f32),
                             ArrayRef<int64_t>{1, 0})
                             .getResult()
                             .front();
          Value init = filled(lb, ll, {keys, model}, f32Const(lb, ll, 0.0));
          Value mb = linalg::MatmulOp::create(lb, ll, TypeRange{init.getType()},
                                              ValueRange{vbh, blockT},
                                              ValueRange{init})
                         .getResult(0);
          Value next = insertAlong(lb, ll, mb, it[0], 0, bi);
          scf::YieldOp::create(lb, ll, next);
        });
    Value m = loop.getResult(0);

    Value scale = headScale();
    AffineMap bjd = dimsMap(ctx, 3, {0, 1, 2}), bj = dimsMap(ctx, 3, {0, 1});
    m = generic(b, loc, ValueRange{}, m, {bjd}, {kPar, kPar, kPar},
                [&](OpBuilder &gb, Location gl, ValueRange a) {
                  return SmallVector<Value>{
                      arith::MulFOp::create(gb, gl, scale, a[0])};
                })
            .front();
    Value norm2 =
        generic(b, loc, m, filled(b, loc, {batch, keys}, f32Const(b, loc, 0.0)),
                {bjd, bj}, {kPar, kPar, kRed},
                [](OpBuilder &gb, Location gl, ValueRange a) {
                  return SmallVector<Value>{arith::AddFOp::create(
                      gb, gl, a[1], arith::MulFOp::create(gb, gl, a[0], a[0]))};
                })
            .front();
    return {m, norm2};
  }

  /// Phase 3: the online-softmax state of the posterior of head `head[b]`.
  OnlineSoftmaxState posterior(Value head, Value m, Value norm2) {
    auto logitsOfKey = [&](OpBuilder &lb, Location ll, Value j, Value scratch) {
      Value mj = sliceAlong(lb, ll, m, 1, j);
      Value nj = sliceAlong(lb, ll, norm2, 1, j);
      Value dot = rowDotKey(lb, ll, u, mj, scratch);
      AffineMap bOnly = dimsMap(ctx, 2, {0}), bi = dimsMap(ctx, 2, {0, 1});
      return generic(
                 lb, ll, ValueRange{nj, head}, dot, {bOnly, bOnly, bi},
                 {kPar, kPar},
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   Value bIdx = loopIndex(gb, gl, 0), iIdx = loopIndex(gb, gl, 1);
                   Value h = toIndex(gb, gl, a[1]);
                   Value s = extractF32(gb, gl, scores, {bIdx, h, iIdx, j});
                   Value s2 = f32Const(gb, gl, sigma2);
                   // One op per statement: C++ leaves the order of argument
                   // evaluation unspecified (gcc and clang build IR in a
                   // different order otherwise).
                   Value shifted = arith::AddFOp::create(
                       gb, gl, s, arith::DivFOp::create(gb, gl, a[2], s2));
                   Value half = f32Const(gb, gl, 0.5);
                   Value penalty = arith::DivFOp::create(
                       gb, gl, arith::MulFOp::create(gb, gl, half, a[0]), s2);
                   Value logit =
                       arith::SubFOp::create(gb, gl, shifted, penalty);
                   Value masked = arith::CmpFOp::create(
                       gb, gl, arith::CmpFPredicate::OEQ, s, negInf(gb, gl));
                   return SmallVector<Value>{arith::SelectOp::create(
                       gb, gl, masked, negInf(gb, gl), logit)};
                 })
          .front();
    };
    auto valuesOfKey = [&](OpBuilder &lb, Location ll, Value j) {
      return sliceAlong(lb, ll, e, 1, j);
    };
    return streamKeys(b, loc, batch, queries, width,
                      getValueOrCreateConstantIndexOp(b, loc, keys), logitsOfKey,
                      valuesOfKey);
  }

  /// head_select = all: Σ_h H'[i,h] · (posterior of head h), H' by an online
  /// softmax over the heads.
  Value mixAllHeads(const PriorStats &prior) {
    Type f32 = b.getF32Type(), i32 = b.getI32Type();
    SmallVector<OpFoldResult> rowShape = {batch, queries};
    OnlineSoftmaxState seed =
        initOnlineSoftmax(b, loc, batch, queries, width);
    Value alpha0 = loopScratch(b, loc, rowShape, f32);
    Value w0 = loopScratch(b, loc, rowShape, f32);
    Value valid0 = loopScratch(b, loc, rowShape, b.getI1Type());
    Value numHeads = getValueOrCreateConstantIndexOp(b, loc, heads);
    auto loop = scf::ForOp::create(
        b, loc, indexConst(b, loc, 0), numHeads, indexConst(b, loc, 1),
        ValueRange{seed.m, seed.l, seed.acc, alpha0, w0, valid0},
        [&](OpBuilder &lb, Location ll, Value h, ValueRange it) {
          AttentionPosteriorEmitter inner(lb, ll, *this);
          Value head = filled(lb, ll, {batch}, indexTo(lb, ll, h, i32));
          auto [m, norm2] = inner.headMeans(head);
          OnlineSoftmaxState post = inner.posterior(head, m, norm2);
          Value priorMax = sliceAlong(lb, ll, prior.max, 1, h);
          Value priorSum = sliceAlong(lb, ll, prior.sumExp, 1, h);
          AffineMap bi = dimsMap(ctx, 2, {0, 1});
          SmallVector<Value> stats = kernelGeneric(
              lb, ll, ValueRange{post.m, post.l, priorMax, priorSum},
              ValueRange{it[0], it[1], it[3], it[4], it[5]},
              {bi, bi, bi, bi, bi, bi, bi, bi, bi}, {kPar, kPar},
              [](kernels::KernelBuilder &kb, ValueRange a) {
                Value lse = kernels::softmaxLogSumExp(kb, {a[0], a[1]});
                Value priorLse = kernels::softmaxLogSumExp(kb, {a[2], a[3]});
                Value negInf = kb.negInfLike(kb.f32());
                Value none = kb.cmpf(arith::CmpFPredicate::OEQ, a[0], negInf);
                // A head whose row is fully masked gets no weight.
                Value z = kb.select(none, negInf, kb.fsub(lse, priorLse));
                kernels::SoftmaxTile s =
                    kernels::onlineSoftmaxKey(kb, {a[4], a[5]}, z);
                Value valid = kb.cmpf(arith::CmpFPredicate::UNE, z, negInf);
                return SmallVector<Value>{s.next.max, s.next.sum, s.rescale,
                                          s.probs.front(), valid};
              });
          AffineMap bi3 = dimsMap(ctx, 3, {0, 1}),
                    bic3 = dimsMap(ctx, 3, {0, 1, 2});
          Value acc = generic(
                          lb, ll,
                          ValueRange{stats[2], stats[3], stats[4], post.l, post.acc},
                          it[2], {bi3, bi3, bi3, bi3, bic3, bic3},
                          {kPar, kPar, kPar},
                          [](OpBuilder &gb, Location gl, ValueRange a) {
                            Value ph = arith::DivFOp::create(gb, gl, a[4], a[3]);
                            Value kept =
                                arith::MulFOp::create(gb, gl, a[5], a[0]);
                            Value added = arith::MulFOp::create(gb, gl, a[1], ph);
                            Value upd =
                                arith::AddFOp::create(gb, gl, kept, added);
                            return SmallVector<Value>{
                                arith::SelectOp::create(gb, gl, a[2], upd, a[5])};
                          })
                          .front();
          scf::YieldOp::create(lb, ll,
                               ValueRange{stats[0], stats[1], acc, stats[2],
                                          stats[3], stats[4]});
        });
    return normalizeRows(
        b, loc, {loop.getResult(0), loop.getResult(1), loop.getResult(2)});
  }

private:
  static Value toF32(OpBuilder &gb, Location gl, Value x) {
    if (x.getType().isF32())
      return x;
    return arith::ExtFOp::create(gb, gl, gb.getF32Type(), x);
  }

  /// head_scale, or H (read from the shape when dynamic).
  Value headScale() {
    if (std::optional<double> scale = op.getEffectiveHeadScale())
      return f32Const(b, loc, *scale);
    Value h = arith::IndexCastOp::create(
        b, loc, b.getI64Type(), getValueOrCreateConstantIndexOp(b, loc, heads));
    return arith::SIToFPOp::create(b, loc, b.getF32Type(), h);
  }

  OpBuilder &b;
  Location loc;
  MLIRContext *ctx;
  AttentionPosteriorOp op;
  Value scores, u, v, wo, e;
  OpFoldResult batch, heads, queries, keys, model, headDim, width;
  float sigma2;
};

} // namespace

LogicalResult linalg_lowering::lowerAttentionPosterior(AttentionPosteriorOp op,
                                                       PatternRewriter &rw) {
  Location loc = op.getLoc();
  AttentionPosteriorEmitter emitter(rw, loc, op);
  PriorStats prior = emitter.priorStats();
  Value p, head;
  if (op.getHeadSelect() == HeadSelect::min_entropy) {
    head = emitter.selectMinEntropyHead(prior);
    auto [m, norm2] = emitter.headMeans(head);
    p = normalizeRows(rw, loc, emitter.posterior(head, m, norm2));
  } else {
    p = emitter.mixAllHeads(prior);
    OpFoldResult batch = tensor::getMixedSize(rw, loc, op.getScores(), 0);
    head = filled(rw, loc, {batch}, i32Const(rw, loc, -1));
  }
  replaceWithCasts(rw, op, {p, head});
  return success();
}
