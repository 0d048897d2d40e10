//===- Gemv.h - The warp-per-row GEMV kernel --------------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The GPU instance of the hypernetwork's matrix-vector product
// (MoE/Kernels/Gemv.h), shared by moe.hyper_router (HyperRouter.cpp) and the
// recomputation of its hidden layer in moe.hyper_router_grad
// (HyperRouterGrad.cpp): a warp per row, lane l holding column l of every
// 32-column chunk (each load of the warp one coalesced 128-byte line of the
// row), the four accumulators and their order of the shared row dot, then a
// butterfly sum over the warp.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_GEMV_H
#define MOE_LIB_CONVERSION_MOETOGPU_GEMV_H

#include "HostCode.h"

namespace mlir::moe::gpu_lowering {

/// Called by lane 0 of the warp of row `row` with the row's value, in the
/// kernel's body (its arguments after m, x and bias are the caller's).
using GemvStore = function_ref<void(GPUKernel &, Value row, Value v)>;

/// A kernel `name` on `args` = (m [R, C], x [C], bias [R], any float, then
/// the caller's) computing row r of relu?(m · x + bias) (kernels::gemvRow)
/// and handing it to `store`, launched over the rows of m.
void launchGemv(HostCode &host, StringRef name, ValueRange args, Location loc,
                bool relu, GemvStore store);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_GEMV_H
