//===- HyperRouter.cpp - moe.hyper_router -> fast CPU kernel --------------===//
//
// Part of the MoE-MLIR project.
//
// Two matrix-vector products y = W x + bias (then ReLU for the hidden layer):
// row blocks go to the workers, each row the shared row dot of
// MoE/Kernels/Gemv.h (four accumulators, masked tail; also the GPU kernel's)
// with a chunk of the row one vector of the target's width (vector<16>
// AVX-512, vector<8> AVX2), rows in memory order, four a step on AVX-512 and
// two on AVX2 (rowsPerStep; a row's bits are the same either way). The op is
// memory-bound on w2 ([E·(D+1), Dh]). The kernel's outs are the op's
// results: row r of the output layer is stored straight into w or b
// (kernels::hyperSlot, as the GPU kernel), not into a flat [E·(D+1)] buffer
// that a copy then splits (the portable lowering's finishHyperRouter): that
// buffer was a 1 MiB allocation a call at E = 256 and a 1 MiB copy (484
// minor page faults a call with torch's w in a loop of calls alone, 37
// without it).
// The GEMV (hyperAffine) is also the backward kernel's recomputation of the
// hidden layer (HyperRouterGrad.cpp).
//
// Rows in memory order (one sequential stream) because interleaved rows read
// w2 at less than half the bandwidth (docs/CPU.md, "Measurements"). A matrix
// of at most 1 MiB (the decode case D = 64, E = 8: 0.5 MiB) runs as at most
// four blocks, which the workers run on the calling thread (it is in cache;
// waking the pool cost more than the product).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Gemv.h"

namespace mlir::moe::cpu_lowering {

namespace {
constexpr int64_t kRowsPerItem = 64;

/// Rows a worker reads together (kernels::gemvRowsDot): adjacent rows (one
/// 4 KiB page of w2 at Dh = 256, still one stream in memory order), each x
/// chunk loaded once for all of them. One row a step with AVX-512 takes two
/// loads per 64 bytes of w2 (w2's and x's) and ends in a reduction every
/// 1 KiB; four rows (16 accumulators of the 32 registers) take 1.25 loads and
/// overlap four reductions. On the Xeon (Dh = 256, D = 1024; the kernel's
/// CPU time on one thread, so that the shared machine's load falls out;
/// docs/CPU.md, "Measurements"): four rows took 0.77-0.83x the time of one
/// row at E = 64 and 0.80-0.90x at E = 256 (three runs), two rows 0.84-0.85x
/// and 0.84-0.96x, eight rows (32 accumulators) no better than four. With
/// AVX2 (16 registers) two rows: 0.83-0.87x the time of one (E = 256,
/// 2 threads).
int64_t rowsPerStep(const KernelOptions &opts) {
  return opts.vectorBits >= 512 ? 4 : 2;
}

} // namespace

template <>
LogicalResult CPUKernel<HyperRouterOp>::emit(HyperRouterOp op,
                                             CpuKernelBuilder &kb,
                                             PatternRewriter &rw) const {
  // The kernel's outs are the op's results: row r of w2 goes to w or b
  // (kernels::hyperSlot, as the GPU kernel), not to a flat [E·(D+1)] buffer
  // that a copy then splits.
  Value w2 = op.getW2();
  int64_t numExperts = op.getNumExperts();
  // w [E, D] with D = rows of w2 / E - 1.
  Value e = kb.idx(numExperts);
  Value d = kb.sub(kb.divu(kb.sizes(w2)[0], e), kb.idx(1));
  KernelScope kernel(kb, {op.getW1(), op.getEmb(), op.getB1(), w2, op.getB2()},
                     KernelScope::outsOf(op, {{e, d}, {e}}));
  Value hidden =
      hyperAffine(kb, opts, kb.buffer(op.getW1()), kb.buffer(op.getEmb()),
                  kb.buffer(op.getB1()), /*relu=*/true);
  Value w = kernel.out(0), b = kernel.out(1);
  Value depth = kb.dim(w, 1);
  hyperAffine(kb, opts, kb.buffer(w2), hidden, kb.buffer(op.getB2()),
              /*relu=*/false, [&](Value row, Value v) {
                kernels::HyperSlot slot = kernels::hyperSlot(kb, row, depth);
                kb.ifThenElse(
                    slot.isBias, [&] { kb.store(v, b, {slot.expert}); },
                    [&] { kb.store(v, w, {slot.expert, slot.column}); });
              });
  kernel.replace(rw, op);
  return success();
}

Value hyperAffine(CpuKernelBuilder &kb, const KernelOptions &opts, Value m,
                  Value x, Value bias, bool relu,
                  function_ref<void(Value row, Value v)> store) {
  Value c1 = kb.idx(1);
  Value rows = kb.dim(m, 0), cols = kb.dim(m, 1);
  int64_t staticRows = cast<MemRefType>(m.getType()).getDimSize(0);
  Value y;
  if (!store)
    y = kb.alloc(MemRefType::get({staticRows}, kb.f32()),
                CpuKernelBuilder::dynamicSizes({staticRows}, {rows}));
  Value small = kb.cmpi(arith::CmpIPredicate::ule, kb.mul(rows, cols),
                       kb.idx(kHyperInlineElements));
  Value rowsPerItem = kb.select(
      small, kb.maxs(kb.ceilDiv(rows, kb.idx(CpuKernelBuilder::kInlineItems)), c1),
      kb.idx(kRowsPerItem));
  // A chunk of a row is one vector: loaded whole, or masked for the tail.
  kernels::GemvLayout layout;
  layout.span = kb.lanes();
  layout.share = kb.vf32();
  auto load = [&](Value memref, ValueRange indices, Value count) {
    return count ? kb.vloadMasked(memref, indices, count, 0.0)
                 : kb.vload(memref, indices);
  };
  auto reduce = [&](Value share) { return kb.sum(share); };
  layout.load = load;
  layout.reduce = reduce;
  int64_t step = rowsPerStep(opts);
  // `n` consecutive rows from r on.
  auto emitRows = [&](Value r, int64_t n) {
    SmallVector<Value> at;
    for (int64_t q = 0; q < n; ++q)
      at.push_back(q ? kb.add(r, kb.idx(q)) : r);
    SmallVector<Value> out =
        kernels::gemvRows(kb, layout, m, at, x, cols, bias, relu);
    for (auto [v, row] : llvm::zip(out, at)) {
      if (store)
        store(row, v);
      else
        kb.store(v, y, {row});
    }
  };
  kb.workers(opts, kb.ceilDiv(rows, rowsPerItem), [&](Value item, Value) {
    Value r0 = kb.mul(item, rowsPerItem);
    Value r1 = kb.mins(kb.add(r0, rowsPerItem), rows);
    // In memory order, `step` rows at a time: the x vectors come from L1.
    if (step == 1) {
      kb.forLoop(r0, r1, c1, [&](Value r) { emitRows(r, 1); });
      return;
    }
    Value whole =
        kb.add(r0, kb.mul(kb.divu(kb.sub(r1, r0), kb.idx(step)), kb.idx(step)));
    kb.forLoop(r0, whole, kb.idx(step), [&](Value r) { emitRows(r, step); });
    kb.forLoop(whole, r1, c1, [&](Value r) { emitRows(r, 1); });
  });
  return y;
}

} // namespace mlir::moe::cpu_lowering
