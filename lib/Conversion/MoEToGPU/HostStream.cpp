//===- HostStream.cpp - One stream per function, results as out-params ----===//
//
// Part of the MoE-MLIR project.
//
// Two rewrites of the GPU host code on buffers (after bufferization):
//
// * moe-gpu-host-stream joins the per-op stream chains of convert-moe-to-gpu
//   (`gpu.wait async` ... `gpu.wait`) into one chain per block, so that the
//   ops of a function run in stream order with no host wait between them. It
//   is upstream gpu-async-region's rule (a token lives inside its block; the
//   host waits before an op with side effects and before the terminator), on
//   host code that is already asynchronous; `wait-at-return=false` leaves the
//   work in flight for callers that own the stream.
// * moe-gpu-results-to-out-params is upstream buffer-results-to-out-params for
//   device buffers: upstream hoists only allocations implementing
//   AllocationOpInterface (memref.alloc) and copies anything else with a host
//   memref.copy, which cannot touch device memory.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "llvm/ADT/BitVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUHOSTSTREAM
#define GEN_PASS_DEF_MOEGPURESULTSTOOUTPARAMS
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

/// Makes `result` (returned before `ret`) land in `out`: the gpu.alloc that
/// produced it is replaced by `out`, its place in the stream kept; anything
/// else is copied into `out` on a stream of its own, waited for.
void redirectResult(RewriterBase &rewriter, Value result, BlockArgument out,
                    func::ReturnOp ret) {
  auto alloc = result.getDefiningOp<gpu::AllocOp>();
  if (alloc && result.getType() == out.getType() && !alloc.getHostShared() &&
      alloc.getAsyncToken() && alloc.getAsyncDependencies().size() == 1) {
    rewriter.replaceOp(alloc, {out, alloc.getAsyncDependencies()[0]});
    return;
  }
  rewriter.setInsertionPoint(ret);
  Location loc = ret.getLoc();
  auto tokenType = rewriter.getType<gpu::AsyncTokenType>();
  Value start = gpu::WaitOp::create(rewriter, loc, tokenType, ValueRange{})
                    .getAsyncToken();
  Value copied = gpu::MemcpyOp::create(rewriter, loc, tokenType,
                                       ValueRange{start}, out, result)
                     .getAsyncToken();
  gpu::WaitOp::create(rewriter, loc, Type(), ValueRange{copied});
}

LogicalResult promoteResults(RewriterBase &rewriter, func::FuncOp func) {
  FunctionType type = func.getFunctionType();
  llvm::BitVector erased(type.getNumResults());
  SmallVector<Type> outTypes;
  for (auto [i, t] : llvm::enumerate(type.getResults())) {
    auto memref = dyn_cast<MemRefType>(t);
    if (!memref)
      continue;
    if (!memref.getLayout().isIdentity())
      return func.emitError("moe-gpu-results-to-out-params: result ")
             << i << " has a non-identity layout (" << t << ")";
    erased.set(i);
    outTypes.push_back(t);
  }
  if (outTypes.empty())
    return success();
  unsigned numInputs = type.getNumInputs();
  if (failed(func.eraseResults(erased)))
    return failure();
  SmallVector<unsigned> at(outTypes.size(), numInputs);
  SmallVector<DictionaryAttr> attrs(outTypes.size(), DictionaryAttr());
  SmallVector<Location> locs(outTypes.size(), func.getLoc());
  if (failed(func.insertArguments(at, outTypes, attrs, locs)))
    return failure();
  SmallVector<BlockArgument> outs(
      func.getArguments().drop_front(numInputs).begin(),
      func.getArguments().end());

  func.walk([&](func::ReturnOp ret) {
    SmallVector<Value> kept;
    unsigned next = 0;
    for (Value v : ret.getOperands()) {
      if (isa<MemRefType>(v.getType()))
        redirectResult(rewriter, v, outs[next++], ret);
      else
        kept.push_back(v);
    }
    rewriter.setInsertionPoint(ret);
    rewriter.replaceOpWithNewOp<func::ReturnOp>(ret, kept);
  });
  return success();
}

struct MoEGPUResultsToOutParams
    : public moe::impl::MoEGPUResultsToOutParamsBase<MoEGPUResultsToOutParams> {
  using Base::Base;
  void runOnOperation() override {
    IRRewriter rewriter(&getContext());
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal() || !func.isPublic())
        continue;
      if (failed(promoteResults(rewriter, func)))
        return signalPassFailure();
    }
  }
};

} // namespace
