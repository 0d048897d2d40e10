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
#include "Degenerate.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <optional>

using namespace mlir;
using namespace mlir::moe;

namespace {
/// The most multiply-adds (and materialized elements) a fold may spend: past
/// it the op is left for the lowering, which computes the same thing at run
/// time. 2^24 is ~20 ms of host work; the largest HyperRouter of the paper
/// (De = Dh = 256, E·(D+1) = 4112 rows) needs 2^20.
constexpr int64_t kFoldWorkBudget = int64_t(1) << 24;

/// A constant float operand, read in f32 (the dialect's accumulation type).
/// A splat stays one value: the fold computes with it as such and never
/// expands it (a splat of 2^32 elements is as cheap as one of 4).
class ConstantFloats {
public:
  /// std::nullopt when `attr` is not a dense float tensor.
  static std::optional<ConstantFloats> get(Attribute attr) {
    auto dense = dyn_cast_if_present<DenseElementsAttr>(attr);
    if (!dense || !isa<FloatType>(dense.getElementType()))
      return std::nullopt;
    ConstantFloats result;
    result.dense = dense;
    if (dense.isSplat())
      result.splatValue = toFloat(dense.getSplatValue<APFloat>());
    return result;
  }

  bool isSplat() const { return dense.isSplat(); }
  int64_t size() const { return dense.getNumElements(); }
  /// Elements a fold must read one by one (0 for a splat).
  int64_t readCost() const { return isSplat() ? 0 : size(); }

  /// Widens a non-splat operand; call only once the fold fits its budget.
  void materialize() {
    if (isSplat() || !values.empty())
      return;
    values.reserve(size());
    for (APFloat v : dense.getValues<APFloat>())
      values.push_back(toFloat(v));
  }
  float operator[](int64_t i) const {
    return isSplat() ? splatValue : values[i];
  }

private:
  static float toFloat(APFloat v) {
    bool losesInfo;
    v.convert(APFloat::IEEEsingle(), llvm::RoundingMode::NearestTiesToEven,
              &losesInfo);
    return v.convertToFloat();
  }

  DenseElementsAttr dense;
  float splatValue = 0.0f;
  SmallVector<float> values;
};

/// `acc` plus `n` copies of `x`, added one at a time in f32 (the order of the
/// lowering's reduction) without `n` steps: once adding `x` no longer changes
/// `acc` (x below half an ulp of acc, or acc non-finite) it never will, and
/// that happens within ~2^25 steps of a finite `x`.
float addRepeated(float acc, float x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float next = acc + x;
    if (next == acc || std::isnan(next))
      return next;
    acc = next;
  }
  return acc;
}

/// `Σ_j a[row·n + j] · b(j)` for j < n in f32, in order. Every row of a splat
/// `a` gives the same sum, and a splat `a` with a splat `b` is one product
/// added n times.
template <typename B>
float rowDot(const ConstantFloats &a, int64_t row, const B &b, bool bSplat,
             int64_t n) {
  if (a.isSplat() && bSplat)
    return addRepeated(0.0f, a[0] * b(0), n);
  float acc = 0.0f;
  for (int64_t j = 0, base = a.isSplat() ? 0 : row * n; j < n; ++j)
    acc += a[base + j] * b(j);
  return acc;
}

/// ReLU that keeps a NaN, as arith.maximumf does in the lowering.
float relu(float x) { return x > 0.0f ? x : (std::isnan(x) ? x : 0.0f); }

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
  auto emb = ConstantFloats::get(adaptor.getEmb());
  auto w1 = ConstantFloats::get(adaptor.getW1());
  auto b1 = ConstantFloats::get(adaptor.getB1());
  auto w2 = ConstantFloats::get(adaptor.getW2());
  auto b2 = ConstantFloats::get(adaptor.getB2());
  auto wType = cast<RankedTensorType>(getW().getType());
  auto bType = cast<RankedTensorType>(getB().getType());
  if (!emb || !w1 || !b1 || !w2 || !b2 || !wType.hasStaticShape() ||
      !bType.hasStaticShape())
    return failure();

  const int64_t de = emb->size(), dh = b1->size(), rows = b2->size();
  const int64_t numExperts = getNumExperts(), d = wType.getDimSize(1);
  int64_t expectedRows; // the verifier checked it unless a size is dynamic
  if (llvm::MulOverflow(numExperts, d + 1, expectedRows) ||
      rows != expectedRows)
    return failure();

  // Every row of a splat w1 (w2) gives the same dot product, so one serves
  // them all; `hidden` (`out`) is a splat when, in addition, b1 (b2) is.
  const bool hiddenSplat = w1->isSplat() && b1->isSplat();
  const bool outSplat = w2->isSplat() && b2->isSplat();
  auto dotCost = [](bool rowsEqual, int64_t numRows, bool splatPair,
                    int64_t n) {
    return (rowsEqual ? 1 : numRows) * (splatPair ? 1 : n);
  };
  int64_t work = 0;
  for (int64_t term :
       {emb->readCost(), w1->readCost(), b1->readCost(), w2->readCost(),
        b2->readCost(),
        dotCost(w1->isSplat(), dh, w1->isSplat() && emb->isSplat(), de),
        dotCost(w2->isSplat(), rows, w2->isSplat() && hiddenSplat, dh),
        outSplat ? int64_t(1) : rows})
    // Checked term by term so that the sum cannot overflow.
    if (term > kFoldWorkBudget || (work += term) > kFoldWorkBudget)
      return failure();
  for (ConstantFloats *c : {&*emb, &*w1, &*b1, &*w2, &*b2})
    c->materialize();

  // hidden = relu(w1 · emb + b1); out = w2 · hidden + b2, summed in f32 in the
  // same order as the lowering so that folding does not change the router.
  auto embAt = [&](int64_t j) { return (*emb)[j]; };
  SmallVector<float> hidden;
  std::optional<float> sharedDot;
  for (int64_t i = 0, e = hiddenSplat ? 1 : dh; i < e; ++i) {
    if (!sharedDot || !w1->isSplat())
      sharedDot = rowDot(*w1, i, embAt, emb->isSplat(), de);
    hidden.push_back(relu(*sharedDot + (*b1)[i]));
  }
  auto hiddenAt = [&](int64_t j) { return hidden[hiddenSplat ? 0 : j]; };
  sharedDot.reset();
  auto outAt = [&](int64_t r) {
    if (!sharedDot || !w2->isSplat())
      sharedDot = rowDot(*w2, r, hiddenAt, hiddenSplat, dh);
    return *sharedDot + (*b2)[r];
  };

  if (outSplat) {
    float value = outAt(0);
    results.push_back(DenseElementsAttr::get(wType, value));
    results.push_back(DenseElementsAttr::get(bType, value));
    return success();
  }
  SmallVector<float> w, b;
  w.reserve(numExperts * d);
  b.reserve(numExperts);
  for (int64_t r = 0; r < rows; ++r) {
    float acc = outAt(r);
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
  detail::populateDegenerateTopkPattern(patterns);
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
  detail::populateDegeneratePosteriorPattern(patterns);
}
