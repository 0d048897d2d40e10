// The reference manual in docs/ is generated from ODS; run scripts/gen-docs.sh after changing a .td file.
// RUN: diff %moe_obj_root/docs/MoE/MoEOps.md %moe_src_root/docs/MoEOps.md
// RUN: diff %moe_obj_root/docs/MoE/MoEConversionPasses.md %moe_src_root/docs/MoEConversionPasses.md
// RUN: diff %moe_obj_root/docs/MoE/MoETransformsPasses.md %moe_src_root/docs/MoETransformsPasses.md
// RUN: diff %moe_obj_root/docs/MoE/MoEDensePasses.md %moe_src_root/docs/MoEDensePasses.md
