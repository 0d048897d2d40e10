//===- Patterns.h - The per-op moe -> linalg patterns -----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One entry point per op, each defined in the file named after the op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOLINALG_PATTERNS_H
#define MOE_LIB_CONVERSION_MOETOLINALG_PATTERNS_H

namespace mlir {
class RewritePatternSet;
namespace moe::lowering {
void populateTopkRenormPattern(RewritePatternSet &patterns);
void populateSimilarityInformPattern(RewritePatternSet &patterns);
void populateAttentionPosteriorPattern(RewritePatternSet &patterns);
void populateMadDispersionPattern(RewritePatternSet &patterns);
void populateAdjacencyUpdatePattern(RewritePatternSet &patterns);
void populateHyperRouterPattern(RewritePatternSet &patterns);
} // namespace moe::lowering
} // namespace mlir

#endif // MOE_LIB_CONVERSION_MOETOLINALG_PATTERNS_H
