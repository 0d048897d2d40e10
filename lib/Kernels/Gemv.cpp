//===- Gemv.cpp - The hypernetwork's matrix-vector products, once ---------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Gemv.h"

using namespace mlir;
using namespace mlir::moe::kernels;

/// Accumulators of a holder (Gemv.h).
static constexpr int64_t kAccumulators = 4;

Value mlir::moe::kernels::gemvRowDot(KernelBuilder &k, const GemvLayout &layout,
                                     Value m, Value row, Value x, Value cols) {
  Value c0 = k.idx(0), c1 = k.idx(1), span = k.idx(layout.span);
  Value full = k.divu(cols, span);
  Value tail = k.sub(cols, k.mul(full, span));
  Value zeros = k.constLike(layout.share, 0.0);
  // The holder's share of m[row, chunk] · x[chunk] added to `acc`.
  auto chunk = [&](Value col, Value count, Value acc) {
    Value mv = layout.load(m, {row, col}, count);
    Value xv = layout.load(x, {col}, count);
    return k.fma(mv, xv, acc);
  };
  constexpr int64_t U = kAccumulators;
  Value fullU = k.mul(k.divu(full, k.idx(U)), k.idx(U));
  SmallVector<Value> init(U, zeros);
  SmallVector<Value> acc = k.forLoop(
      c0, fullU, k.idx(U), init,
      [&](Value c, ValueRange a) -> SmallVector<Value> {
        SmallVector<Value> next;
        for (int64_t u = 0; u < U; ++u)
          next.push_back(chunk(k.mul(k.add(c, k.idx(u)), span), Value(), a[u]));
        return next;
      });
  Value a0 = k.forLoop(fullU, full, c1, ValueRange{acc[0]},
                       [&](Value c, ValueRange a) -> SmallVector<Value> {
                         return {chunk(k.mul(c, span), Value(), a[0])};
                       })[0];
  // The tail chunk always runs (an empty one adds 0 · 0): no branch.
  a0 = chunk(k.mul(full, span), tail, a0);
  Value share = k.fadd(k.fadd(a0, acc[1]), k.fadd(acc[2], acc[3]));
  return layout.reduce(share);
}

Value mlir::moe::kernels::gemvEpilogue(KernelBuilder &k, Value dot, Value bias,
                                       bool relu) {
  Value v = k.fadd(dot, bias);
  return relu ? k.fmax(v, k.cF32(0.0)) : v;
}

Value mlir::moe::kernels::gemvRow(KernelBuilder &k, const GemvLayout &layout,
                                  Value m, Value row, Value x, Value cols,
                                  Value biasVec, bool relu) {
  Value dot = gemvRowDot(k, layout, m, row, x, cols);
  return gemvEpilogue(k, dot, k.loadF(biasVec, {row}), relu);
}

HyperSlot mlir::moe::kernels::hyperSlot(KernelBuilder &k, Value row,
                                        Value depth) {
  Value width = k.add(depth, k.idx(1));
  Value expert = k.divu(row, width);
  Value column = k.remu(row, width);
  return {expert, column, k.eq(column, depth)};
}

LayerGradStep mlir::moe::kernels::layerGradStep(KernelBuilder &k, Value g,
                                                Value w, Value x,
                                                Value partial) {
  Value dm = x ? k.fmul(g, x) : Value();
  return {dm, k.fma(g, w, partial)};
}

Value mlir::moe::kernels::reluGrad(KernelBuilder &k, Value h, Value dh) {
  Value open =
      k.cmpf(arith::CmpFPredicate::UGT, h, k.constLike(h.getType(), 0.0));
  return k.select(open, dh, k.constLike(dh.getType(), 0.0));
}
