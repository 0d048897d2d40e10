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

gpu::GPUFuncOp
mlir::moe::gpu_lowering::createGemvKernel(HostCode &host, StringRef name,
                                          TypeRange argTypes, Location loc,
                                          bool relu, GemvStore store) {
  ImplicitLocOpBuilder kb(loc, host.b.getContext());
  auto kernel = createKernel(host, name, argTypes, {}, {kThreads, 1, 1}, kb);
  KB k(kb);
  Block &entry = kernel.getBody().front();
  Value m = entry.getArgument(0), x = entry.getArgument(1),
        bias = entry.getArgument(2);
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
    store(k, entry, row, v);
  });
  return kernel;
}

void mlir::moe::gpu_lowering::launchGemv(HostCode &host, gpu::GPUFuncOp kernel,
                                         ValueRange args) {
  KB &k = host.k;
  Value rows = k.dim(args[0], 0);
  host.launch(kernel,
              {k.ceilDiv(rows, k.idx(kRowsPerBlock)), k.idx(1), k.idx(1)},
              {kThreads, 1, 1}, args);
}
