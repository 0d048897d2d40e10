//===- Reductions.cpp - Warp and block reductions -------------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "Reductions.h"

#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

static Value combine(GpuKernelBuilder &kb, Value x, Value y, ReduceKind kind) {
  switch (kind) {
  case ReduceKind::Sum:
    return kb.fadd(x, y);
  case ReduceKind::Max:
    return kb.fmax(x, y);
  case ReduceKind::MaxI64:
    return kb.maxs(x, y);
  }
  llvm_unreachable("reduce kind");
}

Value mlir::moe::gpu_lowering::subgroupReduce(GpuKernelBuilder &kb, Value v,
                                              ReduceKind kind, int64_t width) {
  if (kind != ReduceKind::MaxI64) {
    // gpu.subgroup_reduce, lowered by upstream's patterns
    // (lowerSubgroupReductions).
    auto op = kind == ReduceKind::Sum ? gpu::AllReduceOperation::ADD
                                      : gpu::AllReduceOperation::MAXIMUMF;
    std::optional<uint32_t> cluster;
    if (width < kWarp)
      cluster = static_cast<uint32_t>(width);
    return gpu::SubgroupReduceOp::create(kb.b, v, op, /*uniform=*/true, cluster);
  }
  // The packed i64 candidates of the top-k: upstream's shuffle lowering
  // takes values no wider than a shuffle (32 bits), so the two halves travel
  // separately here.
  for (int64_t offset = width / 2; offset >= 1; offset /= 2) {
    Value lo = kb.trunc(v, kb.i32());
    Value hi = kb.trunc(kb.shru(v, kb.cI64(32)), kb.i32());
    Value olo = kb.extu(kb.shuffleXor(lo, offset), kb.i64());
    Value ohi = kb.extu(kb.shuffleXor(hi, offset), kb.i64());
    v = combine(kb, v, kb.orI(kb.shl(ohi, kb.cI64(32)), olo), kind);
  }
  return v;
}

LogicalResult
mlir::moe::gpu_lowering::lowerSubgroupReductions(gpu::GPUModuleOp kernels) {
  SmallVector<Operation *> ops;
  kernels.walk([&](gpu::SubgroupReduceOp op) { ops.push_back(op); });
  if (ops.empty())
    return success();
  RewritePatternSet patterns(kernels.getContext());
  populateGpuLowerSubgroupReduceToShufflePatterns(patterns, kWarp);
  populateGpuLowerClusteredSubgroupReduceToShufflePatterns(patterns, kWarp);
  // Only these ops, and nothing folded: the rest lowers as written.
  GreedyRewriteConfig config;
  config.setStrictness(GreedyRewriteStrictness::ExistingAndNewOps)
      .enableFolding(false)
      .enableConstantCSE(false);
  bool changed = false;
  if (failed(applyOpPatternsGreedily(ops, std::move(patterns), config,
                                     &changed)))
    return failure();
  // Every reduction must be gone (a pattern that does not apply leaves it).
  WalkResult left = kernels.walk([](gpu::SubgroupReduceOp op) {
    op.emitOpError("was not lowered to shuffles");
    return WalkResult::interrupt();
  });
  return failure(left.wasInterrupted());
}

Value mlir::moe::gpu_lowering::blockReduce(GpuKernelBuilder &kb, Value v,
                                           ReduceKind kind, int64_t threads,
                                           Value scratch) {
  int64_t warps = threads / kWarp;
  v = subgroupReduce(kb, v, kind, kWarp);
  if (warps == 1)
    return v;
  Value tid = kb.threadId();
  Value warp = kb.divu(tid, kb.idx(kWarp));
  Value lane = kb.remu(tid, kb.idx(kWarp));
  kb.ifThen(kb.eq(lane, kb.idx(0)), [&] { kb.store(v, scratch, {warp}); });
  kb.barrier();
  Value r = kb.load(scratch, {kb.idx(0)});
  for (int64_t w = 1; w < warps; ++w)
    r = combine(kb, r, kb.load(scratch, {kb.idx(w)}), kind);
  // The scratch may be reused right after: everybody has read it first.
  kb.barrier();
  return r;
}
