//===- Kernels.h - The per-op fast CPU kernel patterns ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One entry point per op, each defined in the file named after the op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_KERNELS_H
#define MOE_LIB_CONVERSION_MOETOCPU_KERNELS_H

#include "KernelBuilder.h"

namespace mlir {
class RewritePatternSet;
namespace moe::cpu {
/// The base of the kernel patterns: benefit 2, so that a kernel wins over the
/// portable pattern of the same op when both are in one set.
template <typename OpTy> struct KernelPattern : OpRewritePattern<OpTy> {
  KernelPattern(MLIRContext *ctx, KernelOptions opts)
      : OpRewritePattern<OpTy>(ctx, /*benefit=*/2), opts(opts) {}
  KernelOptions opts;
};

void populateTopkRenormKernel(RewritePatternSet &p, const KernelOptions &o);
void populateSimilarityInformKernel(RewritePatternSet &p,
                                    const KernelOptions &o);
void populateAttentionPosteriorKernel(RewritePatternSet &p,
                                      const KernelOptions &o);
void populateMadDispersionKernel(RewritePatternSet &p, const KernelOptions &o);
void populateAdjacencyUpdateKernel(RewritePatternSet &p,
                                   const KernelOptions &o);
void populateHyperRouterKernel(RewritePatternSet &p, const KernelOptions &o);
/// moe.hyper_router's GEMV (HyperRouter.cpp), shared with its backward:
/// y = m · x + bias ([rows] f32, any float operands; ReLU when `relu`), rows
/// in memory order over row blocks on the workers.
Value hyperAffine(CK &k, const KernelOptions &opts, Value m, Value x,
                  Value bias, bool relu);
/// Matrices of at most this many elements (1 MiB of f32) run on the calling
/// thread in the hyper_router kernels: as at most CK::kInlineItems items.
constexpr int64_t kHyperInlineElements = 1 << 18;
void populateRouteKernel(RewritePatternSet &p, const KernelOptions &o);
void populateDispatchPlanKernel(RewritePatternSet &p, const KernelOptions &o);
/// moe.route feeding moe.dispatch_plan: one kernel (benefit 3).
void populateRouteDispatchPlanKernel(RewritePatternSet &p,
                                     const KernelOptions &o);
// Backward ops (MoEGradOps.td).
void populateSimilarityInformGradKernel(RewritePatternSet &p,
                                        const KernelOptions &o);
void populateTopkRenormGradKernel(RewritePatternSet &p, const KernelOptions &o);
void populateAttentionPosteriorGradKernel(RewritePatternSet &p,
                                          const KernelOptions &o);
void populateHyperRouterGradKernel(RewritePatternSet &p,
                                   const KernelOptions &o);
} // namespace moe::cpu
} // namespace mlir

#endif // MOE_LIB_CONVERSION_MOETOCPU_KERNELS_H
