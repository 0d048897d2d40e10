//===- MoEDegenerate.cpp - Zero-sized moe ops become their defined results ===//
//
// Part of the MoE-MLIR project.
//
// Zero-sized dimensions are valid (an empty batch, a sequence without keys)
// and every op defines its result for them (docs/MoEOps.md). The kernels are
// written for non-empty tiles, so instead of teaching every lowering about
// empty extents, these patterns rewrite a degenerate op into what it is
// defined to compute, in one place that every pipeline runs first
// (moe-legalize-shapes, the canonicalizer, convert-moe-to-linalg):
//
// * a result with no elements is a tensor.empty;
// * a mixing op without keys (Nk = 0) mixes nothing: p = 0 (every key is
//   masked), the min-entropy head is 0 (no row enters the mean) or -1 (`all`);
// * an empty feature dimension (D = 0, Dh = 0) gives zero dot products, which
//   a one-wide zero operand gives too: the op is rewritten onto it, exactly.
//
// Static sizes only: a size that is zero at run time reaches the kernels.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "Degenerate.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::moe;

namespace {
/// Dimension `dim` of the tensor `value`.
struct DimRef {
  Value value;
  int64_t dim;
};

bool isZero(DimRef ref) {
  return cast<RankedTensorType>(ref.value.getType()).getDimSize(ref.dim) == 0;
}

bool anyZero(std::initializer_list<DimRef> refs) {
  return llvm::any_of(refs, isZero);
}

/// Every leading (all but the last) dimension of `v`.
bool anyLeadingZero(Value v) {
  ArrayRef<int64_t> shape = cast<RankedTensorType>(v.getType()).getShape();
  return llvm::is_contained(shape.drop_back(), 0);
}

OpFoldResult sizeOf(OpBuilder &b, Location loc, DimRef ref) {
  return tensor::getMixedSize(b, loc, ref.value, ref.dim);
}

/// The sizes of `type`'s dynamic dimensions, taken from `sizes`.
SmallVector<Value> dynamicSizes(OpBuilder &b, Location loc,
                                RankedTensorType type,
                                ArrayRef<OpFoldResult> sizes) {
  SmallVector<Value> dynamic;
  for (auto [i, size] : llvm::enumerate(type.getShape()))
    if (ShapedType::isDynamic(size))
      dynamic.push_back(getValueOrCreateConstantIndexOp(b, loc, sizes[i]));
  return dynamic;
}

/// A tensor of type `type` (its sizes `sizes`) with no defined contents: the
/// value of a result that has no elements.
Value emptyOf(OpBuilder &b, Location loc, Type type,
              ArrayRef<OpFoldResult> sizes) {
  auto tensorType = cast<RankedTensorType>(type);
  return tensor::EmptyOp::create(b, loc, tensorType,
                                 dynamicSizes(b, loc, tensorType, sizes));
}

/// A tensor of type `type` (its sizes `sizes`) filled with `value`.
Value splatOf(OpBuilder &b, Location loc, Type type,
              ArrayRef<OpFoldResult> sizes, TypedAttr value) {
  auto tensorType = cast<RankedTensorType>(type);
  if (tensorType.hasStaticShape())
    return arith::ConstantOp::create(b, loc, tensorType,
                                     DenseElementsAttr::get(tensorType, value));
  Value scalar = arith::ConstantOp::create(b, loc, value);
  return tensor::SplatOp::create(b, loc, scalar, tensorType,
                                 dynamicSizes(b, loc, tensorType, sizes));
}

/// Zeros of element type `elementType` and sizes `sizes`.
Value zerosOf(OpBuilder &b, Location loc, Type elementType,
              ArrayRef<OpFoldResult> sizes) {
  SmallVector<int64_t> shape;
  for (OpFoldResult size : sizes)
    shape.push_back(getConstantIntValue(size).value_or(ShapedType::kDynamic));
  return splatOf(b, loc, RankedTensorType::get(shape, elementType), sizes,
                 b.getFloatAttr(elementType, 0.0));
}

Type elementTypeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getElementType();
}

/// A mixing op's fused form (with its top-k gate).
template <typename OpTy>
constexpr bool kFused = std::is_same_v<OpTy, SimilarityInformTopkOp> ||
                        std::is_same_v<OpTy, AttentionPosteriorTopkOp>;

/// The sizes of the first result of a mixing op, [B, N, K] of p (K: dimension
/// 2 of `e`), or of its fused form, [B, N, k] of the gate.
template <typename OpTy>
SmallVector<OpFoldResult> mixSizes(OpBuilder &b, OpTy op, OpFoldResult batch,
                                   OpFoldResult rows) {
  SmallVector<OpFoldResult> sizes = {batch, rows};
  if constexpr (kFused<OpTy>)
    sizes.push_back(b.getIndexAttr(op.getK()));
  else
    sizes.push_back(sizeOf(b, op.getLoc(), {op.getE(), 2}));
  return sizes;
}

