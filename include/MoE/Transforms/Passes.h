//===- Passes.h - Dialect-level rewrites of moe ops -------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TRANSFORMS_PASSES_H
#define MOE_TRANSFORMS_PASSES_H

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

#define GEN_PASS_REGISTRATION
#include "MoE/Transforms/Passes.h.inc"
} // namespace moe
} // namespace mlir

#endif // MOE_TRANSFORMS_PASSES_H
