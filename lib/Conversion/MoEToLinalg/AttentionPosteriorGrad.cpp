//===- AttentionPosteriorGrad.cpp - moe.attention_posterior_grad -> linalg ===//
//
// Part of the MoE-MLIR project.
//
// The portable backward of Attention-Inform mixing (the maths is in the op
// description, MoEGradOps.td), as linalg.generic ops on tensors, for both
// head selections:
//  1. head means m [B, H, Nk, D] = c · v W_h^T (wo viewed as [D, H, Dh]), their
//     squared norms, and the logits z [B, H, N, Nk] (-inf where masked, on the
//     heads other than h* for min_entropy; the log prior for all);
//  2. the mixing weights G: one softmax per row over the pairs (h, j) (which
//     is the forward's softmax over j of head h* for min_entropy and
//     H'·A' for all), recomputed from the row max and sum;
//  3. g = dp e^T, delta = <mix, g>, dz = G (g - delta), and the contractions
//     of the description for d_e, d_u, dm, d_v, d_wo and d_scores.
// Unlike the CPU kernel (MoEToCPU/AttentionPosteriorGrad.cpp, flash-style)
// this stores [B, H, N, Nk] temporaries, the size of the result d_scores: it
// is the reference lowering for every target and mode (head_select = all has
// no fast kernel yet). Every sum runs in a fixed order (deterministic).
// An h* outside [0, H) is reported (emitIndexCheck); no head matches it, so
// its batch element's logits are all -inf, G = 0 and its gradients 0.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {

/// x where `e` is finite, else 0.
Value whereFinite(OpBuilder &b, Location l, Value e, Value x) {
  Value fin = arith::CmpFOp::create(
      b, l, arith::CmpFPredicate::ONE, math::AbsFOp::create(b, l, e),
      f32Const(b, l, std::numeric_limits<float>::infinity()));
  return arith::SelectOp::create(b, l, fin, x, f32Const(b, l, 0.0));
}

/// The steps of the lowering (numbered as in the file comment), on the op's
/// operands in f32 and their sizes; each step is a method named after what
/// it computes, called in the order of the emitted code.
class PosteriorGradLowering {
public:
  PosteriorGradLowering(PatternRewriter &rw, AttentionPosteriorGradOp op)
      : rw(rw), loc(op.getLoc()), ctx(rw.getContext()), f32(rw.getF32Type()),
        op(op), minEntropy(op.getHeadSelect() == HeadSelect::min_entropy) {
    scores = promoteToF32(rw, loc, op.getScores());
    u = promoteToF32(rw, loc, op.getU());
    v = promoteToF32(rw, loc, op.getV());
    wo = promoteToF32(rw, loc, op.getWo());
    e = promoteToF32(rw, loc, op.getE());
    dp = op.getDp();
    head = op.getHead();
  }

  /// min_entropy's run-time check of h* (emitIndexCheck).
  LogicalResult checkHead() {
    if (!minEntropy)
      return success();
    return emitIndexCheck(
        rw, op, head,
        getValueOrCreateConstantIndexOp(
            rw, loc, tensor::getMixedSize(rw, loc, op.getScores(), 1)),
        kMoEErrorAttentionHead);
  }

