//===- Passes.td - Conversions out of the moe dialect ------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg"> {
  let summary = "Lower moe ops to linalg, tensor, arith, math and scf (the portable CPU reference)";
  let description = [{
    Rewrites every `moe` op into upstream structured ops on tensors: `linalg.generic` reductions, `linalg.matmul`,
    `linalg.softmax` where one fits, `tensor` reshapes and `scf` loops where the computation is sequential by
    nature (top-k selection rounds, online-softmax key tiles). The result stays on tensors, so one-shot
    bufferization and the upstream CPU pipeline take it from there (see `moe-lower-to-llvm`).
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::cf::ControlFlowDialect",
    "::mlir::func::FuncDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
  ];
}

#endif // MOE_CONVERSION_PASSES_TD
