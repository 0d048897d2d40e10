//===- Passes.td - Dialect-level rewrites of moe ops -------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TRANSFORMS_PASSES_TD
#define MOE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def MoEFuseRouting : Pass<"moe-fuse-routing"> {
  let summary = "Fuse each mixing op with the top-k gate that consumes it";
  let description = [{
    Rewrites `moe.similarity_inform` (`moe.attention_posterior`) whose mixed probabilities `p` feed only a
    `moe.topk_renorm mode(probs)` into one `moe.similarity_inform_topk` (`moe.attention_posterior_topk`): the
    Mutual-Inform SMoE gates of eq 11 and eq 17 as one op, so that the GPU kernel selects the experts in its epilogue
    and `p` ([B, N, K]) never goes to memory. A `p` with other users is left alone (fusing would compute the mixing
    twice). The rewrite is exact: the fused op is defined as the composition.
  }];
}

def MoESplitFusedRouting : Pass<"moe-split-fused-routing"> {
  let summary = "Split fused routing ops back into the mixing op and its top-k gate";
  let description = [{
    The inverse of `moe-fuse-routing`, used by the portable lowering (which lowers the two ops one after the other)
    and handy to compare the fused and unfused forms.
  }];
}

#endif // MOE_TRANSFORMS_PASSES_TD
