//===- MoEOps.cpp - Verifiers and type inference of the moe ops -----------===//
//
// Part of the MoE-MLIR project.
//
// Type inference is lenient on purpose: it runs before the verifiers, so it
// never fails on a malformed op (it answers dynamic sizes where an operand has
// the wrong rank) and leaves the diagnostics, which name the operand and the
// rule, to the verifiers below.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "Verifiers.h"

#include "MoE/Support/ShortestDecimal.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <cstdio>
#include <string>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

namespace {
constexpr int64_t kDynamic = ShapedType::kDynamic;
} // namespace

int64_t mlir::moe::detail::dimOf(Value v, int64_t rank, int64_t i) {
  auto type = dyn_cast_if_present<RankedTensorType>(v ? v.getType() : Type());
  if (!type || type.getRank() != rank)
    return kDynamic;
  return type.getDimSize(i);
}

namespace {

/// The static one of two sizes that must agree (the verifier checks they do).
int64_t merge(int64_t a, int64_t b) { return ShapedType::isDynamic(a) ? b : a; }

int64_t merge(std::initializer_list<int64_t> sizes) {
  int64_t result = kDynamic;
  for (int64_t s : sizes)
    result = merge(result, s);
  return result;
}

/// The width of a top-k result: `k`, or dynamic while the verifier rejects it.
int64_t topkWidth(int64_t k) { return k >= 1 ? k : kDynamic; }

} // namespace

RankedTensorType mlir::moe::detail::f32Tensor(MLIRContext *ctx,
                                              ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, Float32Type::get(ctx));
}

RankedTensorType mlir::moe::detail::i32Tensor(MLIRContext *ctx,
                                              ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, IntegerType::get(ctx, 32));
}

std::string mlir::moe::detail::formatFloat(double value) {
  // As Python prints the float a user passed (repr: the shortest text that
  // reads back, "1.0" for an integral value), the f32 attributes' values as
  // floats (0.1, not the double nearest 0.1f).
  float asFloat = static_cast<float>(value);
  std::string text = static_cast<double>(asFloat) == value
                         ? shortestDecimal(asFloat)
                         : shortestDecimal(value);
  if (text.find_first_of(".ein") == std::string::npos)
    text += ".0";
  return text;
}


LogicalResult OperandChecker::rank(Value v, StringRef name, int64_t rank,
                                   StringRef layout) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getRank() == rank)
    return success();
  InFlightDiagnostic diag = op->emitOpError()
                            << "'" << name << "' must have rank " << rank
                            << " (" << layout << "), got shape [";
  llvm::interleave(type.getShape(), diag, ", ");
  return diag << "]";
}

LogicalResult OperandChecker::sameDim(Value a, StringRef aName, int64_t ai,
                                      Value b, StringRef bName, int64_t bi,
                                      StringRef sym) {
  int64_t da = cast<RankedTensorType>(a.getType()).getDimSize(ai);
  int64_t db = cast<RankedTensorType>(b.getType()).getDimSize(bi);
  if (ShapedType::isDynamic(da) || ShapedType::isDynamic(db) || da == db)
    return success();
  return op->emitOpError() << "dimension " << ai << " of '" << aName << "' ("
                           << sym << " = " << da << ") must equal dimension "
                           << bi << " of '" << bName << "' (" << sym << " = "
                           << db << ")";
}

LogicalResult OperandChecker::dimEquals(Value v, const Twine &noun, int64_t d,
                                        int64_t expected, const Twine &what,
                                        StringRef why) {
  int64_t size = cast<RankedTensorType>(v.getType()).getDimSize(d);
  if (ShapedType::isDynamic(size) || ShapedType::isDynamic(expected) ||
      size == expected)
    return success();
  return op->emitOpError() << "dimension " << d << " of " << noun << " ("
                           << size << ") must equal " << what << " ("
                           << expected << ")" << why;
}

