//===- SimilarityInform.cpp - moe.similarity_inform -> GPU kernels --------===//
//
// Part of the MoE-MLIR project.
//
// moe.similarity_inform, its training forward and its fused top-k form: the
// logit u_i . u_j / tau (or (u_i^T ws) . u_j, with q = u . ws formed first by
// a row projection), causal and key-masked, on the flash mixing kernel
// (FlashMix.cpp), which attention_posterior's posterior shares.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Lowerings.h"

#include "MoE/Kernels/OnlineSoftmax.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

/// similarity_inform or its fused top-k form (the same operands, one result
/// more).
template <typename OpTy>
static LogicalResult
lowerSimilarityInform(OpTy op, typename OpTy::Adaptor adaptor,
                      ConversionPatternRewriter &rewriter,
                      const ConvertMoEToGPUOptions &options) {
  auto fused = dyn_cast<SimilarityInformTopkOp>(op.getOperation());
  Value uT = adaptor.getU(), eT = adaptor.getE(), wsT = adaptor.getWs(),
        maskT = adaptor.getKeyMask();
  FailureOr<int64_t> K = flashExpertCount(op, eT);
  if (failed(K))
    return failure();

  FlashMixSpec spec{similarityInformLogit(
      op.getTau().convertToDouble(), op.getCausal(), static_cast<bool>(maskT))};
  spec.numExperts = *K;
  spec.balanceCausal = options.flashCausalBalance;
  if (fused) {
    spec.topk = topkSpecOf(fused);
  }
  // The training forward also writes the row log-sum-exp (its result 1).
  bool training = isa<SimilarityInformFwdOp>(op.getOperation());
  spec.withLse = training;

  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Value u = h.buffer(uT);
  Value e = h.buffer(eT);
  Value q = u;
  Value projected;
  if (wsT) {
    Value ws = h.buffer(wsT);
    auto uType = cast<MemRefType>(u.getType());
    auto qType = MemRefType::get(uType.getShape(), b.getF32Type());
    projected = h.alloc(
        qType, dynamicSizesFrom(kb, cast<RankedTensorType>(uT.getType()), u));
    launchRowProjection(h, "similarity_project", u, ws, projected,
                        /*transposed=*/false, /*accumulate=*/false,
                        op->getLoc());
    q = projected;
  }
  SmallVector<Value> args = {q, u, e};
  if (maskT)
    args.push_back(h.buffer(maskT));
  SmallVector<Value> results;
  for (Value result : op->getResults()) {
    auto type = cast<RankedTensorType>(result.getType());
    results.push_back(h.allocLike(type, dynamicSizesFrom(kb, type, u)));
  }
  args.append(results);
  // Tensor cores for f16/bf16 operands without ws (q = u · ws is
  // f32), the fused top-k too; the scalar kernel otherwise.
  auto elementOf = [](Value v) {
    return cast<MemRefType>(v.getType()).getElementType();
  };
  std::optional<FlashMmaTile> mma;
  if (!projected)
    mma = flashMmaTile(spec, elementOf(q), elementOf(u), elementOf(e),
                       cast<MemRefType>(u.getType()).getShape()[2], options);
  // f32 operands on tensor cores by 3xTF32 (flash-mma-tf32) where it
  // applies; the fused top-k stays on the scalar kernel.
  std::optional<FlashTf32Tile> tf32;
  if (!mma && !fused)
    tf32 = flashTf32Tile(spec, elementOf(q), elementOf(u), elementOf(e),
                         cast<MemRefType>(u.getType()).getShape()[2], options);
  launchFlashMixKernel(h,
                       fused      ? "similarity_inform_topk"
                       : training ? "similarity_inform_fwd"
                                  : "similarity_inform",
                       spec, mma, tf32, q, args, op->getLoc());
  if (projected)
    h.release(projected);
  h.finish();
  h.replace(op, results);
  return success();
}

template <>
LogicalResult GPULowering<SimilarityInformOp>::lower(
    SimilarityInformOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  return lowerSimilarityInform(op, adaptor, rewriter, options);
}

template <>
LogicalResult GPULowering<SimilarityInformFwdOp>::lower(
    SimilarityInformFwdOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  return lowerSimilarityInform(op, adaptor, rewriter, options);
}

template <>
LogicalResult GPULowering<SimilarityInformTopkOp>::lower(
    SimilarityInformTopkOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  return lowerSimilarityInform(op, adaptor, rewriter, options);
}
