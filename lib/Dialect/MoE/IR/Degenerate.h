//===- Degenerate.h - Zero-sized op patterns, one op at a time --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The canonicalizer gathers every op's patterns, so each op contributes only
// its own zero-size pattern (populateDegenerateShapePatterns adds them all).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_DIALECT_MOE_IR_DEGENERATE_H
#define MOE_LIB_DIALECT_MOE_IR_DEGENERATE_H

#include "mlir/IR/PatternMatch.h"

namespace mlir::moe::detail {
void populateDegenerateTopkPattern(RewritePatternSet &patterns,
                                   PatternBenefit benefit = 1);
void populateDegeneratePosteriorPattern(RewritePatternSet &patterns,
                                        PatternBenefit benefit = 1);
} // namespace mlir::moe::detail

#endif // MOE_LIB_DIALECT_MOE_IR_DEGENERATE_H
