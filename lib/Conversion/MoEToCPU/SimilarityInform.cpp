//===- SimilarityInform.cpp - moe.similarity_inform -> fast CPU kernel ----===//
//
// Part of the MoE-MLIR project.
//
// The flash-style mixing kernel of Flash.h with q = u (or u·ws, one
// vectorized projection pass), keys u transposed once into [B, D, Npad], and
// the logit epilogue x = dot / tau, -inf where the key is masked (key_mask,
// causal j > i, or padding). Peak extra memory: the packed keys, values and
// queries, O(N·(D+K)) floats.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"

namespace mlir::moe::cpu_lowering {

namespace {
/// moe.similarity_inform, and moe.similarity_inform_fwd: the same kernel
/// writing the row log-sum-exp it computes anyway.
template <typename OpTy>
struct SimilarityInformKernel : KernelPattern<OpTy, /*TargetLanes=*/false> {
  using KernelPattern<OpTy, false>::KernelPattern;
  static constexpr bool kWithLse = std::is_same_v<OpTy, SimilarityInformFwdOp>;

  LogicalResult emit(OpTy op, CpuKernelBuilder &kb,
                     PatternRewriter &rw) const override {
    const KernelOptions &opts = this->opts;
    SmallVector<Value> uSizes = kb.sizes(op.getU());
    SmallVector<SmallVector<Value>> outSizes = {
        {uSizes[0], uSizes[1], kb.sizes(op.getE())[2]}};
    if (kWithLse)
      outSizes.push_back({uSizes[0], uSizes[1]});
    KernelScope kernel(kb, {op.getU(), op.getE(), op.getKeyMask(), op.getWs()},
                       KernelScope::outsOf(op, outSizes));
    Value u = kb.buffer(op.getU()), e = kb.buffer(op.getE());
    Value mask = op.getKeyMask() ? kb.buffer(op.getKeyMask()) : Value();
    Value batch = kb.dim(u, 0), rows = kb.dim(u, 1), depth = kb.dim(u, 2);
    Value keysPad = roundUp(kb, rows, kKeyTile);
    bool causal = op.getCausal();
    float tau = op.getTau().convertToFloat();

    // Keys transposed per key tile: kT[b, j / TK, d, j % TK] = u[b, j, d].
    Value keysT = packKeysT(kb, opts, u, batch, rows, depth);

    // Key validity (padding and key_mask) as 1.0 / 0.0, when needed.
    auto uType = cast<RankedTensorType>(op.getU().getType());
    bool padded = uType.isDynamicDim(1) || uType.getDimSize(1) % kKeyTile != 0;
    Value keyValid;
    if (mask || padded)
      keyValid = keyValidity(kb, mask, batch, rows, keysPad);

    // Queries: u, or q = u · ws (vector over the output features).
    Value q = u;
    if (op.getWs())
      q = projectRows(kb, opts, u, kb.buffer(op.getWs()), batch, rows, depth,
                      depth);

    Value out = kernel.out(0);
    FlashSpec spec = flashSpec(
        kb, q, keysT, keysPad, e, out, batch, rows, rows, depth,
        scaledMaskedLogits(keyValid, kernels::similarityInformLogit(
                                         tau, causal, static_cast<bool>(mask))),
        causal);
    if (kWithLse)
      spec.lse = kernel.out(1);
    if (causal || op.getWs()) {
      emitFlashMix(kb, opts, spec);
    } else {
      // Symmetric logits: half the pairs where the guard holds, this kernel
      // where it does not (FlashSymmetric.cpp).
      SymmetricMixSpec sym{u,     keysT, e,     keyValid, out,   spec.lse,
                           batch, rows,  keysPad, depth,  kb.dim(e, 2), tau};
      emitSymmetricMix(kb, opts, sym, [&] { emitFlashMix(kb, opts, spec); });
    }

    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

void populateSimilarityInformLowering(RewritePatternSet &patterns,
                                      const KernelOptions &options) {
  patterns.add<SimilarityInformKernel<SimilarityInformOp>>(
      patterns.getContext(), options);
}

void populateSimilarityInformFwdLowering(RewritePatternSet &patterns,
                                         const KernelOptions &options) {
  patterns.add<SimilarityInformKernel<SimilarityInformFwdOp>>(
      patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
