// tools/moe-tblgen on the op table (include/MoE/Conversion/Lowerings.td): each conversion gets one populate
// function per record that names it, in its namespace and with its options, and a populateLowerings that calls
// them in the table's order; where the target has a default pattern (not the CPU kernels) and the record does
// not list the target in customPopulate, the populate function is generated too (under its OnlyWith option),
// with the declaration its pattern needs; the table's mistakes are tblgen errors.
// RUN: moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel %tblgen_includes %s | FileCheck %s --check-prefix=CPU
// RUN: moe-tblgen -gen-moe-lowering-decls -lowering-target=Portable %tblgen_includes %s | FileCheck %s --check-prefix=PORTABLE
// RUN: moe-tblgen -gen-moe-lowering-registration -lowering-target=Portable %tblgen_includes %s | FileCheck %s --check-prefix=PORTABLE-DEF
// RUN: moe-tblgen -gen-moe-lowering-registration -lowering-target=GPUKernel %tblgen_includes %s | FileCheck %s --check-prefix=GPU
// RUN: moe-tblgen -gen-moe-lowering-decls -lowering-target=GPUKernel %tblgen_includes %s | FileCheck %s --check-prefix=GPU-DECL
// RUN: moe-tblgen -gen-moe-lowering-registration -lowering-target=CPUKernel %tblgen_includes %s | FileCheck %s --check-prefix=CPU-DEF
// RUN: moe-tblgen -gen-moe-lowering-decls -lowering-target=GPUKernel -D CUSTOM %tblgen_includes %s | FileCheck %s --check-prefix=CUSTOM-DECL
// RUN: moe-tblgen -gen-moe-lowering-registration -lowering-target=GPUKernel -D CUSTOM %tblgen_includes %s | FileCheck %s --check-prefix=CUSTOM-DEF
// RUN: not moe-tblgen -gen-moe-lowering-decls %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=NO-TARGET
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=MoE_TopkRenormOp %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=NOT-TARGET
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel -D TWICE %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel -D UNNAMED %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=UNNAMED
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=Portable -D GUARD_NO_OPTIONS %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=GUARD-NO-OPTIONS
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=NoDefault -D GUARD_NO_DEFAULT %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=GUARD-NO-DEFAULT
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel -D UNKNOWN_TRAIT %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=UNKNOWN-TRAIT
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=CPUKernel -D MALFORMED_TRAIT %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=MALFORMED-TRAIT
// RUN: not moe-tblgen -gen-moe-lowering-decls -lowering-target=GPUKernel -D GUARD_CUSTOM %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=GUARD-CUSTOM

include "MoE/Conversion/Lowerings.td"

#ifdef TWICE
def : OpLowering<MoE_TopkRenormOp, [CPUKernel]>;
#endif
#ifdef UNNAMED
def : Lowering<"", [MoE_RouteOp, MoE_DispatchPlanOp], [CPUKernel]>;
#endif
#ifdef CUSTOM
let customPopulate = [GPUKernel] in
def : FusedLowering<"RouteDispatchPlan", [MoE_RouteOp, MoE_DispatchPlanOp], [GPUKernel]>;
#endif
#ifdef GUARD_NO_OPTIONS
let onlyWith = [OnlyWith<Portable, "balanceKernels">] in
def : FusedLowering<"Guarded", [MoE_RouteOp], [Portable]>;
#endif
#ifdef GUARD_NO_DEFAULT
def NoDefault : LoweringTarget<"::mlir::moe::no_default", "Options">;
let onlyWith = [OnlyWith<NoDefault, "balanceKernels">] in
def : FusedLowering<"Guarded", [MoE_RouteOp], [NoDefault]>;
#endif
#ifdef UNKNOWN_TRAIT
def : FusedLowering<"Traited", [MoE_RouteOp], [CPUKernel]> { let traits = ["lanes=false"]; }
#endif
#ifdef MALFORMED_TRAIT
def : FusedLowering<"Traited", [MoE_RouteOp], [CPUKernel]> { let traits = ["targetLanes"]; }
#endif
#ifdef GUARD_CUSTOM
let onlyWith = [OnlyWith<GPUKernel, "balanceKernels">], customPopulate = [GPUKernel] in
def : FusedLowering<"Guarded", [MoE_RouteOp], [GPUKernel]>;
#endif

// The CPU's default kernel: its traits (the record's, else the target's defaults) and its emit() specialization
// declared; a custom one (topk_renorm, the fused route + dispatch_plan) only its populate function.
// CPU:      namespace mlir::moe::cpu_lowering {
// CPU:      /// The patterns of moe.topk_renorm (defined in the op's file).
// CPU-NEXT: void populateTopkRenormLowering(::mlir::RewritePatternSet &patterns, const ::mlir::moe::cpu_lowering::KernelOptions &options);
// CPU:      /// The lowering of moe.mad_dispersion.
// CPU-NEXT: template <> struct CPUKernelTraits<::mlir::moe::MadDispersionOp> { static constexpr bool targetLanes = true, leaveZeroSized = false; };
// CPU-NEXT: template <> ::mlir::LogicalResult CPUKernel<::mlir::moe::MadDispersionOp>::emit(::mlir::moe::MadDispersionOp op, CpuKernelBuilder &kb, ::mlir::PatternRewriter &rw) const;
// CPU:      /// The lowering of moe.route_grad.
// CPU-NEXT: template <> struct CPUKernelTraits<::mlir::moe::RouteGradOp> { static constexpr bool targetLanes = false, leaveZeroSized = true; };
// CPU:      /// The patterns of moe.route, moe.dispatch_plan (defined in the op's file).
// CPU-NEXT: void populateRouteDispatchPlanLowering(
// CPU-NOT:  populateLoadBalancingLossLowering
// CPU:      void populateLowerings(::mlir::RewritePatternSet &patterns, const ::mlir::moe::cpu_lowering::KernelOptions &options);
// CPU:      } // namespace mlir::moe::cpu_lowering

