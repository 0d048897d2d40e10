//===- MoEDialect.cpp - The moe routing dialect ---------------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;

#include "MoE/IR/MoEOpsDialect.cpp.inc"
#include "MoE/IR/MoEEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "MoE/IR/MoEAttrs.cpp.inc"

void MoEDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "MoE/IR/MoEAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "MoE/IR/MoEOps.cpp.inc"
      >();
}

/// Folders (hyper_router at inference) produce dense tensors; they become
/// `arith.constant`s so that the rest of the pipeline sees upstream IR.
Operation *MoEDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                           Type type, Location loc) {
  auto typed = dyn_cast<TypedAttr>(value);
  if (!typed || typed.getType() != type)
    return nullptr;
  return arith::ConstantOp::create(builder, loc, type, typed);
}
