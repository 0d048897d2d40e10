//===- Lowerings.td - Which op each conversion lowers -------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// The one table of the lowerings: a record per op (or per pattern that spans
// ops) naming the conversions that lower it. tools/moe-tblgen derives from it,
// per target, the declaration of one populate function per record and the
// target's populate-all function that its pass calls (-gen-moe-lowering-decls,
// -gen-moe-lowering-registration; lib/Conversion/MoETo*/CMakeLists.txt).
// A new op's lowering is one line here plus the op's file, which defines
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

/// A conversion: the namespace its populate functions are declared in, and
/// the options they take ("" for none: the function takes the set alone).
class LoweringTarget<string ns, string opts> {
  string cppNamespace = ns;
  string optionsType = opts;
}

/// convert-moe-to-linalg (lib/Conversion/MoEToLinalg): the portable lowering.
/// Every op that can reach the end of a pipeline has one (the pass makes every
/// moe op illegal); the fused routing ops are split first instead
/// (populateSplitFusedRoutingPatterns).
def Portable : LoweringTarget<"::mlir::moe::linalg_lowering", "">;
/// convert-moe-to-cpu (lib/Conversion/MoEToCPU): the fast CPU kernels
/// (benefit 2 over the portable pattern; an op whose form a kernel declines
/// stays for the portable lowering).
def CPUKernel : LoweringTarget<"::mlir::moe::cpu_lowering",
                               "::mlir::moe::cpu_lowering::KernelOptions">;
/// convert-moe-to-gpu (lib/Conversion/MoEToGPU): host code and CUDA kernels.
def GPUKernel : LoweringTarget<"::mlir::moe::gpu_lowering",
                               "::mlir::moe::ConvertMoEToGPUOptions">;

/// The patterns of `name` (populate<name>Lowering) on the ops `ops` in each
/// conversion of `targets`. The populate-all function of a target calls them
/// in the order of this file (which matters only between patterns of one
/// root op and one benefit).
class Lowering<string name, list<Op> ops, list<LoweringTarget> targets> {
  string loweringName = name;
  list<Op> loweredOps = ops;
  list<LoweringTarget> loweringTargets = targets;
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
def : OpLowering<MoE_TopkRenormOp, All>;
def : OpLowering<MoE_SimilarityInformOp, All>;
def : OpLowering<MoE_SimilarityInformTopkOp, [GPUKernel]>;
def : OpLowering<MoE_SimilarityInformFwdOp, All>;
def : OpLowering<MoE_AttentionPosteriorOp, All>;
def : OpLowering<MoE_AttentionPosteriorTopkOp, [GPUKernel]>;
def : OpLowering<MoE_MadDispersionOp, All>;
def : OpLowering<MoE_AdjacencyUpdateOp, All>;
def : OpLowering<MoE_HyperRouterOp, All>;

// The production routers (MoERoutingOps.td).
def : OpLowering<MoE_RouteOp, All>;
def : OpLowering<MoE_RouteGradOp, All>;
def : OpLowering<MoE_DispatchPlanOp, All>;
// moe.route feeding moe.dispatch_plan: one CPU kernel (benefit 3, over the
// route kernel's 2; RouteDispatchPlan.cpp).
def : FusedLowering<"RouteDispatchPlan", [MoE_RouteOp, MoE_DispatchPlanOp],
                    [CPUKernel]>;
def : OpLowering<MoE_BiasUpdateOp, [Portable]>;

// The backward ops (MoEGradOps.td).
def : OpLowering<MoE_SimilarityInformGradOp, All>;
def : OpLowering<MoE_TopkRenormGradOp, All>;
def : OpLowering<MoE_HyperRouterGradOp, All>;
def : OpLowering<MoE_AttentionPosteriorGradOp, All>;

// The load-balancing statistics and losses (MoEBalanceOps.td). The GPU's are
// added only with its balance-kernels option (read in their populate
// functions).
def : OpLowering<MoE_RouterStatsOp, All>;
def : OpLowering<MoE_RouterStatsGradOp, All>;
def : OpLowering<MoE_LoadBalancingLossOp, [Portable, GPUKernel]>;
def : OpLowering<MoE_RouterZLossOp, All>;
def : OpLowering<MoE_RouterZLossGradOp, All>;
def : OpLowering<MoE_SequenceBalanceLossOp, [Portable, CPUKernel]>;
def : OpLowering<MoE_SequenceBalanceLossGradOp, [Portable, CPUKernel]>;

#endif // MOE_CONVERSION_LOWERINGS_TD
