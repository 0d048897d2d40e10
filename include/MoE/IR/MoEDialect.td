//===- MoEDialect.td - The moe routing dialect -------------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEDIALECT_TD
#define MOE_IR_MOEDIALECT_TD

include "mlir/IR/OpBase.td"

def MoE_Dialect : Dialect {
  let name = "moe";
  let cppNamespace = "::mlir::moe";
  let summary = "Routing ops of sparse Mixture-of-Experts models";
  let description = [{
    The `moe` dialect expresses the *routing step* of sparse Mixture-of-Experts (SMoE) layers as value-semantic
    tensor ops, one op per routing idea of four recent routers:

    | op | router | paper |
    |----|--------|-------|
    | `moe.topk_renorm` | top-k gate of every SMoE | Mutual-Inform App. A.3 eq 24/25, HyperRouter eq 2, ACMoE eq 1, Symphony eq 8 |
    | `moe.similarity_inform` | Similarity-Inform SMoE | Mutual-Inform §3.1 eq 5, 8, 11 |
    | `moe.attention_posterior` | Attention-Inform SMoE | Mutual-Inform §3.2 Lemma 1, eq 13–17 |
    | `moe.mad_dispersion` | ACMoE adaptive clustering | Tight Clusters Def. 1, eq 21 |
    | `moe.adjacency_update` | SymphonySMoE co-selection graph | Symphony Alg. 1, eq 6–7 |
    | `moe.hyper_router` | HyperRouter router generation | HyperRouter eq 2, App. C.1, C.4 |

    Conventions shared by every op:
    * Float operands may be `f32`, `f16` or `bf16`; every reduction and softmax accumulates in `f32`, and float
      results are `f32`.
    * Index results are `i32`; index operands may be `i32` or `i64`.
    * Ties in every top-k and argmin/argmax break to the **lowest index**; top-k results are sorted by descending
      value.
    * A masked (−inf) logit never receives probability, and a row whose every entry is masked yields zeros, never
      NaN. NaN inputs propagate to the rows they touch (never silently masked); indices stay in range.
    * The verifier checks every static size and attribute range it can; data-dependent errors (an `assign` or
      `idx` value out of range) are run-time errors of the lowering, never out-of-bounds accesses.
    * Zero-sized dimensions are valid and have defined results: a result without elements is empty; a mixing op
      without keys yields `p = 0` (every key masked) and head 0 (`min_entropy`: no row enters the mean) or -1
      (`all`); an empty feature dimension gives zero dot products. Static zero sizes are rewritten into these
      results before any lowering (`moe-legalize-shapes`, also part of canonicalization). `attention_posterior`
      needs at least one head.
    * Size limits: a tensor operand or result may have at most 2^31 - 1 elements (the kernels index with i32, the
      index results are i32); larger static sizes are compile-time errors (`moe-legalize-shapes`).
  }];
  // arith and tensor: the folds and the zero-size canonicalizations create
  // constants, tensor.empty and tensor.splat.
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::tensor::TensorDialect"];
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 1;
}

class MoE_Op<string mnemonic, list<Trait> traits = []>
    : Op<MoE_Dialect, mnemonic, traits>;

#endif // MOE_IR_MOEDIALECT_TD
