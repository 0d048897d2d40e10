//===- KernelKeys.td - The torch ops' kernel keys as ops ----*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// A kernel of torch.ops.moe.* is named by its key (lib/Runtime/Torch:
// `op|attr=value|...|in:name:elem:dims|...`). This table says which ODS op
// each key builds; tools/moe-tblgen (-gen-moe-kernel-keys) derives from it and
// from the ops' ODS arguments the one function that turns a key into its op
// (KernelKey.h: buildKernelKeyOp), with the op's inferred result types and its
// verifier: a key's input is the operand, and a key's attribute the
// attribute, of the same name, unless `renames` maps the key's name to the
// ODS one (the torch schemas name cotangents `grad_*`, the ops `d*`). An
// input the key leaves out is an absent optional operand; an attribute left
// out, or given as `none`, takes its ODS default or is absent. Nothing about
// an op is written here but the names: its operands, attribute types and
// result types come from its ODS definition, so a key of an op that changes
// follows it, and a name the op does not have is a tblgen error.
//
// Used by the torch ops' kernel cache (python/moe_mlir/runtime/cache.py, through
// libmoe_compiler.so's moeKernelModule), by the FX importer for the moe ops of
// a whole graph (moeKernelKeyOp), and by `moe-opt --kernel-key`.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_KERNELKEYS_TD
#define MOE_IR_KERNELKEYS_TD

include "MoE/IR/MoEOps.td"

/// The key's name `key` for the ODS operand or attribute `ods`.
class KeyRename<string key, string ods> {
  string keyName = key;
  string odsName = ods;
}

/// The key `name` (its text before the first `|`) builds `op`. `extraAttrs`:
/// key attributes that are no attribute of the op (they choose the kernel's
/// results: KernelKey.cpp's keptResults).
class KernelKey<string name, Op op, list<KeyRename> names = []> {
  string keyName = name;
  Op keyOp = op;
  list<KeyRename> renames = names;
  list<string> extraAttrs = [];
}

defvar GradW = KeyRename<"grad_w", "dw">;
defvar GradP = KeyRename<"grad_p", "dp">;
defvar GradLoss = KeyRename<"grad", "dloss">;

// The seed routers (MoEOps.td, MoEFusedOps.td, MoEGradOps.td).
def : KernelKey<"topk_renorm", MoE_TopkRenormOp>;
def : KernelKey<"topk_renorm_backward", MoE_TopkRenormGradOp, [GradW]>;
def : KernelKey<"similarity_inform", MoE_SimilarityInformOp>;
def : KernelKey<"similarity_inform_fwd", MoE_SimilarityInformFwdOp>;
def : KernelKey<"similarity_inform_topk", MoE_SimilarityInformTopkOp>;
def : KernelKey<"similarity_inform_backward", MoE_SimilarityInformGradOp,
                [GradP]>;
def : KernelKey<"attention_posterior", MoE_AttentionPosteriorOp>;
def : KernelKey<"attention_posterior_topk", MoE_AttentionPosteriorTopkOp>;
def : KernelKey<"attention_posterior_backward", MoE_AttentionPosteriorGradOp,
                [GradP]>;
def : KernelKey<"mad_dispersion", MoE_MadDispersionOp>;
def : KernelKey<"adjacency_update", MoE_AdjacencyUpdateOp>;
def : KernelKey<"hyper_router", MoE_HyperRouterOp>;
def : KernelKey<"hyper_router_backward", MoE_HyperRouterGradOp,
                [GradW, KeyRename<"grad_b", "db">]> {
  let extraAttrs = ["weight_grads"];
}

// The production routers (MoERoutingOps.td). A custom score arrives as
// `scoring=custom:<region>` (KernelKey.cpp parses the region).
def : KernelKey<"route", MoE_RouteOp>;
def : KernelKey<"route_backward", MoE_RouteGradOp, [GradW]>;
def : KernelKey<"dispatch_plan", MoE_DispatchPlanOp>;
// The capacity plan: the kernel takes the weights always, the op only with
// drop(probability) (KernelKey.cpp).
def : KernelKey<"apply_capacity", MoE_DispatchPlanOp>;
def : KernelKey<"bias_update", MoE_BiasUpdateOp>;

// The load-balancing losses (MoEBalanceOps.td).
def : KernelKey<"router_stats_fwd", MoE_RouterStatsOp,
                [KeyRename<"top_k", "k">]>;
def : KernelKey<"router_stats_backward", MoE_RouterStatsGradOp,
                [KeyRename<"grad_mean_probs", "dmean_probs">]>;
def : KernelKey<"router_z_loss", MoE_RouterZLossOp>;
def : KernelKey<"router_z_loss_backward", MoE_RouterZLossGradOp, [GradLoss]>;
def : KernelKey<"sequence_balance_loss", MoE_SequenceBalanceLossOp>;
def : KernelKey<"sequence_balance_loss_backward",
                MoE_SequenceBalanceLossGradOp, [GradLoss]>;

#endif // MOE_IR_KERNELKEYS_TD
