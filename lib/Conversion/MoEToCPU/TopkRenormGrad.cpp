//===- TopkRenormGrad.cpp - moe.topk_renorm_grad -> CPU kernel ------------===//
//
// Part of the MoE-MLIR project.
//
// Rows are independent: blocks of 32 rows go to the workers. Per row (O(K)):
// the selected values are read through the forward's indices, the weights
// recomputed with the forward's formula (kernels::topkWeight), c = Σ dw·w, and
// the gradient written: zeros (or -s_j c for every entry of a logits gate
// without renormalization), then kernels::topkWeightGrad at the selected
// entries. An index outside [0, K) is read clamped and never written.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;
using namespace mlir::moe::kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;

struct TopkRenormGradKernel
    : KernelPattern<TopkRenormGradOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(TopkRenormGradOp op, CK &k,
                     PatternRewriter &rw) const override {
    if (cast<RankedTensorType>(op.getScores().getType()).getRank() < 2)
      return rw.notifyMatchFailure(op, "rank-1 scores: portable lowering");
    if (hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    KernelScope kernel(
        k, {op.getScores(), op.getIndices(), op.getDw()},
        KernelScope::outsOf(op, {k.sizes(op.getScores())}));
    Value scores = k.buffer(op.getScores());
    Value out = kernel.out(0);
    Value s2 = collapseRows(k, scores), o2 = collapseRows(k, out);
    Value i2 = collapseRows(k, k.buffer(op.getIndices()));
    Value g2 = collapseRows(k, k.buffer(op.getDw()));
    Value rows = k.dim(s2, 0), numExperts = k.dim(s2, 1), sel = k.dim(i2, 1);

    TopkSpec spec;
    spec.logits = op.getMode() == TopkMode::logits;
    spec.renormalize = op.getRenormalize();
    Value c1 = k.idx(1);
    Value items = k.ceilDiv(rows, k.idx(kRowsPerItem));
    k.workers(opts, items, [&](Value item, Value) {
      Value r0 = k.mul(item, k.idx(kRowsPerItem));
      Value r1 = k.mins(k.add(r0, k.idx(kRowsPerItem)), rows);
      k.forLoop(r0, r1, c1, [&](Value r) {
        emitRow(k, spec, r, s2, i2, g2, o2, numExperts, sel);
      });
    });
    kernel.replace(rw, op);
    return success();
  }

  static void emitRow(CK &k, const TopkSpec &spec, Value r, Value s2, Value i2,
                      Value g2, Value o2, Value numExperts, Value sel) {
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
};
} // namespace

void mlir::moe::cpu::populateTopkRenormGradKernel(RewritePatternSet &p,
                                                  const KernelOptions &o) {
  p.add<TopkRenormGradKernel>(p.getContext(), o);
}
