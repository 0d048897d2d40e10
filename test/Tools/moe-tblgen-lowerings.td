// tools/moe-tblgen on the op table (include/MoE/Conversion/Lowerings.td): each conversion gets one populate
// function per record that names it, in its namespace and with its options, and a populateLowerings that calls
// them in the table's order; the table's mistakes are tblgen errors.
// RUN: moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel %tblgen_includes %s | FileCheck %s --check-prefix=CPU
// RUN: moe-tblgen -gen-moe-lowering-decls -lowering-target=Portable %tblgen_includes %s | FileCheck %s --check-prefix=PORTABLE
// RUN: moe-tblgen -gen-moe-lowering-registration -lowering-target=GPUKernel %tblgen_includes %s | FileCheck %s --check-prefix=GPU
// RUN: not moe-tblgen -gen-moe-lowering-decls %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=NO-TARGET
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=MoE_TopkRenormOp %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=NOT-TARGET
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel -D TWICE %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel -D UNNAMED %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=UNNAMED

include "MoE/Conversion/Lowerings.td"

#ifdef TWICE
def : OpLowering<MoE_TopkRenormOp, [CPUKernel]>;
#endif
#ifdef UNNAMED
def : Lowering<"", [MoE_RouteOp, MoE_DispatchPlanOp], [CPUKernel]>;
#endif

// CPU:      namespace mlir::moe::cpu_lowering {
// CPU:      /// The patterns of moe.topk_renorm.
// CPU-NEXT: void populateTopkRenormLowering(::mlir::RewritePatternSet &patterns, const ::mlir::moe::cpu_lowering::KernelOptions &options);
// CPU:      /// The patterns of moe.route, moe.dispatch_plan.
// CPU-NEXT: void populateRouteDispatchPlanLowering(
// CPU-NOT:  populateLoadBalancingLossLowering
// CPU:      void populateLowerings(::mlir::RewritePatternSet &patterns, const ::mlir::moe::cpu_lowering::KernelOptions &options);
// CPU:      } // namespace mlir::moe::cpu_lowering

// The portable lowering takes no options, and has no fused routing op (they are split first).
// PORTABLE:     namespace mlir::moe::linalg_lowering {
// PORTABLE:     void populateTopkRenormLowering(::mlir::RewritePatternSet &patterns);
// PORTABLE-NOT: populateSimilarityInformTopkLowering
// PORTABLE:     void populateBiasUpdateLowering(::mlir::RewritePatternSet &patterns);

// GPU:      void mlir::moe::gpu_lowering::populateLowerings(::mlir::RewritePatternSet &patterns, const ::mlir::moe::ConvertMoEToGPUOptions &options) {
// GPU-NEXT:   mlir::moe::gpu_lowering::populateTopkRenormLowering(patterns, options);
// GPU-NEXT:   mlir::moe::gpu_lowering::populateSimilarityInformLowering(patterns, options);
// GPU-NEXT:   mlir::moe::gpu_lowering::populateSimilarityInformTopkLowering(patterns, options);
// GPU-NOT:    populateBiasUpdateLowering
// GPU:        mlir::moe::gpu_lowering::populateLoadBalancingLossLowering(patterns, options);
// GPU:      }

// NO-TARGET:  error: -lowering-target=<LoweringTarget record> is required
// NOT-TARGET: error: no LoweringTarget named 'MoE_TopkRenormOp'
// TWICE:      error: populateTopkRenormLowering is declared twice for CPUKernel
// UNNAMED:    error: a lowering of several ops needs a name
