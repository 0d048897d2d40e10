//===- Lowerings.h - One GPU lowering per moe op ----------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Each function rewrites one tensor-level op into host code + kernels (see
// KernelUtils.h) and replaces its results; on failure it emits an error on
// the op and leaves the IR unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
#define MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

#include <optional>

namespace mlir::moe::gpu_lowering {

struct LoweringOptions {
  /// Threads per block of the token-parallel kernels.
  int64_t blockSize = 128;
};

LogicalResult lowerTopkRenorm(TopkRenormOp op, ModuleOp module,
                              const LoweringOptions &options);
LogicalResult lowerSimilarityInform(Operation *op, ModuleOp module,
                                    const LoweringOptions &options);
LogicalResult lowerAttentionPosterior(Operation *op, ModuleOp module,
                                      const LoweringOptions &options);
LogicalResult lowerMadDispersion(MadDispersionOp op, ModuleOp module,
                                 const LoweringOptions &options);
LogicalResult lowerAdjacencyUpdate(AdjacencyUpdateOp op, ModuleOp module,
                                   const LoweringOptions &options);
LogicalResult lowerHyperRouter(HyperRouterOp op, ModuleOp module,
                               const LoweringOptions &options);

/// The flash-style mixing kernel shared by similarity_inform and
/// attention_posterior (SimilarityInform.cpp):
///   logit[i,j] = <q_i, key_j> / scaleDiv (+ bias[b,j]) (+ add[b,head[b],i,j]),
///   -inf where j is masked (key_mask false, causal j > i, j >= Nk);
///   out[b,i,:] = Σ_j softmax_j(logit[i,:]) · e[b,j,:]   (0 for a masked row)
/// and, with a top-k, TopM_Renormalize(out) in the epilogue.
struct FlashMixSpec {
  /// Experts (static, <= kFlashMaxExperts).
  int64_t numExperts = 0;
  /// Divisor of the dot products (tau, or sigma^2).
  double scaleDiv = 1.0;
  bool causal = false;
  bool hasKeyMask = false;
  bool hasBias = false;
  bool hasAddScores = false;
  /// Fused top-k (probs mode) in the epilogue.
  std::optional<int64_t> topk;
  bool renormalize = true;
};

/// The largest expert count of the flash kernel (accumulator in registers,
/// value tile in workgroup memory).
constexpr int64_t kFlashMaxExperts = 256;

/// Creates the kernel; its arguments, in order: q [B,N,D], keys [B,Nk,D],
/// e [B,Nk,K], then key_mask [B,Nk] (i1), bias [B,Nk] (f32), add [B,H,N,Nk]
/// and head [B] (i32) when present, then the outputs: p [B,N,K], or weights
/// and indices [B,N,k]. Launch with launchFlashMix.
gpu::GPUFuncOp createFlashMixKernel(ModuleOp module, StringRef name,
                                    const FlashMixSpec &spec,
                                    TypeRange argTypes, Location loc);
/// Launches it: grid (ceil(N / rows), B), block 128.
void launchFlashMix(class HostCode &h, gpu::GPUFuncOp kernel, Value q,
                    ValueRange args);

/// A memref of rank >= 1 viewed as 2-D [rows, last]: rank 1 gets a unit
/// leading dim, rank > 2 has its leading dims collapsed (identity layouts).
Value viewAs2D(ImplicitLocOpBuilder &b, Value memref);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
