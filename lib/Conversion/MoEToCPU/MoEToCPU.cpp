//===- MoEToCPU.cpp - The convert-moe-to-cpu pass
//--------------------------===//
//
// Part of the MoE-MLIR project.
//
// Gathers the per-op kernel patterns (one file per op in this directory,
// registered through the lowering table, Lowerings.td) and
// applies them in one partial conversion, the moe ops of unknown legality
// (MoE/Conversion/Legality.h, as convert-moe-to-gpu): an op without a kernel
// for its form stays, for convert-moe-to-linalg to lower. Fused routing ops are
// split first, as in convert-moe-to-linalg, so that their mixing op and gate
// get kernels.
//
// Parallelism. The kernels express their token/row-tile loops as an
// scf.parallel over `num-threads` workers (each worker takes whole items in a
// fixed cyclic order, so results are bit-identical whatever the thread count).
// moe-lower-to-llvm maps that loop onto the MLIR async runtime
// (async-parallel-for, one task per worker; libmlir_async_runtime.so ships with
// Debian's LLVM 22 and the ExecutionEngine loads it). OpenMP was the other
// candidate: the omp dialect lowers to __kmpc_* calls that need LLVM's libomp,
// which this machine does not have (no libomp in /usr/lib/llvm-22/lib;
// Debian package libomp5-22), and scf.forall would itself need one of the two.
// With num-threads = 1 the loop is a plain scf.for: no runtime library.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToCPU/MoEToCPU.h"
#include "Lowerings.h"

#include "MoE/Conversion/Legality.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEDialect.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/DialectConversion.h"
#include "mlir/Transforms/FoldUtils.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOCPU
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

void mlir::moe::populateMoEToCPUPatterns(
    RewritePatternSet &patterns, const ConvertMoEToCPUOptions &options) {
  cpu_lowering::KernelOptions opts;
  opts.numThreads = std::max<int64_t>(options.numThreads, 1);
  opts.vectorBits = options.vectorBits;
  cpu_lowering::populateLowerings(patterns, opts);
  populateSplitFusedRoutingPatterns(patterns);
}

// populateLowerings: the op table's (Lowerings.td) CPUKernel lowerings.
#include "Lowerings.cpp.inc"

bool mlir::moe::cpu_lowering::hasStaticZeroSize(Operation *op) {
  return llvm::any_of(op->getOperands(), [](Value v) {
    return llvm::is_contained(cast<RankedTensorType>(v.getType()).getShape(),
                              0);
  });
}

LogicalResult mlir::moe::cpu_lowering::checkIndexOperand(PatternRewriter &rw,
                                                         Operation *op,
                                                         Value indices,
                                                         Value bound,
                                                         MoEErrorOp which) {
  if (failed(linalg_lowering::emitIndexCheck(rw, op, indices, bound, which)))
    return rw.notifyMatchFailure(op, "needs an enclosing module to declare "
                                     "moeReportIndexError");
  return success();
}

LogicalResult mlir::moe::cpu_lowering::checkIndexOperand(PatternRewriter &rw,
                                                         Operation *op,
                                                         Value indices,
                                                         int64_t bound,
                                                         MoEErrorOp which) {
  return checkIndexOperand(rw, op, indices,
                           linalg_lowering::indexConst(rw, op->getLoc(), bound),
                           which);
}

namespace {
struct ConvertMoEToCPUPass
    : public moe::impl::ConvertMoEToCPUBase<ConvertMoEToCPUPass> {
  using Base::Base;
  void runOnOperation() override {
    int64_t bits = vectorBits;
    if (bits != 128 && bits != 256 && bits != 512) {
      emitError(getOperation()->getLoc())
          << "convert-moe-to-cpu: vector-bits must be 128, 256 or 512, got "
          << bits;
      return signalPassFailure();
    }
    RewritePatternSet patterns(&getContext());
    populateMoEToCPUPatterns(patterns, {numThreads, bits});
    // Every kernel is optional: a moe op whose kernel declines its form (a
    // match failure) stays for convert-moe-to-linalg. No folding: the ops
    // lower as written.
    ConversionTarget target(getContext());
    configureMoEConversionTarget(target, MoEOpsAfter::MayStay);
    ConversionConfig config;
    config.foldingMode = DialectConversionFoldingMode::Never;
    if (failed(applyPartialConversion(getOperation(), target,
                                      std::move(patterns), config)))
      return signalPassFailure();
    // The kernels create their constants where they use them: unique them at
    // the entry of each function, as the greedy driver would, so that this
    // pass's output stays readable (%c0 to %c8 step %c1; the kernels' lowering
    // tests check it). Nothing else is folded.
    SmallVector<Operation *> constants;
    getOperation()->walk([&](Operation *op) {
      if (op->hasTrait<OpTrait::ConstantLike>())
        constants.push_back(op);
    });
    OperationFolder folder(&getContext());
    for (Operation *op : constants)
      folder.insertKnownConstant(op);
  }
};
} // namespace

std::unique_ptr<Pass> mlir::moe::createConvertMoEToCPUPass(int64_t numThreads,
                                                           int64_t vectorBits) {
  ConvertMoEToCPUOptions options;
  options.numThreads = numThreads;
  options.vectorBits = vectorBits;
  return createConvertMoEToCPU(options);
}
