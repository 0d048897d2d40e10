//===- MoEToGPU.cpp - The convert-moe-to-gpu pass -------------------------===//
//
// Part of the MoE-MLIR project.
//
// Gathers the moe ops of the module and hands each to its lowering (one file
// per op in this directory). The kernels go into gpu.module @moe_kernels, so
// the pass runs on the module.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "KernelUtils.h"
#include "Limits.h"
#include "Lowerings.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEOps.h"

#include "llvm/ADT/TypeSwitch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOGPU
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

namespace {
struct ConvertMoEToGPUPass
    : public moe::impl::ConvertMoEToGPUBase<ConvertMoEToGPUPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (blockSize < kWarp || blockSize % kWarp != 0 || blockSize > 1024) {
      module.emitError("convert-moe-to-gpu: block-size must be a multiple of "
                       "32 in [32, 1024], got ")
          << blockSize;
      return signalPassFailure();
    }
    if (sharedMemoryBytes <= 0) {
      module.emitError("convert-moe-to-gpu: shared-memory-bytes must be "
                       "positive, got ")
          << static_cast<int64_t>(sharedMemoryBytes);
      return signalPassFailure();
    }
    LoweringOptions options;
    options.blockSize = blockSize;

    SmallVector<Operation *> ops;
    module.walk([&](Operation *op) {
      if (isa<MoEDialect>(op->getDialect()))
        ops.push_back(op);
    });
    bool failed = false;
    for (Operation *op : ops) {
      // Shared memory, block and grid sizes of the op's kernels (Limits.h).
      KernelLimitCheck limits(module, op, sharedMemoryBytes);
      LogicalResult result =
          llvm::TypeSwitch<Operation *, LogicalResult>(op)
              .Case<TopkRenormOp>(
                  [&](auto o) { return lowerTopkRenorm(o, module, options); })
              .Case<SimilarityInformOp, SimilarityInformTopkOp>([&](auto o) {
                return lowerSimilarityInform(o, module, options);
              })
              .Case<AttentionPosteriorOp, AttentionPosteriorTopkOp>(
                  [&](auto o) {
                    return lowerAttentionPosterior(o, module, options);
                  })
              .Case<MadDispersionOp>([&](auto o) {
                return lowerMadDispersion(o, module, options);
              })
              .Case<AdjacencyUpdateOp>([&](auto o) {
                return lowerAdjacencyUpdate(o, module, options);
              })
              .Case<HyperRouterOp>(
                  [&](auto o) { return lowerHyperRouter(o, module, options); })
              .Default([&](Operation *o) {
                return o->emitOpError("has no GPU lowering");
              });
      failed |= mlir::failed(result) || mlir::failed(limits.verify());
    }
    if (failed)
      signalPassFailure();
  }
};
} // namespace
