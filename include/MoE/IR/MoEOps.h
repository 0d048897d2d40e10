//===- MoEOps.h - The ops of the moe routing dialect ------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEOPS_H
#define MOE_IR_MOEOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Bufferization/IR/BufferizableOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEEnums.h.inc"

namespace mlir::moe {
/// Written result types may refine inferred shapes (a static size where the
/// operands leave it dynamic) but never contradict them or change the element
/// type.
bool compatibleResultTypes(TypeRange inferred, TypeRange written);

/// Rewrites ops with a static zero-sized dimension into their defined results
/// (tensor.empty for an empty result; p = 0 without keys; ...), so that no
/// kernel sees an empty extent. Part of every op's canonicalization patterns,
/// and of moe-legalize-shapes, which every pipeline runs first.
void populateDegenerateShapePatterns(RewritePatternSet &patterns,
                                     PatternBenefit benefit = 1);

/// The most elements one tensor operand or result of a moe op may have:
/// the kernels index with i32 and the index results (`indices`, `head`,
/// `counts`) are i32, so 2^31 - 1.
constexpr int64_t kMaxKernelElements = 2147483647;

/// Checks the static sizes of `op` (a moe op) against the kernels' limits and
/// emits an error naming the limit on the first one exceeded. Lowerings with
/// tighter limits (GPU shared memory) add their own checks after this one.
LogicalResult checkKernelLimits(Operation *op,
                                int64_t maxElements = kMaxKernelElements);
} // namespace mlir::moe

#define GET_ATTRDEF_CLASSES
#include "MoE/IR/MoEAttrs.h.inc"

#define GET_OP_CLASSES
#include "MoE/IR/MoEOps.h.inc"

#endif // MOE_IR_MOEOPS_H
