//===- Bufferize.cpp - One-shot bufferization into device memory ----------===//
//
// Part of the MoE-MLIR project.
//
// moe-gpu-bufferize: upstream one-shot module bufferization with the
// allocation and copy functions of device memory. The host code of
// convert-moe-to-gpu is destination-style (moe.kernel ins/outs), so one-shot
// places every result buffer; in a GPU function every buffer lives on the
// device, so its allocations are gpu.alloc and its copies gpu.memcpy (the
// defaults, memref.alloc and memref.copy, are host memory and host loads).
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/Dialect/Bufferization/IR/BufferizableOpInterface.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Transforms/OneShotAnalysis.h"
#include "mlir/Dialect/Bufferization/Transforms/OneShotModuleBufferize.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUBUFFERIZE
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::bufferization;

namespace {

/// Work on a stream of its own (built by `body` on the stream's first
/// token, returning its last): the host code is asynchronous on streams
/// `gpu.wait async` ... `gpu.wait`, which moe-gpu-host-stream joins into one.
template <typename Fn> void onStream(OpBuilder &b, Location loc, Fn body) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  Value start =
      gpu::WaitOp::create(b, loc, tokenType, ValueRange{}).getAsyncToken();
  gpu::WaitOp::create(b, loc, Type(), ValueRange{body(start)});
}

/// gpu.alloc on a stream. `alignment` (64 bytes by default) is met: the
/// driver aligns device allocations to at least 256 bytes.
FailureOr<Value> allocateOnDevice(OpBuilder &b, Location loc, MemRefType type,
                                  ValueRange dynamicSizes,
                                  unsigned /*alignment*/) {
  Value buffer;
  onStream(b, loc, [&](Value start) {
    auto alloc = gpu::AllocOp::create(
        b, loc, type, b.getType<gpu::AsyncTokenType>(), ValueRange{start},
        dynamicSizes, ValueRange{}, /*hostShared=*/false);
    buffer = alloc.getMemref();
    return alloc.getAsyncToken();
  });
  return buffer;
}

/// gpu.memcpy on a stream.
LogicalResult copyOnDevice(OpBuilder &b, Location loc, Value from, Value to) {
  onStream(b, loc, [&](Value start) {
    return gpu::MemcpyOp::create(b, loc, b.getType<gpu::AsyncTokenType>(),
                                 ValueRange{start}, to, from)
        .getAsyncToken();
  });
  return success();
}

struct MoEGPUBufferize
    : public moe::impl::MoEGPUBufferizeBase<MoEGPUBufferize> {
  using Base::Base;
  void runOnOperation() override {
    // What moe-lower-to-llvm's one-shot step sets (MoE/Pipelines/Bufferize.h),
    // plus device memory.
    OneShotBufferizationOptions options;
    options.bufferizeFunctionBoundaries = true;
    options.setFunctionBoundaryTypeConversion(
        LayoutMapOption::IdentityLayoutMap);
    options.unknownTypeConverterFn = [](TensorType type, Attribute memorySpace,
                                        const BufferizationOptions &) {
      return getMemRefTypeWithFullyDynamicLayout(type, memorySpace);
    };
    options.allocationFn = allocateOnDevice;
    options.memCpyFn = copyOnDevice;
    BufferizationState state;
    if (failed(runOneShotModuleBufferize(getOperation(), options, state)))
      return signalPassFailure();
    // Constant globals in an order that does not depend on addresses.
    moe::orderConstantGlobals(getOperation());
  }
};

} // namespace