LogicalResult OperandChecker::positive(StringRef name, float value) {
  if (std::isfinite(value) && value > 0.0f)
    return success();
  return op->emitOpError() << "'" << name << "' (" << formatFloat(value)
                           << ") must be finite and > 0";
}

LogicalResult OperandChecker::nonNegative(StringRef name, double value,
                                          StringRef why) {
  if (std::isfinite(value) && value >= 0.0)
    return success();
  return op->emitOpError() << "'" << name << "' (" << formatFloat(value)
                           << ") must be finite and >= 0" << why;
}

LogicalResult OperandChecker::inRange(StringRef name, float value, float lo,
                                      float hi) {
  if (std::isfinite(value) && value >= lo && value <= hi)
    return success();
  return op->emitOpError() << "'" << name << "' (" << formatFloat(value)
                           << ") must be in [" << formatFloat(lo) << ", "
                           << formatFloat(hi) << "]";
}

LogicalResult OperandChecker::atLeast(StringRef name, int64_t value,
                                      int64_t lo) {
  if (value >= lo)
    return success();
  return op->emitOpError() << "'" << name << "' (" << value
                           << ") must be >= " << lo;
}

LogicalResult OperandChecker::expertCount(int64_t value) {
  if (failed(atLeast("num_experts", value, 1)) || value <= kMaxKernelElements)
    return success(value >= 1);
  return op->emitOpError() << "'num_experts' (" << value
                           << ") must be <= " << kMaxKernelElements
                           << " (expert indices and counts are i32)";
}

