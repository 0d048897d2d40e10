//===- MoEFolds.cpp - Folders and canonicalizations of the moe ops --------===//
//
// Part of the MoE-MLIR project.
//
// Every rewrite here is exact, NaN and masked rows included: a rewrite that
// changed what a NaN input produces would make the canonical form disagree with
// the op's documented semantics.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::moe;

namespace {
/// The elements of a constant float tensor, widened to f32 (the dialect's
/// accumulation type); empty when `attr` is not a dense float tensor.
std::optional<SmallVector<float>> floatElements(Attribute attr) {
  auto dense = dyn_cast_if_present<DenseElementsAttr>(attr);
  if (!dense || !isa<FloatType>(dense.getElementType()))
    return std::nullopt;
  SmallVector<float> values;
  values.reserve(dense.getNumElements());
  for (APFloat v : dense.getValues<APFloat>()) {
    bool losesInfo;
    v.convert(APFloat::IEEEsingle(), llvm::RoundingMode::NearestTiesToEven, &losesInfo);
    values.push_back(v.convertToFloat());
  }
  return values;
}

/// Replaces the uses of `result` by a splat constant `value` when its type is
/// static (a dynamic batch keeps the op's own result).
LogicalResult replaceWithSplat(PatternRewriter &rewriter, Location loc,
                               Value result, int32_t value) {
  auto type = cast<RankedTensorType>(result.getType());
  if (result.use_empty() || !type.hasStaticShape())
    return failure();
  auto splat = DenseElementsAttr::get(type, rewriter.getI32IntegerAttr(value));
  Value constant = arith::ConstantOp::create(rewriter, loc, type, splat);
  rewriter.replaceAllUsesWith(result, constant);
  return success();
}
} // namespace

//===----------------------------------------------------------------------===//
// HyperRouterOp: generate the router once (HyperRouter App. C.4)
//===----------------------------------------------------------------------===//

LogicalResult HyperRouterOp::fold(FoldAdaptor adaptor,
                                  SmallVectorImpl<OpFoldResult> &results) {
  auto emb = floatElements(adaptor.getEmb());
  auto w1 = floatElements(adaptor.getW1());
  auto b1 = floatElements(adaptor.getB1());
  auto w2 = floatElements(adaptor.getW2());
  auto b2 = floatElements(adaptor.getB2());
  auto wType = cast<RankedTensorType>(getW().getType());
  auto bType = cast<RankedTensorType>(getB().getType());
  if (!emb || !w1 || !b1 || !w2 || !b2 || !wType.hasStaticShape() ||
      !bType.hasStaticShape())
    return failure();

  const int64_t de = emb->size(), dh = b1->size(), rows = b2->size();
  const int64_t numExperts = getNumExperts(), d = wType.getDimSize(1);
  if (rows != numExperts * (d + 1))
    return failure();

  // hidden = relu(w1 · emb + b1); out = w2 · hidden + b2, summed in f32 in the
  // same order as the lowering so that folding does not change the router.
  SmallVector<float> hidden(dh);
  for (int64_t i = 0; i < dh; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < de; ++j)
      acc += (*w1)[i * de + j] * (*emb)[j];
    acc += (*b1)[i];
    hidden[i] = acc > 0.0f ? acc : (std::isnan(acc) ? acc : 0.0f);
  }
  SmallVector<float> w, b;
  w.reserve(numExperts * d);
  b.reserve(numExperts);
  for (int64_t r = 0; r < rows; ++r) {
    float acc = 0.0f;
    for (int64_t j = 0; j < dh; ++j)
      acc += (*w2)[r * dh + j] * hidden[j];
    acc += (*b2)[r];
    // Row-major [E, D+1]: the last column of every expert row is its bias.
    if (r % (d + 1) == d)
      b.push_back(acc);
    else
      w.push_back(acc);
  }
  results.push_back(DenseElementsAttr::get(wType, ArrayRef<float>(w)));
  results.push_back(DenseElementsAttr::get(bType, ArrayRef<float>(b)));
  return success();
}

//===----------------------------------------------------------------------===//
// AdjacencyUpdateOp: beta = 1 freezes the graph
//===----------------------------------------------------------------------===//

OpFoldResult AdjacencyUpdateOp::fold(FoldAdaptor) {
  // a_next = 1 · a + 0 · Norm(C), and Norm(C) is always finite (counts divided
  // by non-zero sums), so the update is exactly `a`.
  if (getBeta().convertToFloat() == 1.0f && getA().getType() == getType())
    return getA();
  return {};
}

//===----------------------------------------------------------------------===//
// TopkRenormOp: one expert has index 0
//===----------------------------------------------------------------------===//

namespace {
/// With K = 1 the only choice is expert 0, whatever the scores (NaN included),
/// so the indices are a constant and their consumers need not wait for the op.
struct FoldSingleExpertIndices : OpRewritePattern<TopkRenormOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TopkRenormOp op,
                                PatternRewriter &rewriter) const override {
    auto scores = cast<RankedTensorType>(op.getScores().getType());
    if (scores.getShape().back() != 1)
      return failure();
    return replaceWithSplat(rewriter, op.getLoc(), op.getIndices(), 0);
  }
};
} // namespace

void TopkRenormOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                               MLIRContext *ctx) {
  patterns.add<FoldSingleExpertIndices>(ctx);
}

//===----------------------------------------------------------------------===//
// AttentionPosteriorOp: the selected head is known statically
//===----------------------------------------------------------------------===//

namespace {
/// `head_select = all` always reports −1; a single head is always head 0.
struct FoldKnownHead : OpRewritePattern<AttentionPosteriorOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AttentionPosteriorOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getHeadSelect() == HeadSelect::all)
      return replaceWithSplat(rewriter, op.getLoc(), op.getHead(), -1);
    auto scores = cast<RankedTensorType>(op.getScores().getType());
    if (scores.getDimSize(1) == 1)
      return replaceWithSplat(rewriter, op.getLoc(), op.getHead(), 0);
    return failure();
  }
};
} // namespace

void AttentionPosteriorOp::getCanonicalizationPatterns(
    RewritePatternSet &patterns, MLIRContext *ctx) {
  patterns.add<FoldKnownHead>(ctx);
}
