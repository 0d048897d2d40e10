//===- MoEEnums.td - Attribute modes of the moe ops --------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEENUMS_TD
#define MOE_IR_MOEENUMS_TD

include "mlir/IR/EnumAttr.td"

def MoE_TopkMode : I32EnumAttr<"TopkMode", "what the scores of moe.topk_renorm are", [
    I32EnumAttrCase<"logits", 0>,
    I32EnumAttrCase<"probs", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_HeadSelect : I32EnumAttr<"HeadSelect", "which attention heads moe.attention_posterior uses", [
    I32EnumAttrCase<"min_entropy", 0>,
    I32EnumAttrCase<"all", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_DispersionMeasure : I32EnumAttr<"DispersionMeasure", "per-cluster dispersion measure", [
    I32EnumAttrCase<"mad", 0>,
    I32EnumAttrCase<"variance", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_DispersionNormalize : I32EnumAttr<"DispersionNormalize",
    "the axis over which AC weights are rescaled to mean 1", [
    I32EnumAttrCase<"feature", 0>,
    I32EnumAttrCase<"expert", 1>,
    I32EnumAttrCase<"global", 2>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_EmptyCluster : I32EnumAttr<"EmptyCluster",
    "how clusters with fewer than two tokens are weighted", [
    I32EnumAttrCase<"identity", 0>,
    I32EnumAttrCase<"raw", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_AdjacencyNorm : I32EnumAttr<"AdjacencyNorm",
    "normalization of the co-selection counts", [
    I32EnumAttrCase<"row", 0>,
    I32EnumAttrCase<"col", 1>,
    I32EnumAttrCase<"none", 2>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

#endif // MOE_IR_MOEENUMS_TD