bool mlir::moe::compatibleResultTypes(TypeRange inferred, TypeRange written) {
  if (inferred.size() != written.size())
    return false;
  for (auto [l, r] : llvm::zip(inferred, written)) {
    Type inferredElt = getElementTypeOrSelf(l);
    Type writtenElt = getElementTypeOrSelf(r);
    // Index results are inferred as i32 and may be written as i64 (as
    // torch.topk returns them); the op's ODS constraint says which may.
    bool widerIndex = inferredElt.isInteger(32) && writtenElt.isInteger(64);
    if ((inferredElt != writtenElt && !widerIndex) ||
        failed(verifyCompatibleShape(l, r)))
      return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Custom assembly: modes print as bare keywords, `mode(probs)`
//===----------------------------------------------------------------------===//

template <typename EnumAttrT>
static ParseResult parseEnumKeyword(OpAsmParser &parser, EnumAttrT &attr) {
  using EnumT = decltype(std::declval<EnumAttrT>().getValue());
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (parser.parseKeyword(&keyword))
    return failure();
  std::optional<EnumT> value = symbolizeEnum<EnumT>(keyword);
  if (!value)
    return parser.emitError(loc) << "unknown " << EnumAttrT::getMnemonic()
                                 << " '" << keyword << "'";
  attr = EnumAttrT::get(parser.getContext(), *value);
  return success();
}

template <typename EnumAttrT>
static void printEnumKeyword(OpAsmPrinter &printer, Operation *,
                             EnumAttrT attr) {
  printer << stringifyEnum(attr.getValue());
}

//===----------------------------------------------------------------------===//
// Rules shared by an op and its fused form
//===----------------------------------------------------------------------===//

/// `k` of a top-k over `numExperts` experts, described as `experts` (which
/// size of which operand they are).
static LogicalResult verifyTopkK(Operation *op, int64_t k, int64_t numExperts,
                                 StringRef experts) {
  if (ShapedType::isDynamic(numExperts)) {
    if (k < 1)
      return op->emitOpError() << "'k' (" << k << ") must be >= 1";
    return success();
  }
  if (k < 1 || k > numExperts)
    return op->emitOpError()
           << "'k' (" << k << ") must be in [1, " << numExperts
           << "] (" << experts << ")";
  return success();
}

/// The operands and `tau` of Similarity-Inform mixing.
LogicalResult mlir::moe::detail::verifySimilarityInform(Operation *op, Value u,
                                                      Value e, Value ws,
                                                      Value mask, float tau) {
  OperandChecker check(op);
  if (failed(check.rank(u, "u", 3, "[B, N, D]")) ||
      failed(check.rank(e, "e", 3, "[B, N, K]")) ||
      failed(check.sameDim(e, "e", 0, u, "u", 0, "B")) ||
      failed(check.sameDim(e, "e", 1, u, "u", 1, "N")))
    return failure();
  if (ws) {
    if (failed(check.rank(ws, "ws", 2, "[D, D]")) ||
        failed(check.sameDim(ws, "ws", 0, u, "u", 2, "D")) ||
        failed(check.sameDim(ws, "ws", 1, u, "u", 2, "D")))
      return failure();
  }
  if (mask) {
    if (failed(check.rank(mask, "key_mask", 2, "[B, N]")) ||
        failed(check.sameDim(mask, "key_mask", 0, u, "u", 0, "B")) ||
        failed(check.sameDim(mask, "key_mask", 1, u, "u", 1, "N")))
      return failure();
  }
  return check.positive("tau", tau);
}

/// The operands, `sigma` and `head_scale` of Attention-Inform mixing.
LogicalResult mlir::moe::detail::verifyAttentionPosterior(Operation *op, Value scores, Value u, Value v,
                         Value wo, Value e, float sigma,
                         std::optional<APFloat> headScale) {
  OperandChecker check(op);
  if (failed(check.rank(scores, "scores", 4, "[B, H, N, Nk]")) ||
      failed(check.rank(u, "u", 3, "[B, N, D]")) ||
      failed(check.rank(v, "v", 4, "[B, H, Nk, Dh]")) ||
      failed(check.rank(wo, "wo", 2, "[D, H*Dh]")) ||
      failed(check.rank(e, "e", 3, "[B, Nk, K]")))
    return failure();
  if (failed(check.sameDim(u, "u", 0, scores, "scores", 0, "B")) ||
      failed(check.sameDim(v, "v", 0, scores, "scores", 0, "B")) ||
      failed(check.sameDim(e, "e", 0, scores, "scores", 0, "B")) ||
      failed(check.sameDim(v, "v", 1, scores, "scores", 1, "H")) ||
      failed(check.sameDim(u, "u", 1, scores, "scores", 2, "N")) ||
      failed(check.sameDim(v, "v", 2, scores, "scores", 3, "Nk")) ||
      failed(check.sameDim(e, "e", 1, scores, "scores", 3, "Nk")) ||
      failed(check.sameDim(wo, "wo", 0, u, "u", 2, "D")))
    return failure();

  auto vType = cast<RankedTensorType>(v.getType());
  int64_t numHeads = vType.getDimSize(1), headDim = vType.getDimSize(3);
  if (cast<RankedTensorType>(scores.getType()).getDimSize(1) == 0 ||
      numHeads == 0)
    return op->emitOpError()
           << "dimension 1 of 'scores' (H = 0) must be >= 1: the posterior "
              "selects among the heads";
  int64_t woCols = cast<RankedTensorType>(wo.getType()).getDimSize(1);
  int64_t product;
  if (!ShapedType::isDynamic(numHeads) && !ShapedType::isDynamic(headDim) &&
      !ShapedType::isDynamic(woCols) &&
      (llvm::MulOverflow(numHeads, headDim, product) || woCols != product))
    return op->emitOpError()
           << "dimension 1 of 'wo' (" << woCols << ") must equal H*Dh = "
           << numHeads << "*" << headDim << " = " << numHeads * headDim
           << " (heads and head size of 'v')";

  if (failed(check.positive("sigma", sigma)))
    return failure();
  if (headScale && !headScale->isFinite())
    return op->emitOpError() << "'head_scale' ("
                             << formatFloat(headScale->convertToDouble())
                             << ") must be finite";
  return success();
}

//===----------------------------------------------------------------------===//
// TopkRenormOp
//===----------------------------------------------------------------------===//

LogicalResult TopkRenormOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  auto scores = dyn_cast<RankedTensorType>(adaptor.getScores().getType());
  if (!scores)
    return failure();
  // A rank-0 `scores` is rejected by the verifier, which names the rule.
  SmallVector<int64_t> shape(scores.getShape());
  if (shape.empty())
    shape.push_back(kDynamic);
  shape.back() = topkWidth(adaptor.getK());
  inferred.push_back(f32Tensor(ctx, shape));
  inferred.push_back(i32Tensor(ctx, shape));
  return success();
}

LogicalResult mlir::moe::detail::verifyTopkScores(Operation *op,
                                                  Value scores) {
  auto type = cast<RankedTensorType>(scores.getType());
  if (type.getRank() == 0)
    return op->emitOpError()
           << "'scores' must have rank >= 1 ([..., K]), but has type " << type;
  return success();
}

LogicalResult TopkRenormOp::verify() {
  if (failed(detail::verifyTopkScores(*this, getScores())))
    return failure();
  auto scores = cast<RankedTensorType>(getScores().getType());
  return verifyTopkK(*this, getK(), scores.getShape().back(),
                     "the size of the last dimension of 'scores'");
}

//===----------------------------------------------------------------------===//
// SimilarityInformOp
//===----------------------------------------------------------------------===//

/// [B, N] of Similarity-Inform mixing: from `u` [B, N, D] and `e` [B, N, K].
SmallVector<int64_t, 3> mlir::moe::detail::similarityRows(Value u, Value e) {
  return {merge(dimOf(u, 3, 0), dimOf(e, 3, 0)),
          merge(dimOf(u, 3, 1), dimOf(e, 3, 1))};
}

/// [B, N] of Attention-Inform mixing: from every operand that carries them.
SmallVector<int64_t, 3> mlir::moe::detail::posteriorRows(Value scores, Value u,
                                                        Value v, Value e) {
  return {merge({dimOf(scores, 4, 0), dimOf(u, 3, 0), dimOf(v, 4, 0),
                 dimOf(e, 3, 0)}),
          merge(dimOf(scores, 4, 2), dimOf(u, 3, 1))};
}

LogicalResult SimilarityInformOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 3> shape = similarityRows(adaptor.getU(), adaptor.getE());
  shape.push_back(dimOf(adaptor.getE(), 3, 2));
  inferred.push_back(f32Tensor(ctx, shape));
  return success();
}