//===----------------------------------------------------------------------===//
// topk_renorm: no rows
//===----------------------------------------------------------------------===//

struct EmptyTopk : OpRewritePattern<TopkRenormOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TopkRenormOp op,
                                PatternRewriter &rewriter) const override {
    Value scores = op.getScores();
    if (!anyLeadingZero(scores) && !anyLeadingZero(op.getWeights()))
      return failure();
    // K >= k >= 1 (verified), so only the rows can be empty.
    Location loc = op.getLoc();
    SmallVector<OpFoldResult> sizes;
    int64_t rank = cast<RankedTensorType>(scores.getType()).getRank();
    for (int64_t i = 0; i + 1 < rank; ++i)
      sizes.push_back(sizeOf(rewriter, loc, {scores, i}));
    sizes.push_back(rewriter.getIndexAttr(op.getK()));
    rewriter.replaceOp(op, {emptyOf(rewriter, loc, op.getWeights().getType(), sizes),
                            emptyOf(rewriter, loc, op.getIndices().getType(), sizes)});
    return success();
  }
};

//===----------------------------------------------------------------------===//
// similarity_inform(_topk): no rows, no experts, no features
//===----------------------------------------------------------------------===//

template <typename OpTy>
LogicalResult degenerateSimilarity(OpTy op, PatternRewriter &rewriter) {
  Location loc = op.getLoc();
  Value u = op.getU(), e = op.getE(), r = op->getResult(0);
  bool noRows = anyZero({{u, 0}, {u, 1}, {e, 0}, {e, 1}, {r, 0}, {r, 1}});
  // The fused op's k >= 1 is at most K, so only the plain op's K can be 0.
  bool noExperts = !kFused<OpTy> && anyZero({{e, 2}, {r, 2}});
  if (noRows || noExperts) {
    SmallVector<OpFoldResult> sizes =
        mixSizes(rewriter, op, sizeOf(rewriter, loc, {u, 0}),
                 sizeOf(rewriter, loc, {u, 1}));
    SmallVector<Value> empties;
    for (Value result : op->getResults())
      empties.push_back(emptyOf(rewriter, loc, result.getType(), sizes));
    rewriter.replaceOp(op, empties);
    return success();
  }
  // D = 0: every logit u_i^T W_s u_j / tau is an empty sum, 0; so is it for
  // a one-wide zero `u` without `ws`.
  Value ws = op.getWs();
  if (!anyZero({{u, 2}}) && !(ws && anyZero({{ws, 0}, {ws, 1}})))
    return failure();
  Value zeros = zerosOf(rewriter, loc, elementTypeOf(u),
                        {sizeOf(rewriter, loc, {u, 0}),
                         sizeOf(rewriter, loc, {u, 1}),
                         rewriter.getIndexAttr(1)});
  rewriter.modifyOpInPlace(op, [&] {
    op.getUMutable().assign(zeros);
    op.getWsMutable().clear();
  });
  return success();
}

//===----------------------------------------------------------------------===//
// attention_posterior(_topk): no rows, no keys, no experts, no features
//===----------------------------------------------------------------------===//

