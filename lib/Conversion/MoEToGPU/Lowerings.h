//===- Lowerings.h - One GPU lowering per moe op ----------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One conversion pattern per moe op (populateMoEToGPUPatterns adds them all):
// each rewrites one tensor-level op into host code + kernels (see
// KernelUtils.h) and replaces its results; on failure it emits an error on
// the op and leaves the IR unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
#define MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H

#include "Limits.h"
#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/Transforms/DialectConversion.h"

#include <optional>

namespace mlir::moe::gpu_lowering {

/// The per-op patterns of convert-moe-to-gpu (one file each in this
/// directory) derive from this: `lower` rewrites the op through the rewriter
/// into host code + kernels (KernelUtils.h), or emits an error on the op and
/// changes nothing. The kernels it made must then fit the CUDA limits
/// (Limits.h); one that does not is a match failure with the limit named at
/// the op, and the conversion driver rolls the lowering back.
template <typename OpTy>
class GPULoweringPattern : public OpConversionPattern<OpTy> {
public:
  GPULoweringPattern(MLIRContext *context,
                     const ConvertMoEToGPUOptions &options)
      : OpConversionPattern<OpTy>(context), options(options) {}

  LogicalResult
  matchAndRewrite(OpTy op, typename OpTy::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const final {
    KernelLimitCheck limits(op->template getParentOfType<ModuleOp>(), op,
                            options.sharedMemoryBytes);
    if (failed(lower(op, adaptor, rewriter)))
      return failure();
    return limits.verify();
  }

protected:
  virtual LogicalResult lower(OpTy op, typename OpTy::Adaptor adaptor,
                              ConversionPatternRewriter &rewriter) const = 0;
  ConvertMoEToGPUOptions options;
};

/// Declares the pattern `NAME` of `OP`, whose `lower` is defined in the op's
/// file.
#define MOE_GPU_LOWERING_PATTERN(NAME, OP)                                     \
  struct NAME final : GPULoweringPattern<OP> {                                 \
    using GPULoweringPattern::GPULoweringPattern;                              \
    LogicalResult lower(OP op, OpAdaptor adaptor,                              \
                        ConversionPatternRewriter &rewriter) const override;   \
  }

MOE_GPU_LOWERING_PATTERN(TopkRenormToGPU, TopkRenormOp);
// SimilarityInform.cpp and AttentionPosterior.cpp: one lowering for the op
// and its fused top-k form (the same operands, one result more).
MOE_GPU_LOWERING_PATTERN(SimilarityInformToGPU, SimilarityInformOp);
MOE_GPU_LOWERING_PATTERN(SimilarityInformTopkToGPU, SimilarityInformTopkOp);
MOE_GPU_LOWERING_PATTERN(AttentionPosteriorToGPU, AttentionPosteriorOp);
MOE_GPU_LOWERING_PATTERN(AttentionPosteriorTopkToGPU, AttentionPosteriorTopkOp);
MOE_GPU_LOWERING_PATTERN(MadDispersionToGPU, MadDispersionOp);
MOE_GPU_LOWERING_PATTERN(AdjacencyUpdateToGPU, AdjacencyUpdateOp);
MOE_GPU_LOWERING_PATTERN(HyperRouterToGPU, HyperRouterOp);
MOE_GPU_LOWERING_PATTERN(RouteToGPU, RouteOp);
MOE_GPU_LOWERING_PATTERN(DispatchPlanToGPU, DispatchPlanOp);
MOE_GPU_LOWERING_PATTERN(TopkRenormGradToGPU, TopkRenormGradOp);
MOE_GPU_LOWERING_PATTERN(HyperRouterGradToGPU, HyperRouterGradOp);
#undef MOE_GPU_LOWERING_PATTERN

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
gpu::GPUFuncOp createFlashMixKernel(class HostCode &h, StringRef name,
                                    const FlashMixSpec &spec,
                                    TypeRange argTypes, Location loc);
/// Creates the kernel for `args` (createFlashMixKernel) and launches it on
/// them: grid (ceil(N / rows), B) with N the rows of `q`, block 128.
void launchFlashMix(class HostCode &h, StringRef name, const FlashMixSpec &spec,
                    Value q, ValueRange args, Location loc);

/// A memref of rank >= 1 viewed as 2-D [rows, last]: rank 1 gets a unit
/// leading dim, rank > 2 has its leading dims collapsed (identity layouts).
Value viewAs2D(ImplicitLocOpBuilder &b, Value memref);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
