//===- Gemv.cpp - The warp-per-row GEMV kernel ----------------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "Gemv.h"

#include "MoE/Kernels/Gemv.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

static constexpr int64_t kThreads = 128;
static constexpr int64_t kRowsPerBlock = kThreads / kWarp;

void mlir::moe::gpu_lowering::launchGemv(HostCode &host, StringRef name,
                                         ValueRange args, Location loc,
                                         bool relu, GemvStore store) {
  GPUKernel kernel(host, name, args, {}, {kThreads, 1, 1}, loc);
  GpuKernelBuilder &k = kernel.k;
  Value m = kernel.arg(0), x = kernel.arg(1), bias = kernel.arg(2);
  Value warp = k.divu(k.threadId(), k.idx(kWarp));
  Value lane = k.remu(k.threadId(), k.idx(kWarp));
  Value row = k.add(k.mul(k.blockId(), k.idx(kRowsPerBlock)), warp);
  Value rows = k.dim(m, 0), cols = k.dim(m, 1);
  Value active = k.lt(row, rows);
  // A warp past the last row computes the last one again and stores
  // nothing: every lane must take part in the butterfly.
  Value safe = k.select(active, row, k.sub(rows, k.idx(1)));

  // A chunk of 32 columns, one per lane; in the tail chunk a lane past the
  // row's end reads nothing and holds 0.
  kernels::GemvLayout layout;
  layout.span = kWarp;
  layout.share = k.f32();
  auto load = [&](Value memref, ValueRange indices, Value count) -> Value {
    SmallVector<Value> at(indices);
    at.back() = k.add(at.back(), lane);
    if (!count)
      return k.loadF(memref, at);
    return k.ifElse(
        k.lt(lane, count), {k.f32()},
        [&]() -> SmallVector<Value> { return {k.loadF(memref, at)}; },
        [&]() -> SmallVector<Value> { return {k.cF32(0.0)}; })[0];
  };
  auto reduce = [&](Value share) {
    return subgroupReduce(k, share, ReduceKind::Sum, kWarp);
  };
  layout.load = load;
  layout.reduce = reduce;
  Value dot = kernels::gemvRowDot(k, layout, m, safe, x, cols);
  k.ifThen(k.andI(active, k.eq(lane, k.idx(0))), [&] {
    Value v = kernels::gemvEpilogue(k, dot, k.loadF(bias, {row}), relu);
    store(kernel, row, v);
  });
  GpuKernelBuilder &hk = host.k;
  Value numRows = hk.dim(args[0], 0);
  kernel.launch(
      {hk.ceilDiv(numRows, hk.idx(kRowsPerBlock)), hk.idx(1), hk.idx(1)});
}
