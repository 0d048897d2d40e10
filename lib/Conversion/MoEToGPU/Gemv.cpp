//===- Gemv.cpp - The warp-per-row GEMV kernel ----------------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "Gemv.h"
#include "Reductions.h"

#include "MoE/Kernels/Gemv.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

static constexpr int64_t kRowsPerBlock = kKernelThreads / kWarp;

void mlir::moe::gpu_lowering::launchGemv(HostCode &host, StringRef name,
                                         ValueRange args, Location loc,
                                         bool relu, GemvStore store) {
  GPUKernel kernel(host, name, args, {}, {kKernelThreads, 1, 1}, loc);
  GpuKernelBuilder &kb = kernel.kb;
  Value m = kernel.arg(0), x = kernel.arg(1), bias = kernel.arg(2);
  Value warp = kb.divu(kb.threadId(), kb.idx(kWarp));
  Value lane = kb.remu(kb.threadId(), kb.idx(kWarp));
  Value row = kb.add(kb.mul(kb.blockId(), kb.idx(kRowsPerBlock)), warp);
  Value rows = kb.dim(m, 0), cols = kb.dim(m, 1);
  Value active = kb.lt(row, rows);
  // A warp past the last row computes the last one again and stores
  // nothing: every lane must take part in the butterfly.
  Value safe = kb.select(active, row, kb.sub(rows, kb.idx(1)));

  // A chunk of 32 columns, one per lane; in the tail chunk a lane past the
  // row's end reads nothing and holds 0.
  kernels::GemvLayout layout;
  layout.span = kWarp;
  layout.share = kb.f32();
  auto load = [&](Value memref, ValueRange indices, Value count) -> Value {
    SmallVector<Value> at(indices);
    at.back() = kb.add(at.back(), lane);
    if (!count)
      return kb.loadF(memref, at);
    return kb.ifElse(
        kb.lt(lane, count), {kb.f32()},
        [&]() -> SmallVector<Value> { return {kb.loadF(memref, at)}; },
        [&]() -> SmallVector<Value> { return {kb.cF32(0.0)}; })[0];
  };
  auto reduce = [&](Value share) {
    return subgroupReduce(kb, share, ReduceKind::Sum, kWarp);
  };
  layout.load = load;
  layout.reduce = reduce;
  Value dot = kernels::gemvRowDot(kb, layout, m, safe, x, cols);
  kb.ifThen(kb.andI(active, kb.eq(lane, kb.idx(0))), [&] {
    Value v = kernels::gemvEpilogue(kb, dot, kb.loadF(bias, {row}), relu);
    store(kernel, row, v);
  });
  GpuKernelBuilder &hk = host.kb;
  Value numRows = hk.dim(args[0], 0);
  kernel.launch(
      {hk.ceilDiv(numRows, hk.idx(kRowsPerBlock)), hk.idx(1), hk.idx(1)});
}
