//===- ScoreRegion.cpp - Inline and differentiate a score region ---------===//
//
// Part of the MoE-MLIR project.
//
// The derivative is forward mode: one walk over the block computes, next to
// each value v, dv/dx (null where it is 0: constants, and what depends on
// constants only), with the rules of PyTorch's autograd formulas where a
// choice exists (maximumf/minimumf split the derivative at a tie, as
// torch.maximum; absf gives sign(x) with sign(0) = 0, as torch.abs), so that
// the backward kernel agrees with autograd of the torch function the region
// was traced from. One departure: the product and quotient rules treat an
// exact zero factor as a strong zero (0·inf = 0), so that an expanded
// torch.sigmoid (1 / (1 + exp(-x))) has derivative 0 at -inf as torch.sigmoid
// does, where autograd of the expansion would give NaN.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/ScoreRegion.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/IRMapping.h"

#include <cmath>

using namespace mlir;
using namespace mlir::moe::kernels;

namespace {

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;

/// The block's ops emitted on x's type, with the derivatives when `derive`.
class ScoreEmitter {
public:
  ScoreEmitter(KernelBuilder &kb, Value x, bool derive)
      : kb(kb), type(x.getType()), derive(derive) {}

  std::pair<Value, Value> run(Block &body, Value x) {
    values.map(body.getArgument(0), x);
    if (derive) {
      one = kb.constLike(type, 1.0);
      derivs[x] = one;
    }
    for (Operation &op : body.without_terminator())
      emit(op);
    Value result = values.lookup(body.getTerminator()->getOperand(0));
    Value d = derive ? orZero(deriv(result)) : Value();
    return {result, d};
  }

private:
  KernelBuilder &kb;
  Type type;
  bool derive;
  IRMapping values;
  DenseMap<Value, Value> derivs;
  /// dx/dx: multiplying by it is left out.
  Value one;

  Value c(double v) { return kb.constLike(type, v); }
  Value deriv(Value v) { return derivs.lookup(v); }
  Value orZero(Value d) { return d ? d : c(0.0); }
  /// d·v, with a null (zero) derivative staying null. A product-rule term
  /// with an exact zero factor is zero even when the other factor is
  /// infinite: 1 / (1 + exp(-x)) at x = -inf has q = 0 and d(1 + exp(-x)) =
  /// -inf, and its derivative is the limit 0 (torch.sigmoid's), not 0·inf.
  Value scaled(Value d, Value v) {
    if (!d || d == one)
      return d ? v : Value();
    Value zero = c(0.0);
    Value either = kb.orI(kb.cmpf(arith::CmpFPredicate::OEQ, d, zero),
                          kb.cmpf(arith::CmpFPredicate::OEQ, v, zero));
    return kb.select(either, zero, kb.fmul(d, v));
  }
  Value sum(Value a, Value b) { return !a ? b : !b ? a : kb.fadd(a, b); }
  /// The chain rule's d·g for a unary op's local derivative g.
  Value chain(Value d, Value g) { return d == one ? g : kb.fmul(d, g); }
  Value diff(Value a, Value b) {
    return !b ? a : !a ? kb.fsub(c(0.0), b) : kb.fsub(a, b);
  }

  void emit(Operation &op) {
    if (auto cst = dyn_cast<arith::ConstantOp>(op)) {
      double v = cast<FloatAttr>(cst.getValue()).getValueAsDouble();
      values.map(cst.getResult(), c(v));
      return;
    }
    SmallVector<Value> in;
    for (Value operand : op.getOperands())
      in.push_back(values.lookup(operand));
    Value r;
    if (isa<math::ExpOp>(op)) {
      r = kb.exp(in[0]);
    } else {
      Operation *clone = kb.b.clone(op, values);
      for (OpResult res : clone->getResults())
        res.setType(KernelBuilder::shapedLike(type, res.getType()));
      r = clone->getResult(0);
    }
    values.map(op.getResult(0), r);
    if (derive)
      if (Value d = derivative(op, in, r))
        derivs[r] = d;
  }