  /// The gradients (d_scores, d_u, d_v, d_wo, d_e).
  SmallVector<Value> gradients() {
    readSizes();
    // 1. Head means, their norms, the logits.
    Value wo3 = tensor::ExpandShapeOp::create(
        rw, loc, tensorTypeOf({D, H, Dh}, f32), wo,
        ArrayRef<ReassociationIndices>{{0}, {1, 2}},
        ArrayRef<OpFoldResult>{D, H, Dh});
    Value m = headMeans(wo3);
    Value norm2 = contract({m, m}, {B, H, Nk},
                           {map(4, {0, 1, 2, 3}), map(4, {0, 1, 2, 3}),
                            map(4, {0, 1, 2})},
                           p3r);
    Value dot = contract({u, m}, {B, H, N, Nk},
                         {map(5, {0, 2, 4}), map(5, {0, 1, 3, 4}),
                          map(5, {0, 1, 2, 3})},
                         p4r);
    all4 = map(4, {0, 1, 2, 3});
    row4 = map(4, {0, 1, 2});
    Value priorLse = minEntropy ? Value() : priorLogSumExp();
    Value z = logits(dot, norm2, priorLse);
    // 2. G: one softmax per row over (h, j).
    Value G = mixingWeights(z);
    // 3. The softmax backward and the contractions.
    auto [dz, mix] = logitGrad(G);
    Value de = eGrad(mix);
    Value invS2 = f32Const(rw, loc, 1.0 / sigma2);
    // d_u[b,i,d] = Σ_{h,j} dz[b,h,i,j] m[b,h,j,d] / σ²
    Value du = contract({dz, m}, {B, N, D},
                        {map(5, {0, 3, 1, 4}), map(5, {0, 3, 4, 2}),
                         map(5, {0, 1, 2})},
                        p3rr);
    du = scaled(du, invS2, {B, N, D});
    Value dm = headMeanGrad(dz, m, invS2);
    // d_v[b,h,j,c] = Σ_d dm[b,h,j,d] wo[d, h·Dh + c]
    Value dv = contract({dm, wo3}, {B, H, Nk, Dh},
                        {map(5, {0, 1, 2, 4}), map(5, {4, 1, 3}),
                         map(5, {0, 1, 2, 3})},
                        p4r);
    // d_wo[d, h·Dh + c] = Σ_{b,j} dm[b,h,j,d] v[b,h,j,c]
    Value dwo3 = contract({dm, v}, {D, H, Dh},
                          {map(5, {3, 1, 4, 0}), map(5, {3, 1, 4, 2}),
                           map(5, {0, 1, 2})},
                          p3rr);
    Value dwo = tensor::CollapseShapeOp::create(
        rw, loc, dwo3, ArrayRef<ReassociationIndices>{{0}, {1, 2}});
    Value ds = minEntropy ? dz : scoresGradWithPrior(dz, priorLse);
    return {ds, du, dv, dwo, de};
  }

private:
  /// The sizes, the zero and the head scale c (head_scale, or H).
  void readSizes() {
    auto size = [&](Value t, int64_t d) {
      return tensor::getMixedSize(rw, loc, t, d);
    };
    B = size(scores, 0);
    H = size(scores, 1);
    N = size(scores, 2);
    Nk = size(scores, 3);
    D = size(u, 2);
    Dh = size(v, 3);
    K = size(e, 2);
    float sigma = op.getSigma().convertToFloat();
    sigma2 = sigma * sigma;
    zero = f32Const(rw, loc, 0.0);
    if (std::optional<double> s = op.getEffectiveHeadScale())
      scale = f32Const(rw, loc, *s);
    else
      scale = arith::SIToFPOp::create(
          rw, loc, f32,
          arith::IndexCastOp::create(rw, loc, rw.getI64Type(),
                                     getValueOrCreateConstantIndexOp(rw, loc, H)));
  }

  AffineMap map(unsigned n, ArrayRef<unsigned> dims) {
    return dimsMap(ctx, n, dims);
  }
  Value zeros(ArrayRef<OpFoldResult> shape) {
    return filled(rw, loc, shape, zero);
  }
  /// Σ of the products of `ins` into zeros of `shape` (mulAddBody).
  Value contract(ValueRange ins, ArrayRef<OpFoldResult> shape,
                 ArrayRef<AffineMap> maps,
                 ArrayRef<utils::IteratorType> it) {
    return generic(rw, loc, ins, zeros(shape), maps, it, mulAddBody).front();
  }
  /// Σ of `in` into zeros of `shape` (addBody).
  Value sumInto(Value in, ArrayRef<OpFoldResult> shape,
                ArrayRef<AffineMap> maps, ArrayRef<utils::IteratorType> it) {
    return generic(rw, loc, ValueRange{in}, zeros(shape), maps, it, addBody)
        .front();
  }
  /// body of `ins` (read through `inMaps`) at each point of `shape`.
  Value elementwise(ValueRange ins, ArrayRef<AffineMap> inMaps,
                    ArrayRef<OpFoldResult> shape, GenericBody body) {
    SmallVector<AffineMap> maps(inMaps);
    maps.push_back(map(shape.size(), llvm::to_vector(llvm::seq<unsigned>(
                                         0, shape.size()))));
    SmallVector<utils::IteratorType> it(shape.size(), kPar);
    Value init = tensor::EmptyOp::create(rw, loc, shape, f32);
    return generic(rw, loc, ins, init, maps, it, body).front();
  }
  /// x · factor.
  Value scaled(Value x, Value factor, ArrayRef<OpFoldResult> shape) {
    SmallVector<unsigned> dims =
        llvm::to_vector(llvm::seq<unsigned>(0, shape.size()));
    return elementwise(x, {map(shape.size(), dims)}, shape,
                       [&](OpBuilder &gb, Location gl, ValueRange a) {
                         return SmallVector<Value>{
                             arith::MulFOp::create(gb, gl, a[0], factor)};
                       });
  }

