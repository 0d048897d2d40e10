//===- AdjacencyUpdate.cpp - moe.adjacency_update on the GPU --------------===//
//
// Part of the MoE-MLIR project.
//
//  1. adjacency_counts: a thread per token keeps the first occurrence of each
//     of its k experts (an indicator: a repeated index counts once), skips and
//     records out-of-range values in the device error word, and adds 1 to
//     C[j1, j2] for every pair with i32 atomics (exact: deterministic).
//  2. adjacency_update: a block per row (norm = row), column (col) or row
//     (none): the integer sum in a fixed-order block reduction, then
//     a_next = beta·a + (1-beta)·C/sum (0 for an all-zero row/column).
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Reductions.h"
#include "Lowerings.h"
#include "MoE/Kernels/CoSelection.h"
#include "MoE/Kernels/IndexErrors.h"
#include "MoE/Kernels/SegmentedStats.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

template <>
LogicalResult GPULowering<AdjacencyUpdateOp>::lower(
    AdjacencyUpdateOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  auto aType = cast<RankedTensorType>(op.getA().getType());
  auto outType = cast<RankedTensorType>(op.getANext().getType());
  int64_t E = aType.getShape()[0];
  if (ShapedType::isDynamic(E))
    E = aType.getShape()[1];
  if (ShapedType::isDynamic(E))
    return op.emitOpError("GPU lowering needs a static expert count");
  const float beta = op.getBeta().convertToFloat();
  const bool includeSelf = op.getIncludeSelf();
  const AdjacencyNorm norm = op.getNorm();
  Location loc = op.getLoc();

  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Value a = h.buffer(adaptor.getA());
  Value idx = h.buffer(adaptor.getIdx());
  Value T = kb.dim(idx, 0);
  Value counts = h.alloc(MemRefType::get({E, E}, b.getI32Type()), {});
  h.fill32(counts, kb.cI32(0));
  Value out = h.allocLike(outType, {});
  Value word = h.errorWord();

  {
    GPUKernel kernel(h, "adjacency_counts", {idx, counts, word}, {},
                     {kKernelThreads, 1, 1}, loc);
    GpuKernelBuilder &kk = kernel.kb;
    Value ix = kernel.arg(0), cs = kernel.arg(1), w = kernel.arg(2);
    Value kSel = kk.dim(ix, 1);
    kernel.forItem(kk.dim(ix, 0), [&](Value t) {
      auto expert = [&](Value s) {
        return kk.castInt(kk.load(ix, {t, s}), kk.i64());
      };
      auto inRange = [&](Value v) { return idInRange(kk, v, kk.cI64(E)); };
      // Valid and the first occurrence in the token's row.
      auto counted = [&](Value s, Value v) -> Value {
        Value dup =
            kk.forLoop(kk.idx(0), s, kk.idx(1), {kk.cBool(true)},
                       [&](Value s2, ValueRange acc) -> SmallVector<Value> {
                         Value same = kk.eq(expert(s2), v);
                         return {kk.andI(acc[0], kk.notI1(same))};
                       })[0];
        return kk.andI(inRange(v), dup);
      };
      kk.forLoop(kk.idx(0), kSel, kk.idx(1), [&](Value s1) {
        Value v1 = expert(s1);
        kk.ifThen(kk.notI1(inRange(v1)), [&] {
          Value pos = kk.castInt(kk.add(kk.mul(t, kSel), s1), kk.i64());
          emitRecordIndexError(kk, w, kMoEErrorAdjacencyUpdateIdx, pos, v1,
                               kk.cI64(E));
        });
        kk.ifThen(counted(s1, v1), [&] {
          kk.forLoop(kk.idx(0), kSel, kk.idx(1), [&](Value s2) {
            Value v2 = expert(s2);
            Value ok = counted(s2, v2);
            if (!includeSelf)
              ok = kk.andI(ok, kk.notI1(kk.eq(v1, v2)));
            kk.ifThen(ok, [&] {
              memref::AtomicRMWOp::create(
                  kernel.b, arith::AtomicRMWKind::addi, kk.cI32(1), cs,
                  ValueRange{kk.castInt(v1, kk.index()),
                             kk.castInt(v2, kk.index())});
            });
          });
        });
      });
    });
    kernel.launchOver(T);
  }

  {
    GPUKernel kernel(
        h, "adjacency_update", {a, counts, out},
        {workgroupMemRef({kKernelThreads / kWarp}, b.getF32Type())},
        {kKernelThreads, 1, 1}, loc);
    GpuKernelBuilder &kk = kernel.kb;
    Value as = kernel.arg(0), cs = kernel.arg(1), o = kernel.arg(2);
    Value line = kk.blockId();
    Value tid = kk.threadId();
    Value step = kk.idx(kKernelThreads);
    Value En = kk.idx(E);
    bool byColumn = norm == AdjacencyNorm::col;
    // Element n of this block's line: (line, n) for rows, (n, line) for cols.
    auto at = [&](Value n) -> SmallVector<Value> {
      return byColumn ? SmallVector<Value>{n, line}
                      : SmallVector<Value>{line, n};
    };
    auto countAt = [&](Value n) { return kk.sitofp(kk.load(cs, at(n))); };
    Value sum;
    if (norm != AdjacencyNorm::none) {
      Value part =
          kk.forLoop(tid, En, step, {kk.cF32(0.0)},
                     [&](Value n, ValueRange acc) -> SmallVector<Value> {
                       return {kk.fadd(acc[0], countAt(n))};
                     })[0];
      sum = blockReduce(kk, part, ReduceKind::Sum, kKernelThreads,
                        kernel.workgroup(0));
    }
    kk.forLoop(tid, En, step, [&](Value n) {
      Value c = countAt(n);
      Value v = coSelectionNext(kk, kk.loadF(as, at(n)), c, sum, beta);
      kk.store(v, o, at(n));
    });
    kernel.launch({kb.idx(E), kb.idx(1), kb.idx(1)});
  }
  h.release(counts);
  h.finish(/*checkErrors=*/true);
  h.replace(op, out);
  return success();
}
