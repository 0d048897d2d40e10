//===- TopK.cpp - The dialect's top-k order and weights, once -------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/TopK.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::kernels;

static constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

Value mlir::moe::kernels::orderedKey(KernelBuilder &kb, Value f,
                                     bool descending) {
  Type t = f.getType();
  Type keyType = KernelBuilder::shapedLike(t, kb.i32());
  // -0 + 0 = +0: equal floats get equal keys.
  Value canon = kb.fadd(f, kb.constLike(t, 0.0));
  Value bits = kb.bitcast(canon, keyType);
  // Negative floats order backwards as integers: flip their magnitude bits.
  Value flipped = kb.xorI(bits, kb.constLike(keyType, kInt32Max));
  Value key = kb.select(kb.lt(bits, kb.constLike(keyType, 0)), flipped, bits);
  // Ascending: ~key reverses the order of the numbers and stays below
  // INT32_MAX (the key of +inf is not INT32_MIN), so NaN stays on top.
  if (!descending)
    key = kb.xorI(key, kb.constLike(keyType, -1));
  return kb.select(kb.isNaN(f), kb.constLike(keyType, kInt32Max), key);
}

Value mlir::moe::kernels::keyToFloat(KernelBuilder &kb, Value key) {
  Type keyType = key.getType();
  Value flipped = kb.xorI(key, kb.constLike(keyType, kInt32Max));
  Value bits = kb.select(kb.lt(key, kb.constLike(keyType, 0)), flipped, key);
  return kb.bitcast(bits, KernelBuilder::shapedLike(keyType, kb.f32()));
}

Value mlir::moe::kernels::packCandidate(KernelBuilder &kb, Value key,
                                        Value index) {
  Type i64t = KernelBuilder::shapedLike(key.getType(), kb.i64());
  Type i32t = KernelBuilder::shapedLike(key.getType(), kb.i32());
  Value hi = kb.shl(kb.castInt(key, i64t), kb.constLike(i64t, 32));
  // Low half INT32_MAX - index (>= 0): a lower index is a larger candidate,
  // and the best candidate stays below INT64_MAX ("no previous pick").
  Value lo =
      kb.extu(kb.sub(kb.constLike(i32t, kInt32Max), kb.castInt(index, i32t)), i64t);
  return kb.orI(hi, lo);
}

Value mlir::moe::kernels::candidateKey(KernelBuilder &kb, Value packed) {
  Type t = packed.getType();
  return kb.trunc(kb.shrs(packed, kb.constLike(t, 32)),
                 KernelBuilder::shapedLike(t, kb.i32()));
}

Value mlir::moe::kernels::candidateIndex(KernelBuilder &kb, Value packed) {
  Type i32t = KernelBuilder::shapedLike(packed.getType(), kb.i32());
  return kb.sub(kb.constLike(i32t, kInt32Max), kb.trunc(packed, i32t));
}

Value mlir::moe::kernels::noCandidate(KernelBuilder &kb, Type type) {
  return kb.constLike(type,
                     static_cast<double>(std::numeric_limits<int64_t>::min()));
}

Value mlir::moe::kernels::candidateBelow(KernelBuilder &kb, Value cand,
                                         Value prev, Value none,
                                         function_ref<Value()> laneMask) {
  Value ok = kb.lt(cand, prev);
  if (laneMask)
    ok = kb.andI(ok, laneMask());
  return kb.select(ok, cand, none);
}

Value mlir::moe::kernels::bestBelow(KernelBuilder &kb, Value best, Value cand,
                                    Value prev, Value none,
                                    function_ref<Value()> laneMask) {
  return kb.maxs(best, candidateBelow(kb, cand, prev, none, laneMask));
}

Value mlir::moe::kernels::emptyListKey(KernelBuilder &kb, Type keyType) {
  return kb.constLike(keyType,
                      static_cast<double>(std::numeric_limits<int32_t>::min()));
}

void mlir::moe::kernels::insertIntoTopList(KernelBuilder &kb, TopList &list,
                                           Value key, Value position) {
  const size_t t = list.keys.size();
  // Strict comparisons against the list before the insertion: an equal key
  // listed earlier has the lower index and stays ahead.
  SmallVector<Value> above(t);
  for (size_t j = 0; j < t; ++j)
    above[j] = kb.cmpi(arith::CmpIPredicate::sgt, key, list.keys[j]);
  for (size_t j = t; j-- > 1;) {
    list.keys[j] = kb.maxs(list.keys[j], kb.mins(key, list.keys[j - 1]));
    list.positions[j] =
        kb.select(above[j - 1], list.positions[j - 1],
                  kb.select(above[j], position, list.positions[j]));
  }
  list.keys[0] = kb.maxs(list.keys[0], key);
  list.positions[0] = kb.select(above[0], position, list.positions[0]);
}

Value mlir::moe::kernels::ranksAfterPick(KernelBuilder &kb, Value key,
                                         Value position, Value prevKey,
                                         Value prevPosition) {
  // One statement per op: nested calls as arguments would build them in the
  // compiler's argument order (GCC and clang differ), and the IR with them.
  Value below = kb.lt(key, prevKey);
  Value same = kb.eq(key, prevKey);
  Value higher = kb.cmpi(arith::CmpIPredicate::sgt, position, prevPosition);
  return kb.orI(below, kb.andI(same, higher));
}

