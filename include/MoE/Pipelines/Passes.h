//===- Passes.h - The dense CPU strategy of moe-lower-to-llvm ---*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_PASSES_H
#define MOE_PIPELINES_PASSES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
namespace linalg {
class LinalgOp;
} // namespace linalg

namespace moe {
#define GEN_PASS_DECL
#include "MoE/Pipelines/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "MoE/Pipelines/Passes.h.inc"

/// Whether moe-linalg-to-blas takes `op` (an f32 contraction that is one GEMM
/// per batch element: matmul, batch_matmul or a generic in any operand
/// layout, A or B possibly broadcast over the batch; static sizes, M*N*K >=
/// minFlops per batch);
/// strides are checked on buffers only. Shared by the tensor-level strategy,
/// which leaves these ops untiled.
bool isBlasCandidate(linalg::LinalgOp op, int64_t minFlops);

/// The unit attribute moe-dense-tile-and-vectorize puts on the matmuls it
/// leaves to BLAS (before tiling them into thread tiles);
/// moe-linalg-to-blas calls BLAS for those whatever their tile size.
inline constexpr llvm::StringLiteral kBlasAttrName = "moe.blas";
} // namespace moe
} // namespace mlir

#endif // MOE_PIPELINES_PASSES_H
