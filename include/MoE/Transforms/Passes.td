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

def MoELegalizeShapes : Pass<"moe-legalize-shapes"> {
  let summary = "Reject sizes beyond the kernels' limits; rewrite zero-sized ops into their defined results";
  let description = [{
    Every pipeline runs this pass before it converts moe ops, so that the kernels only see shapes they support:

    * sizes: a tensor operand or result of a moe op with more than 2^31 - 1 elements (static sizes) is an error
      that names the limit (the kernels index with i32, the index results are i32); checked at compile time, not
      at run time. The check is `moe::checkKernelLimits` (MoE/IR/MoEOps.h), which lowerings with tighter limits
      call too;
    * zero-sized dimensions (static) are valid and every op defines its result for them: a result without
      elements becomes `tensor.empty`, a mixing op without keys yields `p = 0` and head 0 (`min_entropy`) or -1
      (`all`), an empty feature dimension (D = 0, Dh = 0) is rewritten onto one-wide zero operands, which give the
      same zero dot products (`moe::populateDegenerateShapePatterns`, also part of the ops' canonicalization).
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::tensor::TensorDialect"];
}

def MoEOrderConstantGlobals : Pass<"moe-order-constant-globals", "::mlir::ModuleOp"> {
  let summary = "Order and name the constant globals of bufferization by their first use";
  let description = [{
    One-shot bufferization across functions turns each tensor constant into a private `memref.global constant`
    named `__constant_<shape>` (`_0`, `_1`, ... on a clash) at the top of the module, in the order it bufferizes the
    functions. Upstream picks the next function without calls from a map keyed by the operation's address, so that
    order, and with it the globals' order and suffixes, changes from run to run. This pass moves those globals
    (private constants named `__constant_*` that a `memref.get_global` of the module uses) to the top of the module
    in the order of their first use in the IR and renames them `__constant_<shape>`, `__constant_<shape>_0`, ... in
    that order, so that the same input always lowers to the same text. Both pipelines run it right after their
    bufferization.
  }];
  let dependentDialects = ["::mlir::memref::MemRefDialect"];
}

#endif // MOE_TRANSFORMS_PASSES_TD
