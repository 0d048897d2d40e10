//===- ResultsToOutParams.cpp - Device buffers returned as out-params -----===//
//
// Part of the MoE-MLIR project.
//
// moe-gpu-results-to-out-params is upstream buffer-results-to-out-params for
// device buffers: upstream hoists only allocations implementing
// AllocationOpInterface (memref.alloc) and copies anything else with a host
// memref.copy, which cannot touch device memory. Here the gpu.alloc of a
// returned buffer is replaced by the caller's out-param (its place in the
// stream kept); any other returned buffer is copied into it with gpu.memcpy.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/PatternMatch.h"

#include "llvm/ADT/BitVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPURESULTSTOOUTPARAMS
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

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
