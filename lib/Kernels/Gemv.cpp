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

SmallVector<Value> mlir::moe::kernels::gemvRowsDot(KernelBuilder &kb,
                                                   const GemvLayout &layout,
                                                   Value m,
                                                   ArrayRef<Value> rows,
                                                   Value x, Value cols) {
  Value c0 = kb.idx(0), c1 = kb.idx(1), span = kb.idx(layout.span);
  int64_t n = rows.size();
  Value full = kb.divu(cols, span);
  Value tail = kb.sub(cols, kb.mul(full, span));
  Value zeros = kb.constLike(layout.share, 0.0);
  // Each row's share of m[row, chunk] · x[chunk] added to its accumulator in
  // `acc` (row-major: row q's are acc[q*U, (q+1)*U)); x's chunk is loaded
  // once for all rows.
  auto chunk = [&](Value col, Value count, ArrayRef<Value> acc, int64_t u,
                   int64_t stride, SmallVector<Value> &next) {
    SmallVector<Value> mv;
    for (Value row : rows)
      mv.push_back(layout.load(m, {row, col}, count));
    Value xv = layout.load(x, {col}, count);
    for (int64_t q = 0; q < n; ++q)
      next[q * stride + u] = kb.fma(mv[q], xv, acc[q * stride + u]);
  };
  constexpr int64_t U = kAccumulators;
  Value fullU = kb.mul(kb.divu(full, kb.idx(U)), kb.idx(U));
  SmallVector<Value> init(n * U, zeros);
  SmallVector<Value> acc = kb.forLoop(
      c0, fullU, kb.idx(U), init,
      [&](Value c, ValueRange a) -> SmallVector<Value> {
        SmallVector<Value> next(a.begin(), a.end()), prev(next);
        for (int64_t u = 0; u < U; ++u)
          chunk(kb.mul(kb.add(c, kb.idx(u)), span), Value(), prev, u, U, next);
        return next;
      });
  // The remaining whole chunks and the tail into accumulator 0 of each row.
  SmallVector<Value> first;
  for (int64_t q = 0; q < n; ++q)
    first.push_back(acc[q * U]);
  first = kb.forLoop(fullU, full, c1, first,
                    [&](Value c, ValueRange a) -> SmallVector<Value> {
                      SmallVector<Value> next(a.begin(), a.end()), prev(next);
                      chunk(kb.mul(c, span), Value(), prev, 0, 1, next);
                      return next;
                    });
  // The tail chunk always runs (an empty one adds 0 · 0): no branch.
  SmallVector<Value> last(first);
  chunk(kb.mul(full, span), tail, first, 0, 1, last);
  SmallVector<Value> dots;
  for (int64_t q = 0; q < n; ++q) {
    Value share = kb.fadd(kb.fadd(last[q], acc[q * U + 1]),
                         kb.fadd(acc[q * U + 2], acc[q * U + 3]));
    dots.push_back(layout.reduce(share));
  }
  return dots;
}

Value mlir::moe::kernels::gemvRowDot(KernelBuilder &kb, const GemvLayout &layout,
                                     Value m, Value row, Value x, Value cols) {
  return gemvRowsDot(kb, layout, m, row, x, cols)[0];
}

Value mlir::moe::kernels::gemvEpilogue(KernelBuilder &kb, Value dot, Value bias,
                                       bool relu) {
  Value v = kb.fadd(dot, bias);
  return relu ? kb.fmax(v, kb.cF32(0.0)) : v;
}

SmallVector<Value> mlir::moe::kernels::gemvRows(KernelBuilder &kb,
                                                const GemvLayout &layout,
                                                Value m, ArrayRef<Value> rows,
                                                Value x, Value cols,
                                                Value biasVec, bool relu) {
  SmallVector<Value> out = gemvRowsDot(kb, layout, m, rows, x, cols);
  for (auto [v, row] : llvm::zip(out, rows))
    v = gemvEpilogue(kb, v, kb.loadF(biasVec, {row}), relu);
  return out;
}

HyperSlot mlir::moe::kernels::hyperSlot(KernelBuilder &kb, Value row,
                                        Value depth) {
  Value width = kb.add(depth, kb.idx(1));
  Value expert = kb.divu(row, width);
  Value column = kb.remu(row, width);
  return {expert, column, kb.eq(column, depth)};
}

LayerGradStep mlir::moe::kernels::layerGradStep(KernelBuilder &kb, Value g,
                                                Value w, Value x,
                                                Value partial) {
  Value dm = x ? kb.fmul(g, x) : Value();
  return {dm, kb.fma(g, w, partial)};
}

Value mlir::moe::kernels::reluGrad(KernelBuilder &kb, Value h, Value dh) {
  Value open =
      kb.cmpf(arith::CmpFPredicate::UGT, h, kb.constLike(h.getType(), 0.0));
  return kb.select(open, dh, kb.constLike(dh.getType(), 0.0));
}
