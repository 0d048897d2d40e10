//===- Lowerings.td - Which op each conversion lowers -------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// The one table of the lowerings: a record per op (or per pattern that spans
// ops) naming the conversions that lower it. tools/moe-tblgen derives from it,
// per target, the declaration of one populate function per record, the
// definition of those whose body is the target's default pattern, and the
// target's populate-all function that its pass calls (-gen-moe-lowering-decls,
// -gen-moe-lowering-registration; lib/Conversion/MoETo*/CMakeLists.txt).
// A new op's lowering is one line here plus the op's file, which holds only
// the lowering (the portable lower<Name>, the CPU's CPUKernel<Op>::emit, the
// GPU's GPULowering<Op>::lower); where the record says customPopulate, the
// file defines
//   void populate<Name>Lowering(RewritePatternSet &, const <Options> &)
// in the target's namespace (<Name>: the op's C++ class without "Op").
//
// The table is a file of its own, over the ops' records, rather than a mixin
// on the op definitions: the dialect (include/MoE/IR) does not know its
// lowerings (MoEOps.h.inc stays as it is when a kernel is added, and the IR
// library builds without the conversions), and a pattern over several ops
// (route feeding dispatch_plan) is a record like the others. The ops are
// named by their ODS records, so a misspelt or deleted op is a tblgen error,
// and the C++ names come from ODS (mlir::tblgen::Operator).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_LOWERINGS_TD
#define MOE_CONVERSION_LOWERINGS_TD

include "MoE/IR/MoEOps.td"

/// A conversion: the namespace its populate functions are declared in, the
/// options they take ("" for none: the function takes the set alone), and its
/// default populate function, which adds `pattern` (constructed from the
/// context, and the options where the target has them) and needs `decl`
/// declared first. In both, $op is the C++ class of the record's (root) op
/// and $name the record's name; a target without a default pattern ("") has
/// every populate function written in its op's file.
class LoweringTarget<string ns, string opts, string pattern = "",
                     string decl = "", list<string> traits = []> {
  string cppNamespace = ns;
  string optionsType = opts;
  string defaultPattern = pattern;
  string defaultDecl = decl;
  /// "name=value" defaults of the traits a record may set (Lowering's
  /// `traits`), substituted for $name in the pattern and the declaration.
  list<string> traitDefaults = traits;
}

/// convert-moe-to-linalg (lib/Conversion/MoEToLinalg): the portable lowering.
/// Every op that can reach the end of a pipeline has one (the pass makes every
/// moe op illegal); the fused routing ops are split first instead
/// (populateSplitFusedRoutingPatterns).
/// An op's file defines lower<Name> (LinalgLowering, MoEToLinalg/Lowerings.h).
def Portable : LoweringTarget<"::mlir::moe::linalg_lowering", "",
    "LinalgLowering<$op, lower$name>",
    "::mlir::LogicalResult lower$name($op op, ::mlir::PatternRewriter &rw);">;
/// convert-moe-to-cpu (lib/Conversion/MoEToCPU): the fast CPU kernels
/// (benefit 2 over the portable pattern; an op whose form a kernel declines
/// stays for the portable lowering). An op's file defines the explicit
/// specialization CPUKernel<Op>::emit (MoEToCPU/Lowerings.h); its traits
/// (CPUKernelTraits: whether the kernel works in the target's vector lanes,
/// whether it leaves an op with a static zero-sized operand to the portable
/// lowering) are the record's. The kernels that are templates over several ops
/// (BalanceRows.h's LogitsRowKernel) or have a pattern of their own are
/// customPopulate.
def CPUKernel : LoweringTarget<"::mlir::moe::cpu_lowering",
    "::mlir::moe::cpu_lowering::KernelOptions", "CPUKernel<$op>",
    "template <> struct CPUKernelTraits<$op> { static constexpr bool "
    "targetLanes = $targetLanes, leaveZeroSized = $leaveZeroSized; };\n"
    "template <> ::mlir::LogicalResult CPUKernel<$op>::emit($op op, "
    "CpuKernelBuilder &kb, ::mlir::PatternRewriter &rw) const;",
    ["targetLanes=true", "leaveZeroSized=false"]>;
/// convert-moe-to-gpu (lib/Conversion/MoEToGPU): host code and CUDA kernels.
/// An op's file defines the explicit specialization GPULowering<Op>::lower
/// (MoEToGPU/Lowerings.h), declared here before the pattern is instantiated.
def GPUKernel : LoweringTarget<"::mlir::moe::gpu_lowering",
    "::mlir::moe::ConvertMoEToGPUOptions", "GPULowering<$op>",
    "template <> ::mlir::LogicalResult GPULowering<$op>::lower($op op, "
    "$op::Adaptor adaptor, ::mlir::ConversionPatternRewriter &rewriter) "
    "const;">;

/// A default populate function of `target` that adds its pattern only when
/// the target's options have the bool `option` set.
class OnlyWith<LoweringTarget t, string o> {
  LoweringTarget target = t;
  string option = o;
}