  /// dr/dx of r = op(in), or null for 0.
  Value derivative(Operation &op, ArrayRef<Value> in, Value r) {
    SmallVector<Value> d;
    for (Value v : in)
      d.push_back(deriv(v));
    if (isa<arith::CmpFOp>(op))
      return Value();
    if (isa<arith::AddFOp>(op))
      return sum(d[0], d[1]);
    if (isa<arith::SubFOp>(op))
      return diff(d[0], d[1]);
    if (isa<arith::NegFOp>(op))
      return d[0] ? kb.fsub(c(0.0), d[0]) : Value();
    if (isa<arith::MulFOp>(op))
      return sum(scaled(d[0], in[1]), scaled(d[1], in[0]));
    if (isa<arith::DivFOp>(op)) {
      // d(a/b) = (da - (a/b) db) / b.
      Value num = diff(d[0], scaled(d[1], r));
      return num ? kb.fdiv(num, in[1]) : Value();
    }
    if (isa<arith::MaximumFOp, arith::MinimumFOp>(op)) {
      if (!d[0] && !d[1])
        return Value();
      // The operand that wins takes the derivative; a tie splits it (as
      // torch.maximum/minimum's backward).
      bool isMax = isa<arith::MaximumFOp>(op);
      Value da = orZero(d[0]), db = orZero(d[1]);
      Value first =
          kb.cmpf(isMax ? arith::CmpFPredicate::OGT : arith::CmpFPredicate::OLT,
                  in[0], in[1]);
      Value second =
          kb.cmpf(isMax ? arith::CmpFPredicate::OLT : arith::CmpFPredicate::OGT,
                  in[0], in[1]);
      Value half = kb.fmul(kb.fadd(da, db), c(0.5));
      return kb.select(first, da, kb.select(second, db, half));
    }
    if (isa<arith::SelectOp>(op)) {
      if (!d[1] && !d[2])
        return Value();
      return kb.select(in[0], orZero(d[1]), orZero(d[2]));
    }
    if (!d[0] && !isa<math::PowFOp>(op))
      return Value();
    if (isa<math::ExpOp>(op))
      return chain(d[0], r);
    if (isa<math::Exp2Op>(op))
      return chain(d[0], kb.fmul(r, c(kLn2)));
    if (isa<math::LogOp>(op))
      return kb.fdiv(d[0], in[0]);
    if (isa<math::Log1pOp>(op))
      return kb.fdiv(d[0], kb.fadd(in[0], c(1.0)));
    if (isa<math::SqrtOp>(op))
      return kb.fdiv(d[0], kb.fmul(r, c(2.0)));
    if (isa<math::RsqrtOp>(op)) // -r³/2
      return chain(d[0], kb.fmul(kb.fmul(r, kb.fmul(r, r)), c(-0.5)));
    if (isa<math::TanhOp>(op))
      return chain(d[0], kb.fsub(c(1.0), kb.fmul(r, r)));
    if (isa<math::AbsFOp>(op)) {
      Value sign =
          kb.select(kb.cmpf(arith::CmpFPredicate::OGT, in[0], c(0.0)), c(1.0),
                    kb.select(kb.cmpf(arith::CmpFPredicate::OLT, in[0], c(0.0)),
                              c(-1.0), c(0.0)));
      return chain(d[0], sign);
    }
    if (isa<math::ErfOp>(op)) {
      Value g = kb.exp(kb.fsub(c(0.0), kb.fmul(in[0], in[0])));
      return chain(d[0], kb.fmul(g, c(kTwoOverSqrtPi)));
    }
    if (isa<math::PowFOp>(op)) {
      // d(a^b) = b a^(b-1) da + a^b log(a) db (the second term only where
      // the exponent depends on x: a constant exponent keeps a < 0 finite).
      Value term;
      if (d[0]) {
        Value lower = math::PowFOp::create(kb.b, in[0], kb.fsub(in[1], c(1.0)));
        term = chain(d[0], kb.fmul(in[1], lower));
      }
      if (d[1])
        term = sum(term,
                   chain(d[1], kb.fmul(r, math::LogOp::create(kb.b, in[0]))));
      return term;
    }
    llvm_unreachable("score region: an op the verifier rejects");
  }
};

} // namespace

Value mlir::moe::kernels::emitScoreBody(KernelBuilder &kb, Block &body,
                                        Value x) {
  return ScoreEmitter(kb, x, /*derive=*/false).run(body, x).first;
}

std::pair<Value, Value>
mlir::moe::kernels::emitScoreAndDerivative(KernelBuilder &kb, Block &body,
                                           Value x) {
  return ScoreEmitter(kb, x, /*derive=*/true).run(body, x);
}
