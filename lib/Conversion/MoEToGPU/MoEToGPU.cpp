//===- MoEToGPU.cpp - The convert-moe-to-gpu pass -------------------------===//
//
// Part of the MoE-MLIR project.
//
// Applies the per-op conversion patterns (one file per op in this directory,
// registered through the lowering table, Lowerings.td)
// with the dialect conversion driver. The kernels go into gpu.module
// @moe_kernels, so the pass runs on the module.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/Conversion/Legality.h"
#include "HostCode.h"
#include "Reductions.h"
#include "Limits.h"
#include "Lowerings.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Transforms/DialectConversion.h"
#include "llvm/ADT/DenseSet.h"

#include <optional>
#include <string>

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOGPU
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

void mlir::moe::populateMoEToGPUPatterns(
    RewritePatternSet &patterns, const ConvertMoEToGPUOptions &options) {
  gpu_lowering::populateLowerings(patterns, options);
}

// populateLowerings: the op table's (Lowerings.td) GPUKernel lowerings.
#include "Lowerings.cpp.inc"

/// The first option of `options` that the kernels cannot take, as "<option>
/// must be <what they take>, got <value>"; none when all are valid.
static std::optional<std::string>
invalidOption(const ConvertMoEToGPUOptions &options) {
  auto quoted = [](StringRef value) { return ("'" + value + "'").str(); };
  struct Check {
    StringRef arg;
    bool valid;
    StringRef allowed;
    std::string value;
  };
  const int64_t blockSize = options.blockSize;
  const Check checks[] = {
      {"block-size",
       blockSize >= kWarp && blockSize % kWarp == 0 && blockSize <= 1024,
       "a multiple of 32 in [32, 1024]", std::to_string(blockSize)},
      {"shared-memory-bytes", options.sharedMemoryBytes > 0, "positive",
       std::to_string(options.sharedMemoryBytes)},
      {"dynamic-shared-memory-bytes", options.dynamicSharedMemoryBytes >= 0,
       "0 or positive", std::to_string(options.dynamicSharedMemoryBytes)},
      {"topk-rounds",
       llvm::is_contained({"butterfly", "redux", "list", "list-redux"},
                          options.topkRounds),
       "butterfly, redux, list or list-redux", quoted(options.topkRounds)},
      {"flash-mma-block-rows",
       llvm::is_contained({64, 128}, options.flashMmaBlockRows), "64 or 128",
       std::to_string(options.flashMmaBlockRows)},
      {"flash-mma-key-splits",
       options.flashMmaKeySplits >= 1 && options.flashMmaKeySplits <= 16,
       "in [1, 16]", std::to_string(options.flashMmaKeySplits)},
      {"route-map", llvm::is_contained({"warp", "lanes"}, options.routeMap),
       "warp or lanes", quoted(options.routeMap)},
  };
  for (const Check &check : checks)
    if (!check.valid)
      return (check.arg + " must be " + check.allowed + ", got " + check.value)
          .str();
  return std::nullopt;
}

namespace {
struct ConvertMoEToGPUPass
    : public moe::impl::ConvertMoEToGPUBase<ConvertMoEToGPUPass> {
  using Base::Base;

  /// The options' values as the patterns take them.
  ConvertMoEToGPUOptions getOptions() const {
    ConvertMoEToGPUOptions options;
    options.blockSize = blockSize;
    options.sharedMemoryBytes = sharedMemoryBytes;
    options.topkRounds = topkRounds;
    options.balanceKernels = balanceKernels;
    options.flashMmaBlockRows = flashMmaBlockRows;
    options.flashMmaKeySplits = flashMmaKeySplits;
    options.flashMmaGrad = flashMmaGrad;
    options.flashCausalBalance = flashCausalBalance;
    options.flashMmaTf32 = flashMmaTf32;
    options.dynamicSharedMemoryBytes = dynamicSharedMemoryBytes;
    options.routeMap = routeMap;
    return options;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    ConvertMoEToGPUOptions options = getOptions();
    if (std::optional<std::string> error = invalidOption(options)) {
      module.emitError("convert-moe-to-gpu: ") << *error;
      return signalPassFailure();
    }
    RewritePatternSet patterns(&getContext());
    populateMoEToGPUPatterns(patterns, options);
    llvm::SmallDenseSet<OperationName> lowered;
    for (const auto &pattern : patterns.getNativePatterns())
      if (std::optional<OperationName> root = pattern->getRootKind())
        lowered.insert(*root);

    // The moe ops may stay rather than illegal: one whose pattern fails has
    // said why at the op, and stays in place without a second "failed to
    // legalize" error; the walk below reports the ops without a pattern. No
    // folding: the ops lower as written.
    ConversionTarget target(getContext());
    configureMoEConversionTarget(target, MoEOpsAfter::MayStay);
    ConversionConfig config;
    config.foldingMode = DialectConversionFoldingMode::Never;
    if (failed(applyPartialConversion(module, target, std::move(patterns),
                                      config)))
      return signalPassFailure();

    bool failed = false;
    module.walk([&](Operation *op) {
      if (!isa_and_nonnull<MoEDialect>(op->getDialect()) ||
          isa<KernelOp, KernelEndOp>(op))
        return;
      failed = true;
      if (!lowered.contains(op->getName()))
        op->emitOpError("has no GPU lowering");
    });
    if (auto kernels = module.lookupSymbol<gpu::GPUModuleOp>("moe_kernels")) {
      module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                      UnitAttr::get(module.getContext()));
      if (mlir::failed(lowerSubgroupReductions(kernels)))
        failed = true;
    }
    if (failed)
      signalPassFailure();
  }
};
} // namespace