/// The patterns of `name` (populate<name>Lowering) on the ops `ops` in each
/// conversion of `targets`. The populate-all function of a target calls them
/// in the order of this file (which matters only between patterns of one
/// root op and one benefit). A target's populate function is its default
/// (generated), unless the target has none or is in `customPopulate` (the op's
/// file defines it: several patterns, or constructor arguments of its own);
/// `onlyWith` makes a target's default conditional on one of its options.
class Lowering<string name, list<Op> ops, list<LoweringTarget> targets> {
  string loweringName = name;
  list<Op> loweredOps = ops;
  list<LoweringTarget> loweringTargets = targets;
  list<LoweringTarget> customPopulate = [];
  list<OnlyWith> onlyWith = [];
  /// "name=value": a trait of the targets' default patterns (their
  /// traitDefaults name them).
  list<string> traits = [];
}

/// The lowering of one op, named after it.
class OpLowering<Op op, list<LoweringTarget> targets>
    : Lowering<"", [op], targets>;

/// A pattern that rewrites several ops at once (its root is the first).
class FusedLowering<string name, list<Op> ops, list<LoweringTarget> targets>
    : Lowering<name, ops, targets>;

defvar All = [Portable, CPUKernel, GPUKernel];

// The seed routers and their fused forms (MoEOps.td, MoEFusedOps.td). The
// fused forms have only the GPU's kernel: elsewhere they are split back into
// their mixing op and gate first.
def : OpLowering<MoE_TopkRenormOp, All> {
  let customPopulate = [CPUKernel];
}
def : OpLowering<MoE_SimilarityInformOp, All> {
  let customPopulate = [CPUKernel];
}
def : OpLowering<MoE_SimilarityInformTopkOp, [GPUKernel]>;
def : OpLowering<MoE_SimilarityInformFwdOp, All> {
  let customPopulate = [CPUKernel];
}
def : OpLowering<MoE_AttentionPosteriorOp, All> {
  let traits = ["targetLanes=false"];
}
def : OpLowering<MoE_AttentionPosteriorTopkOp, [GPUKernel]>;
def : OpLowering<MoE_MadDispersionOp, All>;
def : OpLowering<MoE_AdjacencyUpdateOp, All>;
def : OpLowering<MoE_HyperRouterOp, All>;

// The production routers (MoERoutingOps.td).
def : OpLowering<MoE_RouteOp, All> {
  let traits = ["targetLanes=false"];
}
def : OpLowering<MoE_RouteGradOp, All> {
  let traits = ["targetLanes=false", "leaveZeroSized=true"];
}
def : OpLowering<MoE_DispatchPlanOp, All> {
  let traits = ["targetLanes=false"];
}
// moe.route feeding moe.dispatch_plan: one CPU kernel (benefit 3, over the
// route kernel's 2; RouteDispatchPlan.cpp).
def : FusedLowering<"RouteDispatchPlan", [MoE_RouteOp, MoE_DispatchPlanOp],
                    [CPUKernel]> {
  let customPopulate = [CPUKernel];
}
def : OpLowering<MoE_BiasUpdateOp, [Portable]>;

// The backward ops (MoEGradOps.td).
def : OpLowering<MoE_SimilarityInformGradOp, All> {
  let traits = ["targetLanes=false", "leaveZeroSized=true"];
}
def : OpLowering<MoE_TopkRenormGradOp, All> {
  let traits = ["targetLanes=false"];
}
def : OpLowering<MoE_HyperRouterGradOp, All> {
  let traits = ["leaveZeroSized=true"];
}
def : OpLowering<MoE_AttentionPosteriorGradOp, All> {
  let traits = ["targetLanes=false", "leaveZeroSized=true"];
}

// The load-balancing statistics and losses (MoEBalanceOps.td). The GPU's
// kernels are added only with balance-kernels (default on since an H100 run
// checked them), so that balance-kernels=false restores the "has no GPU
// lowering" error of before.
// The CPU kernels of the logits-row ops are one template (BalanceRows.h's
// LogitsRowKernel), which their files add.
let onlyWith = [OnlyWith<GPUKernel, "balanceKernels">] in {
let customPopulate = [CPUKernel] in {
def : OpLowering<MoE_RouterStatsOp, All>;
def : OpLowering<MoE_RouterStatsGradOp, All>;
}
def : OpLowering<MoE_LoadBalancingLossOp, [Portable, GPUKernel]>;
let customPopulate = [CPUKernel] in {
def : OpLowering<MoE_RouterZLossOp, All>;
def : OpLowering<MoE_RouterZLossGradOp, All>;
}
}
def : OpLowering<MoE_SequenceBalanceLossOp, [Portable, CPUKernel]>;
def : OpLowering<MoE_SequenceBalanceLossGradOp, [Portable, CPUKernel]>;

#endif // MOE_CONVERSION_LOWERINGS_TD