LogicalResult SimilarityInformOp::verify() {
  return verifySimilarityInform(*this, getU(), getE(), getWs(), getKeyMask(),
                                getTau().convertToFloat());
}

//===----------------------------------------------------------------------===//
// AttentionPosteriorOp
//===----------------------------------------------------------------------===//

LogicalResult AttentionPosteriorOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 3> shape = posteriorRows(
      adaptor.getScores(), adaptor.getU(), adaptor.getV(), adaptor.getE());
  int64_t b = shape[0];
  shape.push_back(dimOf(adaptor.getE(), 3, 2));
  inferred.push_back(f32Tensor(ctx, shape));
  inferred.push_back(i32Tensor(ctx, {b}));
  return success();
}

std::optional<double> AttentionPosteriorOp::getEffectiveHeadScale() {
  if (std::optional<APFloat> scale = getHeadScale())
    return scale->convertToDouble();
  int64_t numHeads = cast<RankedTensorType>(getScores().getType()).getDimSize(1);
  if (ShapedType::isDynamic(numHeads))
    return std::nullopt;
  return static_cast<double>(numHeads);
}

LogicalResult AttentionPosteriorOp::verify() {
  return verifyAttentionPosterior(*this, getScores(), getU(), getV(), getWo(),
                                  getE(), getSigma().convertToFloat(),
                                  getHeadScale());
}

