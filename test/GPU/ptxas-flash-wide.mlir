// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --lower-chip sm_80 --pipeline-options "flash-mix-wide=true" --split-input-file --all-nospill --out %t.md %moe_src_root/test/Conversion/MoEToGPU/similarity_inform_wide.mlir %moe_src_root/test/GPU/Inputs/gpu-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t.md

// The f32 flash mixing kernel's wide form (flash-mix-wide, FlashMixWide.cpp)
// assembles for sm_80 and sm_90 without local memory at the block counts it
// states to ptxas (nvvm.minctasm, flashMixWideBlocks): its lowering test's
// chunks (K = 12, 24 with a mask, causal and the lse, 64, the fused top-k,
// ws, attention_posterior) and every case of the GPU harness under the
// option (the training forwards' recomputed mixing of the backward too).

// CHECK: ptxas report: {{[0-9]+}} kernels, 0 failures
// TABLE: | sm_90 | sim | similarity_inform_0 | 128 | 16640 | 0 | 0 | 0 |
// TABLE: | sm_90 | big | similarity_inform_0 | {{[0-9]+}} | 28928 | 0 | 0 | 0 |