template <typename OpTy>
LogicalResult degeneratePosterior(OpTy op, PatternRewriter &rewriter) {
  Location loc = op.getLoc();
  Value scores = op.getScores(), u = op.getU(), v = op.getV(),
        wo = op.getWo(), e = op.getE(), head = op.getHead();
  Value r = op->getResult(0);
  auto size = [&](Value value, int64_t dim) {
    return sizeOf(rewriter, loc, {value, dim});
  };
  // Sizes are built (tensor.dim for a dynamic one) only once a rewrite is
  // certain: a pattern that fails must leave the IR untouched.
  // [B, N, K] of the mixed p (plain) or [B, N, k] of the gate (fused).
  auto rowSizes = [&] {
    return mixSizes(rewriter, op, size(scores, 0), size(scores, 2));
  };
  auto batch = [&] { return size(scores, 0); };
  // The head of a sequence whose rows have no say: the lowest head for
  // min_entropy (every mean entropy is 0), -1 for `all`.
  auto constantHead = [&] {
    int32_t h = op.getHeadSelect() == HeadSelect::all ? -1 : 0;
    return splatOf(rewriter, loc, head.getType(), {batch()},
                   rewriter.getI32IntegerAttr(h));
  };

  bool noBatch = anyZero({{scores, 0}, {u, 0}, {v, 0}, {e, 0}, {head, 0}});
  bool noRows = anyZero({{scores, 2}, {u, 1}, {r, 0}, {r, 1}});
  if (noBatch || noRows) {
    SmallVector<Value> values;
    for (Value result : op->getResults().drop_back())
      values.push_back(emptyOf(rewriter, loc, result.getType(), rowSizes()));
    values.push_back(noBatch ? emptyOf(rewriter, loc, head.getType(), {batch()})
                             : constantHead());
    rewriter.replaceOp(op, values);
    return success();
  }

  if (anyZero({{scores, 3}, {v, 2}, {e, 1}})) {
    // No keys: every query row is fully masked, so p = 0.
    SmallVector<OpFoldResult> pSizes = {size(scores, 0), size(scores, 2),
                                        size(e, 2)};
    SmallVector<Value> values;
    if constexpr (kFused<OpTy>) {
      Value p = zerosOf(rewriter, loc, rewriter.getF32Type(), pSizes);
      // The gate of p = 0: zero weights, indices 0..k-1 (lowest-index ties).
      auto gate = TopkRenormOp::create(
          rewriter, loc, op.getWeights().getType(), op.getIndices().getType(),
          p, op.getK(), TopkMode::probs, op.getRenormalize());
      values = {gate.getWeights(), gate.getIndices()};
    } else {
      values = {splatOf(rewriter, loc, r.getType(), pSizes,
                        rewriter.getF32FloatAttr(0.0f))};
    }
    values.push_back(constantHead());
    rewriter.replaceOp(op, values);
    return success();
  }

  if (!kFused<OpTy> && anyZero({{e, 2}, {r, 2}})) {
    // No experts: p is empty, but the head still follows from the scores.
    Value p = emptyOf(rewriter, loc, r.getType(), rowSizes());
    if (op.getHeadSelect() == HeadSelect::all || head.use_empty()) {
      rewriter.replaceOp(op, {p, constantHead()});
      return success();
    }
    Value oneExpert = zerosOf(rewriter, loc, elementTypeOf(e),
                              {size(e, 0), size(e, 1), rewriter.getIndexAttr(1)});
    Operation *withExpert = rewriter.clone(*op);
    withExpert->setOperand(4, oneExpert);
    auto rType = cast<RankedTensorType>(r.getType());
    withExpert->getResult(0).setType(RankedTensorType::get(
        {rType.getDimSize(0), rType.getDimSize(1), 1}, rType.getElementType()));
    rewriter.replaceOp(op, {p, withExpert->getResult(1)});
    return success();
  }

  // No features: the head means m are empty sums (D = 0) or zero vectors
  // (Dh = 0), and so are they, exactly, for one-wide zero v and wo (with a
  // one-wide zero u when D = 0: <u, m> is then 0 as well).
  bool noModel = anyZero({{u, 2}, {wo, 0}});
  bool noHeadDim = anyZero({{v, 3}, {wo, 1}});
  if (!noModel && !noHeadDim)
    return failure();
  OpFoldResult one = rewriter.getIndexAttr(1), heads = size(scores, 1);
  // (Past this point the rewrite always happens.)
  Value newU = u;
  if (noModel)
    newU = zerosOf(rewriter, loc, elementTypeOf(u),
                   {size(u, 0), size(u, 1), one});
  Value newV = zerosOf(rewriter, loc, elementTypeOf(v),
                       {size(v, 0), heads, size(v, 2), one});
  Value newWo = zerosOf(rewriter, loc, elementTypeOf(wo),
                        {noModel ? one : size(u, 2), heads});
  rewriter.modifyOpInPlace(op, [&] {
    op.getUMutable().assign(newU);
    op.getVMutable().assign(newV);
    op.getWoMutable().assign(newWo);
  });
  return success();
}
} // namespace

void mlir::moe::detail::populateDegenerateTopkPattern(
    RewritePatternSet &patterns, PatternBenefit benefit) {
  patterns.add<EmptyTopk>(patterns.getContext(), benefit);
}

void mlir::moe::detail::populateDegeneratePosteriorPattern(
    RewritePatternSet &patterns, PatternBenefit benefit) {
  patterns.add(degeneratePosterior<AttentionPosteriorOp>, benefit);
}

void SimilarityInformOp::getCanonicalizationPatterns(
    RewritePatternSet &patterns, MLIRContext *ctx) {
  patterns.add(degenerateSimilarity<SimilarityInformOp>);
}

void SimilarityInformTopkOp::getCanonicalizationPatterns(
    RewritePatternSet &patterns, MLIRContext *ctx) {
  patterns.add(degenerateSimilarity<SimilarityInformTopkOp>);
}

void AttentionPosteriorTopkOp::getCanonicalizationPatterns(
    RewritePatternSet &patterns, MLIRContext *ctx) {
  patterns.add(degeneratePosterior<AttentionPosteriorTopkOp>);
}

void mlir::moe::populateDegenerateShapePatterns(RewritePatternSet &patterns,
                                                PatternBenefit benefit) {
  patterns.add<EmptyTopk>(patterns.getContext(), benefit);
  patterns.add(degenerateSimilarity<SimilarityInformOp>, benefit);
  patterns.add(degenerateSimilarity<SimilarityInformTopkOp>, benefit);
  patterns.add(degeneratePosterior<AttentionPosteriorOp>, benefit);
  patterns.add(degeneratePosterior<AttentionPosteriorTopkOp>, benefit);
}
