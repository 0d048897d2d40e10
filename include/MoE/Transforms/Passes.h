//===- Passes.h - Dialect-level rewrites of moe ops -------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TRANSFORMS_PASSES_H
#define MOE_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
class RewritePatternSet;

namespace moe {
#define GEN_PASS_DECL
#include "MoE/Transforms/Passes.h.inc"

/// Mixing op + its only consumer, a probs-mode top-k -> one fused op.
void populateFuseRoutingPatterns(RewritePatternSet &patterns);

/// Fused routing op -> mixing op + top-k (the inverse, for lowerings that
/// handle the two separately).
void populateSplitFusedRoutingPatterns(RewritePatternSet &patterns);

/// What moe-legalize-shapes does to `root`: checks every moe op against the
/// kernels' size limits (moe::checkKernelLimits) and rewrites zero-sized ops
/// into their defined results. Fails, with a diagnostic, on a size beyond a
/// limit. Conversion passes that can run alone call it first.
LogicalResult legalizeShapes(Operation *root);

/// What moe-order-constant-globals does to `module`: bufferization's constant
/// globals moved and renamed in the order of their first use.
void orderConstantGlobals(ModuleOp module);

#define GEN_PASS_REGISTRATION
#include "MoE/Transforms/Passes.h.inc"
} // namespace moe
} // namespace mlir

#endif // MOE_TRANSFORMS_PASSES_H