  /// The max of x over the reduced dimensions and Σ exp(x − max) (a
  /// softmax's normalizer): x read through `xMap`, the results of `shape`
  /// through `outMap`.
  std::pair<Value, Value> maxAndSumExp(Value x, AffineMap xMap,
                                       ArrayRef<OpFoldResult> shape,
                                       AffineMap outMap,
                                       ArrayRef<utils::IteratorType> it) {
    Value mx = generic(rw, loc, x, filled(rw, loc, shape, negInf(rw, loc)),
                       {xMap, outMap}, it,
                       [](OpBuilder &gb, Location gl, ValueRange a) {
                         return SmallVector<Value>{
                             arith::MaximumFOp::create(gb, gl, a[1], a[0])};
                       })
                   .front();
    Value sum = generic(rw, loc, ValueRange{x, mx}, zeros(shape),
                        {xMap, outMap, outMap}, it,
                        [](OpBuilder &gb, Location gl, ValueRange a) {
                          Value t = math::ExpOp::create(
                              gb, gl,
                              arith::SubFOp::create(gb, gl, a[0], a[1]));
                          return SmallVector<Value>{
                              arith::AddFOp::create(gb, gl, a[2], t)};
                        })
                    .front();
    return {mx, sum};
  }

  /// m [B, H, Nk, D] = c · v W_h^T (wo viewed as `wo3` [D, H, Dh]).
  Value headMeans(Value wo3) {
    Value m = contract({v, wo3}, {B, H, Nk, D},
                       {map(5, {0, 1, 2, 4}), map(5, {3, 1, 4}),
                        map(5, {0, 1, 2, 3})},
                       p4r);
    return elementwise(m, {map(4, {0, 1, 2, 3})}, {B, H, Nk, D},
                       [&](OpBuilder &gb, Location gl, ValueRange a) {
                         return SmallVector<Value>{
                             arith::MulFOp::create(gb, gl, scale, a[0])};
                       });
  }

  /// The log prior's normalizer (all): lse_j scores[b,h,i,:].
  Value priorLogSumExp() {
    auto [pmax, psum] = maxAndSumExp(scores, all4, {B, H, N}, row4, p3r);
    return elementwise(
        ValueRange{pmax, psum}, {map(3, {0, 1, 2}), map(3, {0, 1, 2})},
        {B, H, N}, [](OpBuilder &gb, Location gl, ValueRange a) {
          return SmallVector<Value>{arith::AddFOp::create(
              gb, gl, a[0], math::LogOp::create(gb, gl, a[1]))};
        });
  }

