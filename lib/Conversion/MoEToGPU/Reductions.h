//===- Reductions.h - Warp and block reductions ----------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The row kernels reduce a row's partial sums and maxima over the lanes that
// hold it (a group of a warp) or over a whole block; both are deterministic
// (a fixed combination order), so a kernel's result does not depend on
// scheduling. Warp reductions are gpu.subgroup_reduce ops until the pass
// lowers them to shuffles (lowerSubgroupReductions).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_REDUCTIONS_H
#define MOE_LIB_CONVERSION_MOETOGPU_REDUCTIONS_H

#include "GpuKernelBuilder.h"

namespace mlir::moe::gpu_lowering {

enum class ReduceKind { Sum, Max, MaxI64 };

/// Butterfly reduction over aligned groups of `width` lanes (a power of two
/// <= 32): every lane of the group gets the result. f32 Sum/Max
/// (NaN-propagating) are gpu.subgroup_reduce ops (cluster_size = width);
/// i64 signed max (MaxI64) is built here from 32-bit shuffles.
Value subgroupReduce(GpuKernelBuilder &kb, Value v, ReduceKind kind,
                     int64_t width);

/// Lowers the gpu.subgroup_reduce ops of `kernels` to gpu.shuffle butterflies
/// (offsets 1, 2, 4, ...) with upstream's patterns: no upstream pass applies
/// them, and gpu-to-nvvm lowers only i32 reductions (to redux.sync).
LogicalResult lowerSubgroupReductions(gpu::GPUModuleOp kernels);

/// Block reduction (blockDim.x = `threads`, a multiple of 32): warp butterfly,
/// one value per warp through `scratch` (a workgroup memref of at least
/// threads/32 elements of v's type), then every thread combines the warp
/// values in warp order, so the result is deterministic. Contains two
/// barriers; every thread of the block must reach it.
Value blockReduce(GpuKernelBuilder &kb, Value v, ReduceKind kind,
                  int64_t threads, Value scratch);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_REDUCTIONS_H
