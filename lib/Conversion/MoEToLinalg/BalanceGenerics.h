//===- BalanceGenerics.h - Generics of the balance-op lowerings -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The portable lowerings of the load-balancing ops (RouterStats.cpp,
// RouterZLoss.cpp, SequenceBalanceLoss.cpp) are chains of linalg.generic ops
// over a small iteration space whose bodies are the shared formulas of
// MoE/Kernels/Balance.h (built with a KernelBuilder inside the body): this
// helper names the maps of that space and builds one generic per call.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOLINALG_BALANCEGENERICS_H
#define MOE_LIB_CONVERSION_MOETOLINALG_BALANCEGENERICS_H

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/Kernels/Builder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

namespace mlir::moe::linalg_lowering {

/// Generics over an iteration space of `rank` dimensions.
class BalanceGenerics {
public:
  using Body = std::function<Value(kernels::KernelBuilder &, ValueRange)>;

  BalanceGenerics(PatternRewriter &rw, Location loc, unsigned rank)
      : rw(rw), loc(loc), rank(rank) {}

  /// The map of an operand indexed by the dimensions `dims` of the space.
  AffineMap map(ArrayRef<unsigned> dims) const {
    return dimsMap(rw.getContext(), rank, dims);
  }
  /// A new f32 tensor of `sizes` filled with `value`.
  Value fill(ArrayRef<OpFoldResult> sizes, double value) {
    return filled(rw, loc, sizes, f32Const(rw, loc, value));
  }
  /// The generic `out = body(ins..., out)`: dimensions in `reduced` are
  /// reductions, the others parallel; `maps` has one map per input and the
  /// output's last.
  Value run(ValueRange ins, Value init, ArrayRef<AffineMap> maps,
            ArrayRef<unsigned> reduced, const Body &body) {
    SmallVector<utils::IteratorType> it(rank, kPar);
    for (unsigned d : reduced)
      it[d] = kRed;
    return generic(rw, loc, ins, init, maps, it,
                   [&](OpBuilder &gb, Location gl, ValueRange a) {
                     ImplicitLocOpBuilder ib(gl, gb);
                     kernels::KernelBuilder kb(ib);
                     return SmallVector<Value>{body(kb, a)};
                   })
        .front();
  }

private:
  PatternRewriter &rw;
  Location loc;
  unsigned rank;
};

/// The row statistics of logits `x` ([T, E] f32, RouterStats.cpp): the
/// online-softmax state {max, Σ exp(x - max)} (max read as 0 in the sum for a
/// row of -inf, as kernels::onlineSoftmaxStep) and the shift of
/// p = exp(x - shift) (kernels::balanceProbShift), each [T].
struct RowSoftmax {
  Value max, sum, shift;
};
RowSoftmax rowSoftmax(PatternRewriter &rw, Location loc, Value x);

/// f(x) of the f32 scalar `x` (rank 0), as a rank-0 generic.
inline Value
scalarGeneric(PatternRewriter &rw, Location loc, Value x,
              function_ref<Value(kernels::KernelBuilder &, Value)> f) {
  BalanceGenerics g0(rw, loc, 0);
  return g0.run(
      {x}, g0.fill({}, 0.0), {g0.map({}), g0.map({})}, {},
      [&](kernels::KernelBuilder &kb, ValueRange a) { return f(kb, a[0]); });
}

/// Dimension `d` of tensor `t` (a count: T, E, B, S or k) as an f32 scalar.
inline Value dimF32(PatternRewriter &rw, Location loc, Value t, int64_t d) {
  return arith::SIToFPOp::create(
      rw, loc, rw.getF32Type(),
      arith::IndexCastOp::create(rw, loc, rw.getI64Type(),
                                 tensor::DimOp::create(rw, loc, t, d)));
}

} // namespace mlir::moe::linalg_lowering

#endif // MOE_LIB_CONVERSION_MOETOLINALG_BALANCEGENERICS_H
