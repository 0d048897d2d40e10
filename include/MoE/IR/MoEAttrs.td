//===- MoEAttrs.td - Typed mode attributes of the moe ops --*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEATTRS_TD
#define MOE_IR_MOEATTRS_TD

include "MoE/IR/MoEDialect.td"
include "MoE/IR/MoEEnums.td"

// Each mode prints bare inside an op (`mode(probs)`) and as `#moe<topk_mode probs>` in the generic form.
class MoE_EnumAttr<EnumAttrInfo info, string name>
    : EnumAttr<MoE_Dialect, info, name>;

def MoE_TopkModeAttr : MoE_EnumAttr<MoE_TopkMode, "topk_mode">;
def MoE_HeadSelectAttr : MoE_EnumAttr<MoE_HeadSelect, "head_select">;
def MoE_DispersionMeasureAttr : MoE_EnumAttr<MoE_DispersionMeasure, "measure">;
def MoE_DispersionNormalizeAttr : MoE_EnumAttr<MoE_DispersionNormalize, "normalize">;
def MoE_EmptyClusterAttr : MoE_EnumAttr<MoE_EmptyCluster, "empty">;
def MoE_AdjacencyNormAttr : MoE_EnumAttr<MoE_AdjacencyNorm, "norm">;
include "MoE/IR/MoERoutingAttrs.td"

#endif // MOE_IR_MOEATTRS_TD
