//===- TopkRenormGrad.cpp - moe.topk_renorm_grad -> linalg ----------------===//
//
// Part of the MoE-MLIR project.
//
// The portable backward of the top-k gate (maths in MoEGradOps.td), as
// linalg.generic ops over the row shape [..., K] (any rank): the selected
// values gathered through the indices (clamped reads), the row reductions of
// the forward (max and sum of the selection, and of the whole row for logits
// without renormalization), the weights and their gradients with the shared
// formulas of MoE/Kernels/TopK.h (kernels::topkWeight, topkWeightGrad, built
// inside the generic bodies), and the scatter to the selected experts as a
// reduction over the selection (an index outside [0, K) matches no expert).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

using utils::IteratorType;

LogicalResult linalg_lowering::lowerTopkRenormGrad(TopkRenormGradOp op,
                                                   PatternRewriter &rw) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  Value scores = promoteToF32(rw, loc, op.getScores());
  Value indices = op.getIndices(), dw = op.getDw();
  unsigned rank = cast<RankedTensorType>(scores.getType()).getRank();
  unsigned lead = rank - 1;
  kernels::TopkSpec spec = kernels::topkSpecOf(op);

  SmallVector<OpFoldResult> rowSizes = sizesOf(rw, loc, scores);
  SmallVector<OpFoldResult> selSizes = sizesOf(rw, loc, indices);
  SmallVector<OpFoldResult> leadSizes(rowSizes.begin(),
                                      rowSizes.begin() + lead);
  Type f32 = rw.getF32Type();
  Value zero = f32Const(rw, loc, 0.0);
  Value numExperts = tensor::DimOp::create(rw, loc, scores, lead);

  auto seq = [](unsigned n) {
    SmallVector<unsigned> d;
    for (unsigned i = 0; i < n; ++i)
      d.push_back(i);
    return d;
  };
  SmallVector<unsigned> leadDims = seq(lead);
  AffineMap full = dimsMap(ctx, rank, seq(rank)),
            leadOnly = dimsMap(ctx, rank, leadDims);
  SmallVector<IteratorType> par(rank, IteratorType::parallel);
  SmallVector<IteratorType> rowRed = par;
  rowRed.back() = IteratorType::reduction;
  auto body = [&](auto fn) {
    return [=](OpBuilder &gb, Location gl, ValueRange a) {
      ImplicitLocOpBuilder ib(gl, gb);
      kernels::KernelBuilder kb(ib);
      return SmallVector<Value>{fn(kb, a)};
    };
  };
  auto leadTensor = [&](Value init) { return filled(rw, loc, leadSizes, init); };
  // A row reduction of `ins` (maps `full` or `leadOnly`) into [...].
  auto reduce = [&](ValueRange ins, ArrayRef<AffineMap> inMaps, Value init,
                    auto fn) {
    SmallVector<AffineMap> maps(inMaps);
    maps.push_back(leadOnly);
    return generic(rw, loc, ins, leadTensor(init), maps, rowRed, body(fn))
        .front();
  };

  // The selected values (clamped reads; the scatter below drops bad indices).
  Value sel =
      generic(rw, loc, ValueRange{indices},
              Value(tensor::EmptyOp::create(rw, loc, selSizes, f32)), {full, full},
              par, [&](OpBuilder &gb, Location gl, ValueRange a) {
                Value j = toIndex(gb, gl, a[0]);
                Value c0 = indexConst(gb, gl, 0);
                // Sequenced: argument evaluation order is unspecified.
                Value nonNegative = arith::CmpIOp::create(
                    gb, gl, arith::CmpIPredicate::sge, j, c0);
                Value below = arith::CmpIOp::create(
                    gb, gl, arith::CmpIPredicate::slt, j, numExperts);
                Value ok = arith::AndIOp::create(gb, gl, nonNegative, below);
                SmallVector<Value> at;
                for (unsigned d = 0; d < lead; ++d)
                  at.push_back(loopIndex(gb, gl, d));
                at.push_back(arith::SelectOp::create(gb, gl, ok, j, c0));
                return SmallVector<Value>{extractF32(gb, gl, scores, at)};
              })
          .front();

  Value v0, selSum, denseMax, denseSum;
  Value negInfV = negInf(rw, loc);
  if (spec.logits) {
    v0 = reduce(sel, {full}, negInfV, [](kernels::KernelBuilder &kb,
                                         ValueRange a) {
      return kb.fmax(a[1], a[0]);
    });
    selSum = reduce(ValueRange{sel, v0}, {full, leadOnly}, zero,
                    [](kernels::KernelBuilder &kb, ValueRange a) {
                      return kb.fadd(a[2], kb.exp(kb.fsub(a[0], a[1])));
                    });
    if (!spec.renormalize) {
      denseMax = reduce(scores, {full}, negInfV,
                        [](kernels::KernelBuilder &kb, ValueRange a) {
                          return kb.fmax(a[1], a[0]);
                        });
      denseSum = reduce(ValueRange{scores, denseMax}, {full, leadOnly}, zero,
                        [](kernels::KernelBuilder &kb, ValueRange a) {
                          return kb.fadd(a[2], kb.exp(kb.fsub(a[0], a[1])));
                        });
    }
  } else {
    selSum = reduce(sel, {full}, zero,
                    [](kernels::KernelBuilder &kb, ValueRange a) {
                      return kb.fadd(a[1], a[0]);
                    });
  }
  // The row statistics topkWeight takes, as extra inputs [...] (absent:
  // a zero placeholder the formula does not read).
  SmallVector<Value> stats{v0 ? v0 : selSum, selSum,
                           denseMax ? denseMax : selSum,
                           denseSum ? denseSum : selSum};
  auto weightOf = [spec, hasV0 = bool(v0),
                   dense = bool(denseMax)](kernels::KernelBuilder &kb, Value v,
                                           ValueRange st) {
    return kernels::topkWeight(kb, spec, v, hasV0 ? st[0] : Value(), st[1],
                               dense ? st[2] : Value(),
                               dense ? st[3] : Value());
  };
  SmallVector<AffineMap> statMaps(4, leadOnly);

  // c = Σ_l dw_l w_l.
  SmallVector<Value> cIns{sel, dw};
  cIns.append(stats);
  SmallVector<AffineMap> cMaps{full, full};
  cMaps.append(statMaps);
  Value c = reduce(cIns, cMaps, zero,
                   [&](kernels::KernelBuilder &kb, ValueRange a) {
                     Value w = weightOf(kb, a[0], a.slice(2, 4));
                     return kb.fadd(a[6], kb.fmul(a[1], w));
                   });

  // dsel_l = topkWeightGrad.
  SmallVector<Value> dIns{sel, dw, c};
  dIns.append(stats);
  SmallVector<AffineMap> dMaps{full, full, leadOnly};
  dMaps.append(statMaps);
  dMaps.push_back(full);
  Value dsel =
      generic(rw, loc, dIns, Value(tensor::EmptyOp::create(rw, loc, selSizes, f32)),
              dMaps, par, body([&](kernels::KernelBuilder &kb, ValueRange a) {
                Value w = weightOf(kb, a[0], a.slice(3, 4));
                return kernels::topkWeightGrad(kb, spec, a[1], w, a[2],
                                               a[4]);
              }))
          .front();

  // Every entry: -s_j c (logits without renormalization), else 0.
  Value base = filled(rw, loc, rowSizes, zero);
  if (spec.logits && !spec.renormalize) {
    SmallVector<Value> bIns{scores, c};
    bIns.append(stats);
    SmallVector<AffineMap> bMaps{full, leadOnly};
    bMaps.append(statMaps);
    bMaps.push_back(full);
    base = generic(rw, loc, bIns, base, bMaps, par,
                   body([&](kernels::KernelBuilder &kb, ValueRange a) {
                     Value s = weightOf(kb, a[0], a.slice(2, 4));
                     return kb.fsub(kb.constLike(kb.f32(), 0.0),
                                   kb.fmul(s, a[1]));
                   }))
               .front();
  }

  // Scatter: out[..., j] = dsel[..., l] where indices[..., l] == j, as a
  // reduction over l (iteration space [..., K, k]).
  SmallVector<unsigned> selDims = leadDims, rowDims = leadDims;
  selDims.push_back(rank);
  rowDims.push_back(rank - 1);
  SmallVector<IteratorType> scatterIt(rank, IteratorType::parallel);
  scatterIt.push_back(IteratorType::reduction);
  Value out =
      generic(rw, loc, ValueRange{indices, dsel}, base,
              {dimsMap(ctx, rank + 1, selDims),
               dimsMap(ctx, rank + 1, selDims),
               dimsMap(ctx, rank + 1, rowDims)},
              scatterIt, [&](OpBuilder &gb, Location gl, ValueRange a) {
                Value j = indexTo(gb, gl, loopIndex(gb, gl, rank - 1),
                                  a[0].getType());
                Value hit = arith::CmpIOp::create(
                    gb, gl, arith::CmpIPredicate::eq, a[0], j);
                return SmallVector<Value>{
                    arith::SelectOp::create(gb, gl, hit, a[1], a[2])};
              })
          .front();
  replaceWithCasts(rw, op, out);
  return success();
}
