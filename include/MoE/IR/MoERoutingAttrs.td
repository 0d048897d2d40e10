//===- MoERoutingAttrs.td - Modes of the production routing ops -*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// The typed mode attributes of moe.route and moe.dispatch_plan
// (MoERoutingOps.td). Included from MoEAttrs.td, so that the enum and
// attribute definitions are generated with the others.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEROUTINGATTRS_TD
#define MOE_IR_MOEROUTINGATTRS_TD

def MoE_RouteScoring : I32EnumAttr<"RouteScoring", "how moe.route turns logits into gate scores", [
    I32EnumAttrCase<"softmax", 0>,
    I32EnumAttrCase<"sigmoid", 1>,
    I32EnumAttrCase<"none", 2>,
    I32EnumAttrCase<"custom", 3>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_RouteOrder : I32EnumAttr<"RouteOrder", "whether moe.route scores before or after the top-k", [
    I32EnumAttrCase<"score_then_topk", 0>,
    I32EnumAttrCase<"topk_then_score", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_GroupScore : I32EnumAttr<"GroupScore", "how moe.route ranks a group of experts", [
    I32EnumAttrCase<"top2_sum", 0>,
    I32EnumAttrCase<"max", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_CapacityDrop : I32EnumAttr<"CapacityDrop",
    "the order in which moe.dispatch_plan's assignments claim an expert's capacity", [
    I32EnumAttrCase<"position", 0>,
    I32EnumAttrCase<"probability", 1>]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_RouteScoringAttr : MoE_EnumAttr<MoE_RouteScoring, "scoring">;
def MoE_RouteOrderAttr : MoE_EnumAttr<MoE_RouteOrder, "order">;
def MoE_GroupScoreAttr : MoE_EnumAttr<MoE_GroupScore, "group_score">;
def MoE_CapacityDropAttr : MoE_EnumAttr<MoE_CapacityDrop, "drop">;

#endif // MOE_IR_MOEROUTINGATTRS_TD
