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

Value mlir::moe::kernels::orderedKey(KernelBuilder &k, Value f,
                                     bool descending) {
  Type t = f.getType();
  Type keyType = KernelBuilder::shapedLike(t, k.i32());
  // -0 + 0 = +0: equal floats get equal keys.
  Value canon = k.fadd(f, k.constLike(t, 0.0));
  Value bits = k.bitcast(canon, keyType);
  // Negative floats order backwards as integers: flip their magnitude bits.
  Value flipped = k.xorI(bits, k.constLike(keyType, kInt32Max));
  Value key = k.select(k.lt(bits, k.constLike(keyType, 0)), flipped, bits);
  // Ascending: ~key reverses the order of the numbers and stays below
  // INT32_MAX (the key of +inf is not INT32_MIN), so NaN stays on top.
  if (!descending)
    key = k.xorI(key, k.constLike(keyType, -1));
  return k.select(k.isNaN(f), k.constLike(keyType, kInt32Max), key);
}

Value mlir::moe::kernels::keyToFloat(KernelBuilder &k, Value key) {
  Type keyType = key.getType();
  Value flipped = k.xorI(key, k.constLike(keyType, kInt32Max));
  Value bits = k.select(k.lt(key, k.constLike(keyType, 0)), flipped, key);
  return k.bitcast(bits, KernelBuilder::shapedLike(keyType, k.f32()));
}

Value mlir::moe::kernels::packCandidate(KernelBuilder &k, Value key,
                                        Value index) {
  Type i64t = KernelBuilder::shapedLike(key.getType(), k.i64());
  Type i32t = KernelBuilder::shapedLike(key.getType(), k.i32());
  Value hi = k.shl(k.castInt(key, i64t), k.constLike(i64t, 32));
  // Low half INT32_MAX - index (>= 0): a lower index is a larger candidate,
  // and the best candidate stays below INT64_MAX ("no previous pick").
  Value lo =
      k.extu(k.sub(k.constLike(i32t, kInt32Max), k.castInt(index, i32t)), i64t);
  return k.orI(hi, lo);
}

Value mlir::moe::kernels::candidateKey(KernelBuilder &k, Value packed) {
  Type t = packed.getType();
  return k.trunc(k.shrs(packed, k.constLike(t, 32)),
                 KernelBuilder::shapedLike(t, k.i32()));
}

Value mlir::moe::kernels::candidateIndex(KernelBuilder &k, Value packed) {
  Type i32t = KernelBuilder::shapedLike(packed.getType(), k.i32());
  return k.sub(k.constLike(i32t, kInt32Max), k.trunc(packed, i32t));
}

Value mlir::moe::kernels::noCandidate(KernelBuilder &k, Type type) {
  return k.constLike(type,
                     static_cast<double>(std::numeric_limits<int64_t>::min()));
}

Value mlir::moe::kernels::candidateBelow(KernelBuilder &k, Value cand,
                                         Value prev, Value none,
                                         function_ref<Value()> laneMask) {
  Value ok = k.lt(cand, prev);
  if (laneMask)
    ok = k.andI(ok, laneMask());
  return k.select(ok, cand, none);
}

Value mlir::moe::kernels::bestBelow(KernelBuilder &k, Value best, Value cand,
                                    Value prev, Value none,
                                    function_ref<Value()> laneMask) {
  return k.maxs(best, candidateBelow(k, cand, prev, none, laneMask));
}

Value mlir::moe::kernels::ranksBefore(KernelBuilder &k, Value a, Value ai,
                                      Value c, Value ci, bool descending) {
  Value pa = packCandidate(k, orderedKey(k, a, descending), ai);
  Value pc = packCandidate(k, orderedKey(k, c, descending), ci);
  return k.cmpi(arith::CmpIPredicate::sgt, pa, pc);
}