  /// z [B, H, N, Nk] = s + (<u_i, m_j> - |m_j|²/2) / σ², -inf where masked
  /// and (min_entropy) on the heads other than h*; minus the log prior's
  /// normalizer `priorLse` (all).
  Value logits(Value dot, Value norm2, Value priorLse) {
    SmallVector<Value> zIns = {scores, dot, norm2};
    SmallVector<AffineMap> zMaps = {all4, all4, map(4, {0, 1, 3})};
    if (minEntropy) {
      zIns.push_back(head);
      zMaps.push_back(map(4, {0}));
    } else {
      zIns.push_back(priorLse);
      zMaps.push_back(row4);
    }
    return elementwise(
        zIns, zMaps, {B, H, N, Nk},
        [&](OpBuilder &gb, Location gl, ValueRange a) {
          Value s = a[0];
          Value s2 = f32Const(gb, gl, sigma2);
          Value half =
              arith::MulFOp::create(gb, gl, f32Const(gb, gl, 0.5), a[2]);
          Value gauss = arith::DivFOp::create(
              gb, gl, arith::SubFOp::create(gb, gl, a[1], half), s2);
          Value excluded = arith::CmpFOp::create(
              gb, gl, arith::CmpFPredicate::OEQ, s, negInf(gb, gl));
          Value t = s;
          if (minEntropy) {
            Value h = indexTo(gb, gl, loopIndex(gb, gl, 1), a[3].getType());
            Value other = arith::CmpIOp::create(
                gb, gl, arith::CmpIPredicate::ne, h, a[3]);
            excluded = arith::OrIOp::create(gb, gl, excluded, other);
          } else {
            t = arith::SubFOp::create(gb, gl, s, a[3]);
          }
          Value logit = arith::AddFOp::create(gb, gl, t, gauss);
          return SmallVector<Value>{arith::SelectOp::create(
              gb, gl, excluded, negInf(gb, gl), logit)};
        });
  }

  /// G [B, H, N, Nk]: one softmax of z per row over the pairs (h, j), 0 for
  /// a row of -inf.
  Value mixingWeights(Value z) {
    AffineMap zRow = map(4, {0, 2, 1, 3}), bi4 = map(4, {0, 1});
    auto [rowMax, rowSum] = maxAndSumExp(z, zRow, {B, N}, bi4, p2rr);
    bRow = map(4, {0, 2});
    return elementwise(
        ValueRange{z, rowMax, rowSum}, {all4, bRow, bRow}, {B, H, N, Nk},
        [](OpBuilder &gb, Location gl, ValueRange a) {
          Value none = arith::CmpFOp::create(gb, gl, arith::CmpFPredicate::OEQ,
                                             a[1], negInf(gb, gl));
          Value w = arith::DivFOp::create(
              gb, gl,
              math::ExpOp::create(gb, gl,
                                  arith::SubFOp::create(gb, gl, a[0], a[1])),
              a[2]);
          return SmallVector<Value>{
              arith::SelectOp::create(gb, gl, none, f32Const(gb, gl, 0.0), w)};
        });
  }

  /// dz = G (g - delta) with g[b,i,j] = <dp_i, e_j> (a non-finite e entry
  /// enters as 0), mix = Σ_h G and delta = <mix, g>; returns {dz, mix}.
  std::pair<Value, Value> logitGrad(Value G) {
    AffineMap all3 = map(3, {0, 1, 2});
    Value finite = elementwise(
        e, {all3}, {B, Nk, K}, [](OpBuilder &gb, Location gl, ValueRange a) {
          return SmallVector<Value>{whereFinite(gb, gl, a[0], a[0])};
        });
    Value g = contract({dp, finite}, {B, N, Nk},
                       {map(4, {0, 1, 3}), map(4, {0, 2, 3}), map(4, {0, 1, 2})},
                       p3r);
    Value mix = sumInto(G, {B, N, Nk}, {map(4, {0, 3, 1, 2}), map(4, {0, 1, 2})},
                        p3r);
    Value delta = contract({mix, g}, {B, N}, {all3, all3, map(3, {0, 1})},
                           {kPar, kPar, kRed});
    Value dz = elementwise(
        ValueRange{G, g, delta}, {all4, map(4, {0, 2, 3}), bRow},
        {B, H, N, Nk}, [](OpBuilder &gb, Location gl, ValueRange a) {
          return SmallVector<Value>{arith::MulFOp::create(
              gb, gl, a[0], arith::SubFOp::create(gb, gl, a[1], a[2]))};
        });
    return {dz, mix};
  }

