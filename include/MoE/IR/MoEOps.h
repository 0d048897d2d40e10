//===- MoEOps.h - The ops of the moe routing dialect ------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEOPS_H
#define MOE_IR_MOEOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEEnums.h.inc"

namespace mlir::moe {
/// Written result types may refine inferred shapes (a static size where the
/// operands leave it dynamic) but never contradict them or change the element
/// type.
bool compatibleResultTypes(TypeRange inferred, TypeRange written);
} // namespace mlir::moe

#define GET_ATTRDEF_CLASSES
#include "MoE/IR/MoEAttrs.h.inc"

#define GET_OP_CLASSES
#include "MoE/IR/MoEOps.h.inc"

#endif // MOE_IR_MOEOPS_H