Value mlir::moe::kernels::topkWeight(KernelBuilder &k, const TopkSpec &spec,
                                     Value v, Value v0, Value selSum,
                                     Value denseMax, Value denseSum) {
  Type t = v.getType();
  Value zero = k.constLike(t, 0.0);
  Value negInf = k.negInfLike(t);
  if (spec.logits && spec.renormalize) {
    // Softmax over the selected logits; a row of -inf yields zeros.
    Value w = k.fdiv(k.exp(k.fsub(v, v0)), selSum);
    return k.select(k.cmpf(arith::CmpFPredicate::OEQ, v0, negInf), zero, w);
  }
  if (spec.logits) {
    Value w = k.fdiv(k.exp(k.fsub(v, denseMax)), denseSum);
    return k.select(k.cmpf(arith::CmpFPredicate::OEQ, denseMax, negInf), zero,
                    w);
  }
  if (spec.renormalize) {
    Value w = k.fdiv(v, selSum);
    return k.select(k.cmpf(arith::CmpFPredicate::OEQ, selSum, zero), zero, w);
  }
  return v;
}

Value mlir::moe::kernels::topkWeightGrad(KernelBuilder &k, const TopkSpec &spec,
                                         Value g, Value w, Value c,
                                         Value selSum) {
  if (spec.logits)
    return k.fmul(w, k.fsub(g, c));
  if (!spec.renormalize)
    return g;
  Value zero = k.constLike(g.getType(), 0.0);
  Value d = k.fdiv(k.fsub(g, c), selSum);
  return k.select(k.cmpf(arith::CmpFPredicate::OEQ, selSum, zero), zero, d);
}

void mlir::moe::kernels::emitTopkGradRow(KernelBuilder &k, const TopkSpec &spec,
                                       Value r, Value s2, Value i2, Value g2,
                                       Value o2, Value numExperts, Value sel) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value zero = k.cF32(0.0), negInf = k.negInfLike(k.f32());
  auto index = [&](Value l) {
    return k.castInt(k.load(i2, {r, l}), k.index());
  };
  auto inRange = [&](Value j) {
    return k.andI(k.cmpi(arith::CmpIPredicate::sge, j, c0),
                  k.cmpi(arith::CmpIPredicate::slt, j, numExperts));
  };
  auto value = [&](Value l) {
    Value j = index(l);
    return k.loadF(s2, {r, k.select(inRange(j), j, c0)});
  };
  auto fold = [&](Value n, Value init,
                  function_ref<Value(Value, Value)> step) {
    return k.forLoop(c0, n, c1, ValueRange{init},
                     [&](Value l, ValueRange acc) -> SmallVector<Value> {
                       return {step(l, acc[0])};
                     })[0];
  };
  Value v0, selSum, denseMax, denseSum;
  if (spec.logits) {
    v0 = fold(sel, negInf, [&](Value l, Value m) {
      return k.fmax(m, value(l));
    });
    selSum = fold(sel, zero, [&](Value l, Value a) {
      return k.fadd(a, k.exp(k.fsub(value(l), v0)));
    });
    if (!spec.renormalize) {
      denseMax = fold(numExperts, negInf, [&](Value j, Value m) {
        return k.fmax(m, k.loadF(s2, {r, j}));
      });
      denseSum = fold(numExperts, zero, [&](Value j, Value a) {
        return k.fadd(a, k.exp(k.fsub(k.loadF(s2, {r, j}), denseMax)));
      });
    }
  } else {
    selSum = fold(sel, zero, [&](Value l, Value a) {
      return k.fadd(a, value(l));
    });
  }
  auto weight = [&](Value v) {
    return topkWeight(k, spec, v, v0, selSum, denseMax, denseSum);
  };
  Value c = fold(sel, zero, [&](Value l, Value a) {
    return k.fadd(a, k.fmul(k.load(g2, {r, l}), weight(value(l))));
  });
  // Every entry: -s_j c (logits without renormalization), else 0.
  k.forLoop(c0, numExperts, c1, [&](Value j) {
    Value base = zero;
    if (spec.logits && !spec.renormalize)
      base = k.fsub(zero, k.fmul(weight(k.loadF(s2, {r, j})), c));
    k.store(base, o2, {r, j});
  });
  // The selected entries (their -s_j c is part of topkWeightGrad's total).
  k.forLoop(c0, sel, c1, [&](Value l) {
    Value j = index(l);
    k.ifThen(inRange(j), [&] {
      Value v = value(l);
      Value d = topkWeightGrad(k, spec, k.load(g2, {r, l}), weight(v), c,
                               selSum);
      k.store(d, o2, {r, j});
    });
  });
}