Value mlir::moe::kernels::ranksBefore(KernelBuilder &kb, Value a, Value ai,
                                      Value c, Value ci, bool descending) {
  Value pa = packCandidate(kb, orderedKey(kb, a, descending), ai);
  Value pc = packCandidate(kb, orderedKey(kb, c, descending), ci);
  return kb.cmpi(arith::CmpIPredicate::sgt, pa, pc);
}

Value mlir::moe::kernels::topkSelectionTerm(KernelBuilder &kb,
                                            const TopkSpec &spec, Value v,
                                            Value v0) {
  return spec.logits ? softmaxTerm(kb, v, v0) : v;
}

mlir::moe::kernels::TopkPickState
mlir::moe::kernels::topkPickState(KernelBuilder &kb, const TopkSpec &spec,
                                  Value r, Value v, Value v0Before) {
  Value v0 = kb.select(kb.eq(r, kb.idx(0)), v, v0Before);
  return {v0, topkSelectionTerm(kb, spec, v, v0)};
}

Value mlir::moe::kernels::topkWeight(KernelBuilder &kb, const TopkSpec &spec,
                                     Value v, Value v0, Value selSum,
                                     Value denseMax, Value denseSum) {
  // Softmax over the selected logits (max v0) or over the dense row, read at
  // the selection; a row of -inf yields zeros.
  if (spec.logits && spec.renormalize)
    return softmaxScore(kb, softmaxTerm(kb, v, v0), v0, selSum);
  if (spec.logits)
    return softmaxScore(kb, softmaxTerm(kb, v, denseMax), denseMax, denseSum);
  if (spec.renormalize)
    return kb.divOrZero(v, selSum);
  return v;
}

Value mlir::moe::kernels::topkWeightGrad(KernelBuilder &kb, const TopkSpec &spec,
                                         Value g, Value w, Value c,
                                         Value selSum) {
  if (spec.logits)
    return kb.fmul(w, kb.fsub(g, c));
  if (!spec.renormalize)
    return g;
  return kb.divOrZero(kb.fsub(g, c), selSum);
}

void mlir::moe::kernels::emitTopkGradRow(KernelBuilder &kb, const TopkSpec &spec,
                                       Value r, Value s2, Value i2, Value g2,
                                       Value o2, Value numExperts, Value sel) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value zero = kb.cF32(0.0);
  auto index = [&](Value l) {
    return kb.castInt(kb.load(i2, {r, l}), kb.index());
  };
  auto inRange = [&](Value j) {
    return kb.andI(kb.cmpi(arith::CmpIPredicate::sge, j, c0),
                  kb.cmpi(arith::CmpIPredicate::slt, j, numExperts));
  };
  auto value = [&](Value l) {
    Value j = index(l);
    return kb.loadF(s2, {r, kb.select(inRange(j), j, c0)});
  };
  auto fold = [&](Value n, Value init,
                  function_ref<Value(Value, Value)> step) {
    return kb.forLoop(c0, n, c1, ValueRange{init},
                     [&](Value l, ValueRange acc) -> SmallVector<Value> {
                       return {step(l, acc[0])};
                     })[0];
  };
  Value v0, selSum, denseMax, denseSum;
  if (spec.logits) {
    // The selection's softmax (its max: the indices need not be in order).
    RowSoftmaxStats selStats =
        rowSoftmaxStatsLoop(kb, kb.f32(), c0, sel, c1, value);
    v0 = selStats.max;
    selSum = selStats.sum;
    if (!spec.renormalize) {
      RowSoftmaxStats dense = rowSoftmaxStatsLoop(
          kb, kb.f32(), c0, numExperts, c1,
          [&](Value j) { return kb.loadF(s2, {r, j}); });
      denseMax = dense.max;
      denseSum = dense.sum;
    }
  } else {
    selSum = fold(sel, zero, [&](Value l, Value a) {
      return kb.fadd(a, topkSelectionTerm(kb, spec, value(l), v0));
    });
  }
  auto weight = [&](Value v) {
    return topkWeight(kb, spec, v, v0, selSum, denseMax, denseSum);
  };
  Value c = fold(sel, zero, [&](Value l, Value a) {
    return kb.fadd(a, kb.fmul(kb.load(g2, {r, l}), weight(value(l))));
  });
  // Every entry: -s_j c (logits without renormalization), else 0.
  kb.forLoop(c0, numExperts, c1, [&](Value j) {
    Value base = zero;
    if (spec.logits && !spec.renormalize)
      base = kb.fsub(zero, kb.fmul(weight(kb.loadF(s2, {r, j})), c));
    kb.store(base, o2, {r, j});
  });
  // The selected entries (their -s_j c is part of topkWeightGrad's total).
  kb.forLoop(c0, sel, c1, [&](Value l) {
    Value j = index(l);
    kb.ifThen(inRange(j), [&] {
      Value v = value(l);
      Value d = topkWeightGrad(kb, spec, kb.load(g2, {r, l}), weight(v), c,
                               selSum);
      kb.store(d, o2, {r, j});
    });
  });
}