// The portable lowering takes no options, and has no fused routing op (they are split first).
// PORTABLE:      namespace mlir::moe::linalg_lowering {
// PORTABLE:      /// The lowering of moe.topk_renorm.
// PORTABLE-NEXT: ::mlir::LogicalResult lowerTopkRenorm(::mlir::moe::TopkRenormOp op, ::mlir::PatternRewriter &rw);
// PORTABLE-NEXT: /// The patterns of moe.topk_renorm.
// PORTABLE-NEXT: void populateTopkRenormLowering(::mlir::RewritePatternSet &patterns);
// PORTABLE-NOT:  populateSimilarityInformTopkLowering
// PORTABLE:      void populateBiasUpdateLowering(::mlir::RewritePatternSet &patterns);

// The default populate functions, in the table's order, then populateLowerings.
// PORTABLE-DEF:      void mlir::moe::linalg_lowering::populateTopkRenormLowering(::mlir::RewritePatternSet &patterns) {
// PORTABLE-DEF-NEXT:   patterns.add<LinalgLowering<::mlir::moe::TopkRenormOp, lowerTopkRenorm>>(patterns.getContext());
// PORTABLE-DEF-NEXT: }
// PORTABLE-DEF:      void mlir::moe::linalg_lowering::populateLowerings(

// The GPU's: the pattern's lower() specialization declared, the load-balancing kernels under their option.
// GPU-DECL:      /// The lowering of moe.topk_renorm.
// GPU-DECL-NEXT: template <> ::mlir::LogicalResult GPULowering<::mlir::moe::TopkRenormOp>::lower(::mlir::moe::TopkRenormOp op, ::mlir::moe::TopkRenormOp::Adaptor adaptor, ::mlir::ConversionPatternRewriter &rewriter) const;
// GPU-DECL-NEXT: /// The patterns of moe.topk_renorm.
// GPU-DECL-NEXT: void populateTopkRenormLowering(
// GPU:      void mlir::moe::gpu_lowering::populateTopkRenormLowering(::mlir::RewritePatternSet &patterns, const ::mlir::moe::ConvertMoEToGPUOptions &options) {
// GPU-NEXT:   patterns.add<GPULowering<::mlir::moe::TopkRenormOp>>(patterns.getContext(), options);
// GPU-NEXT: }
// GPU:      void mlir::moe::gpu_lowering::populateRouterStatsLowering(
// GPU-NEXT:   if (options.balanceKernels)
// GPU-NEXT:     patterns.add<GPULowering<::mlir::moe::RouterStatsOp>>(patterns.getContext(), options);
// GPU-NEXT: }
// GPU:      void mlir::moe::gpu_lowering::populateLowerings(::mlir::RewritePatternSet &patterns, const ::mlir::moe::ConvertMoEToGPUOptions &options) {
// GPU-NEXT:   mlir::moe::gpu_lowering::populateTopkRenormLowering(patterns, options);
// GPU-NEXT:   mlir::moe::gpu_lowering::populateSimilarityInformLowering(patterns, options);
// GPU-NEXT:   mlir::moe::gpu_lowering::populateSimilarityInformTopkLowering(patterns, options);
// GPU-NOT:    populateBiasUpdateLowering
// GPU:        mlir::moe::gpu_lowering::populateLoadBalancingLossLowering(patterns, options);
// GPU:      }

// The CPU's default populate functions add the op's CPUKernel; a custom one is its file's.
// CPU-DEF-NOT: populateTopkRenormLowering(::mlir::RewritePatternSet
// CPU-DEF:     void mlir::moe::cpu_lowering::populateMadDispersionLowering(::mlir::RewritePatternSet &patterns, const ::mlir::moe::cpu_lowering::KernelOptions &options) {
// CPU-DEF-NEXT:  patterns.add<CPUKernel<::mlir::moe::MadDispersionOp>>(patterns.getContext(), options);
// CPU-DEF-NEXT: }
// CPU-DEF-NOT: populateRouteDispatchPlanLowering(::mlir::RewritePatternSet
// CPU-DEF:     void mlir::moe::cpu_lowering::populateLowerings(
// CPU-DEF-NOT: patterns.add

// A custom populate function is declared (and called), not defined, and needs no declaration for its pattern.
// CUSTOM-DECL-NOT: The lowering of moe.route, moe.dispatch_plan
// CUSTOM-DECL:     /// The patterns of moe.route, moe.dispatch_plan (defined in the op's file).
// CUSTOM-DECL-NEXT: void populateRouteDispatchPlanLowering(
// CUSTOM-DEF-NOT:  populateRouteDispatchPlanLowering(::mlir::RewritePatternSet
// CUSTOM-DEF:      mlir::moe::gpu_lowering::populateRouteDispatchPlanLowering(patterns, options);

// NO-TARGET:  error: -lowering-target=<LoweringTarget record> is required
// NOT-TARGET: error: no LoweringTarget named 'MoE_TopkRenormOp'
// TWICE:      error: populateTopkRenormLowering is declared twice for CPUKernel
// UNNAMED:    error: a lowering of several ops needs a name
// GUARD-NO-OPTIONS: error: OnlyWith<Portable>: the target has no options
// GUARD-NO-DEFAULT: error: OnlyWith<NoDefault>: the target has no default pattern
// UNKNOWN-TRAIT:    error: no target has the trait 'lanes'
// MALFORMED-TRAIT:  error: trait 'targetLanes' is not name=value
// GUARD-CUSTOM:     error: OnlyWith<GPUKernel> on a custom populate function