//===----------------------------------------------------------------------===//
// MadDispersionOp
//===----------------------------------------------------------------------===//

LogicalResult MadDispersionOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  int64_t numExperts = adaptor.getNumExperts();
  int64_t e = numExperts >= 1 ? numExperts : kDynamic;
  inferred.push_back(f32Tensor(ctx, {e, dimOf(adaptor.getTokens(), 2, 1)}));
  inferred.push_back(i32Tensor(ctx, {e}));
  return success();
}

LogicalResult MadDispersionOp::verify() {
  OperandChecker check(*this);
  Value tokens = getTokens(), assign = getAssign();
  if (failed(check.rank(tokens, "tokens", 2, "[T, D]")) ||
      failed(check.rank(assign, "assign", 1, "[T]")) ||
      failed(check.sameDim(assign, "assign", 0, tokens, "tokens", 0, "T")) ||
      failed(check.expertCount(getNumExperts())) ||
      failed(check.positive("eps", getEps().convertToFloat())) ||
      failed(check.nonNegative("clip", getClip().convertToFloat(),
                               " (0 disables clipping)")))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// AdjacencyUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult AdjacencyUpdateOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  Value a = adaptor.getA();
  int64_t e = merge(dimOf(a, 2, 0), dimOf(a, 2, 1));
  inferred.push_back(f32Tensor(ctx, {e, e}));
  return success();
}

LogicalResult AdjacencyUpdateOp::verify() {
  OperandChecker check(*this);
  Value a = getA(), idx = getIdx();
  if (failed(check.rank(a, "a", 2, "[E, E]")) ||
      failed(check.rank(idx, "idx", 2, "[T, k]")) ||
      failed(check.sameDim(a, "a", 1, a, "a", 0, "E")))
    return failure();
  int64_t numExperts = cast<RankedTensorType>(a.getType()).getDimSize(0);
  int64_t k = cast<RankedTensorType>(idx.getType()).getDimSize(1);
  if (!ShapedType::isDynamic(k)) {
    if (k < 1)
      return emitOpError() << "dimension 1 of 'idx' (k = " << k
                           << ") must be >= 1 (experts chosen per token)";
    if (!ShapedType::isDynamic(numExperts) && k > numExperts)
      return emitOpError() << "dimension 1 of 'idx' (k = " << k
                           << ") must be <= E = " << numExperts
                           << " (the size of 'a')";
  }
  return check.inRange("beta", getBeta().convertToFloat(), 0.0f, 1.0f);
}

//===----------------------------------------------------------------------===//
// HyperRouterOp
//===----------------------------------------------------------------------===//

LogicalResult HyperRouterOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  int64_t numExperts = adaptor.getNumExperts();
  int64_t rows = merge(dimOf(adaptor.getW2(), 2, 0), dimOf(adaptor.getB2(), 1, 0));
  int64_t e = numExperts >= 1 ? numExperts : kDynamic;
  int64_t d = kDynamic;
  if (!ShapedType::isDynamic(rows) && numExperts >= 1 &&
      rows % numExperts == 0 && rows / numExperts >= 2)
    d = rows / numExperts - 1;
  inferred.push_back(f32Tensor(ctx, {e, d}));
  inferred.push_back(f32Tensor(ctx, {e}));
  return success();
}

LogicalResult HyperRouterOp::verify() {
  return mlir::moe::detail::verifyHyperRouter(
      *this, getEmb(), getW1(), getB1(), getW2(), getB2(), getNumExperts(),
      cast<RankedTensorType>(getW().getType()).getDimSize(1), "result 'w'");
}

