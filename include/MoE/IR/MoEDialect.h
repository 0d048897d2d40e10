//===- MoEDialect.h - The moe routing dialect -------------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEDIALECT_H
#define MOE_IR_MOEDIALECT_H

#include "mlir/IR/Dialect.h"

#include "MoE/IR/MoEOpsDialect.h.inc"

#endif // MOE_IR_MOEDIALECT_H
