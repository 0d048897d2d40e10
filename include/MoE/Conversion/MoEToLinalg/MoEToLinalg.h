//===- MoEToLinalg.h - Lower moe ops to linalg ------------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
#define MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H

#include "mlir/Pass/Pass.h"

namespace mlir {
class RewritePatternSet;

namespace moe {
#define GEN_PASS_DECL_CONVERTMOETOLINALG
#include "MoE/Conversion/Passes.h.inc"

/// Adds the conversion patterns that lower every moe op to
/// linalg/tensor/arith/math/scf (one per op, and the split of the fused
/// routing ops). Apply them with the dialect conversion driver, the moe ops
/// illegal: every op and form has a lowering here.
void populateMoEToLinalgPatterns(RewritePatternSet &patterns);
} // namespace moe
} // namespace mlir

#endif // MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
