//===- RouteGrad.cpp - moe.route_grad on the GPU --------------------------===//
//
// Part of the MoE-MLIR project.
//
// The backward of moe.route with an elementwise score (sigmoid, none, a
// custom score region) for CUDA tensors, so that training on the GPU does not
// fall back to autograd of the reference. A block of 128 threads owns 128
// rows (tokens):
//
// 1. it zeroes its rows of dlogits [T, E], the threads along each row
//    (coalesced stores), then waits at a barrier;
// 2. thread t takes row t of the block and runs the row algorithm the CPU
//    kernel runs for a large k (kernels::routeGradRowSums / routeGradRowAdds,
//    MoE/Kernels/Route.h): the k picked logits read through the forward's
//    indices, f and f' (the custom region's symbolic derivative inlined),
//    S = Σ f and C = Σ dw·f in pick order, and a (dw - C/S) / S · f'(x) added
//    at each picked expert. A repeated expert accumulates in pick order (one
//    thread a row: no atomics, the same bits every run); an index outside
//    [0, E) is read clamped and never written, as on the CPU.
//
// O(E + k) a row, like the CPU kernel; the reads of k logits per row are
// gathers, the E zeroing stores the bulk of the traffic.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Lowerings.h"
#include "RowKernels.h"

#include "MoE/Kernels/Route.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

template <>
LogicalResult
GPULowering<RouteGradOp>::lower(RouteGradOp op, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const {
  kernels::RouteSpec spec = kernels::routeGradSpecOf(op);
  lowerPickGradKernel(
      rewriter, op, adaptor.getOperands(), "route_grad",
      [&](PickGradKernel &k) {
        GpuKernelBuilder &kk = k.g;
        Value rows = kk.dim(k.x, 0), numExperts = kk.dim(k.x, 1);
        // 1. The block's rows zeroed, its threads along each row.
        Value first = kk.mul(kk.blockId(), kk.idx(kKernelThreads));
        Value last = kk.mins(kk.add(first, kk.idx(kKernelThreads)), rows);
        kk.forLoop(first, last, kk.idx(1), [&](Value r) {
          kk.forLoop(kk.threadId(), numExperts, kk.idx(kKernelThreads),
                     [&](Value e) {
                       kk.store(kk.cF32(0.0), k.out, {r, e});
                     });
        });
        kk.barrier();
        // 2. A thread a row: the picks' sums, then their gradients.
        k.kernel.forItem(rows, [&](Value r) {
          Value sel = kk.dim(k.indices, 1);
          auto [sSum, cSum] = kernels::routeGradRowSums(
              kk, spec, k.x, k.indices, k.dw, r, numExperts, sel);
          kernels::routeGradRowAdds(kk, spec, k.x, k.indices, k.dw, k.out, r,
                                    numExperts, sel, sSum, cSum);
        });
      });
  return success();
}