LogicalResult mlir::moe::detail::verifyHyperRouter(Operation *op, Value emb,
                                                   Value w1, Value b1, Value w2,
                                                   Value b2, int64_t numExperts,
                                                   int64_t d,
                                                   StringRef dName) {
  OperandChecker check(op);
  if (failed(check.rank(emb, "emb", 1, "[De]")) ||
      failed(check.rank(w1, "w1", 2, "[Dh, De]")) ||
      failed(check.rank(b1, "b1", 1, "[Dh]")) ||
      failed(check.rank(w2, "w2", 2, "[E*(D+1), Dh]")) ||
      failed(check.rank(b2, "b2", 1, "[E*(D+1)]")) ||
      failed(check.sameDim(w1, "w1", 1, emb, "emb", 0, "De")) ||
      failed(check.sameDim(b1, "b1", 0, w1, "w1", 0, "Dh")) ||
      failed(check.sameDim(w2, "w2", 1, w1, "w1", 0, "Dh")) ||
      failed(check.sameDim(b2, "b2", 0, w2, "w2", 0, "E*(D+1)")) ||
      failed(check.expertCount(numExperts)))
    return failure();

  int64_t rows = merge(cast<RankedTensorType>(w2.getType()).getDimSize(0),
                       cast<RankedTensorType>(b2.getType()).getDimSize(0));
  // D = 0 is a router of biases only: w is [E, 0], b = w2 h + b2 ([E]).
  if (!ShapedType::isDynamic(d) && d < 0)
    return op->emitOpError() << dName << " must have D >= 0 features";
  if (ShapedType::isDynamic(rows))
    return success();
  int64_t expected;
  if (!ShapedType::isDynamic(d) &&
      (llvm::AddOverflow(d, int64_t(1), expected) ||
       llvm::MulOverflow(numExperts, expected, expected) || rows != expected))
    return op->emitOpError() << "'w2' must have E*(D+1) = " << numExperts << "*("
                         << d << "+1) = " << expected
                         << " rows, but has " << rows;
  if (rows % numExperts != 0 || rows / numExperts < 1)
    return op->emitOpError() << "dimension 0 of 'w2' (" << rows
                             << ") must be num_experts * (D+1) = " << numExperts
                             << " * (D+1) with D >= 0";
  return success();
}

//===----------------------------------------------------------------------===//
// Fused ops
//===----------------------------------------------------------------------===//

LogicalResult SimilarityInformTopkOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 3> shape = similarityRows(adaptor.getU(), adaptor.getE());
  shape.push_back(topkWidth(adaptor.getK()));
  inferred.push_back(f32Tensor(ctx, shape));
  inferred.push_back(i32Tensor(ctx, shape));
  return success();
}

LogicalResult SimilarityInformTopkOp::verify() {
  if (failed(verifySimilarityInform(*this, getU(), getE(), getWs(),
                                    getKeyMask(), getTau().convertToFloat())))
    return failure();
  return verifyTopkK(*this, getK(),
                     cast<RankedTensorType>(getE().getType()).getDimSize(2),
                     "dimension 2 of 'e', K");
}

LogicalResult AttentionPosteriorTopkOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 3> shape = posteriorRows(
      adaptor.getScores(), adaptor.getU(), adaptor.getV(), adaptor.getE());
  int64_t b = shape[0];
  shape.push_back(topkWidth(adaptor.getK()));
  inferred.push_back(f32Tensor(ctx, shape));
  inferred.push_back(i32Tensor(ctx, shape));
  inferred.push_back(i32Tensor(ctx, {b}));
  return success();
}

LogicalResult AttentionPosteriorTopkOp::verify() {
  if (failed(verifyAttentionPosterior(*this, getScores(), getU(), getV(),
                                      getWo(), getE(),
                                      getSigma().convertToFloat(),
                                      getHeadScale())))
    return failure();
  return verifyTopkK(*this, getK(),
                     cast<RankedTensorType>(getE().getType()).getDimSize(2),
                     "dimension 2 of 'e', K");
}

//===----------------------------------------------------------------------===//
// TableGen'd op definitions
//===----------------------------------------------------------------------===//

#define GET_OP_CLASSES
#include "MoE/IR/MoEOps.cpp.inc"
