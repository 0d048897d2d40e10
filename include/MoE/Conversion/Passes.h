//===- Passes.h - Conversions out of the moe dialect ------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_PASSES_H
#define MOE_CONVERSION_PASSES_H

#include "MoE/Conversion/MoEToCPU/MoEToCPU.h"
#include "MoE/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/Pass/Pass.h"

namespace mlir::moe {
#define GEN_PASS_REGISTRATION
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

#endif // MOE_CONVERSION_PASSES_H
