//===- HostStream.cpp - One stream per function ---------------------------===//
//
// Part of the MoE-MLIR project.
//
// moe-gpu-host-stream joins the per-op stream chains of convert-moe-to-gpu
// (`gpu.wait async` ... `gpu.wait`) into one chain per block, so that the ops
// of a function run in stream order with no host wait between them. It is
// upstream gpu-async-region's rule (a token lives inside its block; the host
// waits before an op with side effects and before the terminator), on host
// code that is already asynchronous; `wait-at-return=false` leaves the work in
// flight for callers that own the stream.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUHOSTSTREAM
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// The runtime entry point the host code calls for the address of the error
/// word: it only returns a device address (allocated once, outside any
/// stream), so it orders nothing.
constexpr StringLiteral kErrorWordFn = "moeGpuErrorWord";
/// Waits for the stream and reads the error word (a host wait).
constexpr StringLiteral kCheckErrorsFn = "moeGpuCheckErrors";

bool isCallTo(Operation *op, StringRef name) {
  auto call = dyn_cast<LLVM::CallOp>(op);
  return call && call.getCallee() == name;
}

bool isBlockingWait(Operation *op) {
  auto wait = dyn_cast<gpu::WaitOp>(op);
  return wait && !wait.getAsyncToken();
}

/// A `gpu.wait async` without dependencies: the start of a new stream.
bool isStreamStart(Operation *op) {
  auto wait = dyn_cast<gpu::WaitOp>(op);
  return wait && wait.getAsyncToken() && wait.getAsyncDependencies().empty();
}

/// Joins the stream chains of `block`. `pending` is the token of the chain
/// whose closing wait was dropped; the host waits for it only where it must.
void joinStreams(RewriterBase &rewriter, Block &block, bool waitAtReturn) {
  Value pending;
  for (Operation &op : llvm::make_early_inc_range(block)) {
    if (isBlockingWait(&op) && op.getNumOperands() == 1 && !pending) {
      pending = op.getOperand(0);
      rewriter.eraseOp(&op);
      continue;
    }
    if (pending && isStreamStart(&op)) {
      rewriter.replaceOp(&op, pending);
      pending = Value();
      continue;
    }
    if (!waitAtReturn && isCallTo(&op, kCheckErrorsFn)) {
      // The caller polls the error word after its own synchronization.
      rewriter.eraseOp(&op);
      continue;
    }
    if (!pending || isa<gpu::AsyncOpInterface>(op) ||
        isCallTo(&op, kErrorWordFn))
      continue;
    bool terminator = op.hasTrait<OpTrait::IsTerminator>();
    if (!terminator && isMemoryEffectFree(&op))
      continue;
    if (!terminator || waitAtReturn) {
      rewriter.setInsertionPoint(&op);
      gpu::WaitOp::create(rewriter, op.getLoc(), Type(), ValueRange{pending});
    }
    pending = Value();
  }
}

struct MoEGPUHostStream
    : public moe::impl::MoEGPUHostStreamBase<MoEGPUHostStream> {
  using Base::Base;
  void runOnOperation() override {
    IRRewriter rewriter(&getContext());
    getOperation()->walk(
        [&](Block *block) { joinStreams(rewriter, *block, waitAtReturn); });
  }
};

} // namespace