  /// d_e[b,j,k] = Σ_i mix[b,i,j] dp[b,i,k], 0 at a non-finite e entry.
  Value eGrad(Value mix) {
    AffineMap all3 = map(3, {0, 1, 2});
    Value de = contract({mix, dp}, {B, Nk, K},
                        {map(4, {0, 3, 1}), map(4, {0, 3, 2}), map(4, {0, 1, 2})},
                        p3r);
    return elementwise(ValueRange{de, e}, {all3, all3}, {B, Nk, K},
                       [](OpBuilder &gb, Location gl, ValueRange a) {
                         return SmallVector<Value>{
                             whereFinite(gb, gl, a[1], a[0])};
                       });
  }

  /// dm = c (Σ_i dz u_i − (Σ_i dz) m) / σ² (c folded in for d_v and d_wo).
  Value headMeanGrad(Value dz, Value m, Value invS2) {
    Value dzU = contract({dz, u}, {B, H, Nk, D},
                         {map(5, {0, 1, 4, 2}), map(5, {0, 4, 3}),
                          map(5, {0, 1, 2, 3})},
                         p4r);
    Value r = sumInto(dz, {B, H, Nk}, {map(4, {0, 1, 3, 2}), map(4, {0, 1, 2})},
                      p3r);
    Value cOverS2 = arith::MulFOp::create(rw, loc, scale, invS2);
    return elementwise(
        ValueRange{dzU, r, m}, {all4, row4, all4}, {B, H, Nk, D},
        [&](OpBuilder &gb, Location gl, ValueRange a) {
          Value t = arith::SubFOp::create(
              gb, gl, a[0], arith::MulFOp::create(gb, gl, a[1], a[2]));
          return SmallVector<Value>{arith::MulFOp::create(gb, gl, t, cOverS2)};
        });
  }

  /// d_scores of head_select = all: dz − softmax_j(scores) · Σ_j dz (the log
  /// prior).
  Value scoresGradWithPrior(Value dz, Value priorLse) {
    Value rowDz = sumInto(dz, {B, H, N}, {all4, row4}, p3r);
    return elementwise(
        ValueRange{dz, scores, priorLse, rowDz}, {all4, all4, row4, row4},
        {B, H, N, Nk}, [](OpBuilder &gb, Location gl, ValueRange a) {
          Value masked = arith::CmpFOp::create(
              gb, gl, arith::CmpFPredicate::OEQ, a[1], negInf(gb, gl));
          Value prior = math::ExpOp::create(
              gb, gl, arith::SubFOp::create(gb, gl, a[1], a[2]));
          prior = arith::SelectOp::create(gb, gl, masked,
                                          f32Const(gb, gl, 0.0), prior);
          return SmallVector<Value>{arith::SubFOp::create(
              gb, gl, a[0], arith::MulFOp::create(gb, gl, prior, a[3]))};
        });
  }

  PatternRewriter &rw;
  Location loc;
  MLIRContext *ctx;
  Type f32;
  AttentionPosteriorGradOp op;
  bool minEntropy;
  Value scores, u, v, wo, e, dp, head;
  OpFoldResult B, H, N, Nk, D, Dh, K;
  float sigma2 = 0;
  Value zero, scale;
  AffineMap all4, row4, bRow;
  const SmallVector<utils::IteratorType> p3r = {kPar, kPar, kPar, kRed},
                                         p4r = {kPar, kPar, kPar, kPar, kRed},
                                         p3rr = {kPar, kPar, kPar, kRed, kRed},
                                         p2rr = {kPar, kPar, kRed, kRed};
};

} // namespace

LogicalResult
linalg_lowering::lowerAttentionPosteriorGrad(AttentionPosteriorGradOp op,
                                             PatternRewriter &rw) {
  PosteriorGradLowering lowering(rw, op);
  if (failed(lowering.checkHead()))
    return rw.notifyMatchFailure(op, "needs an enclosing module to declare "
                                     "moeReportIndexError");
  SmallVector<Value> results = lowering.gradients();
  replaceWithCasts(rw, op, results);
  return success();
}
