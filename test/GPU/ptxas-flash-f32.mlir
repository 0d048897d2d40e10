// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_90 --lower-chip sm_90 --pipeline-options "flash-mix-wide=true" --split-input-file --all-nospill --out %t.md %moe_src_root/test/Conversion/MoEToGPU/similarity_inform_wide.mlir %moe_src_root/test/GPU/Inputs/gpu-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t.md
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_90 --lower-chip sm_90 --pipeline-options "flash-mix-wide=true flash-mma-tf32=true" --split-input-file --all-nospill --out %t.tf32.md %moe_src_root/test/Conversion/MoEToGPU/similarity_inform_tf32.mlir %moe_src_root/test/GPU/Inputs/gpu-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TF32 < %t.tf32.md

// The f32 flash mixing kernels behind options assemble for sm_90 (the chip of
// the lease that decides them; sm_80 joins when an option is adopted and its
// kernels enter ptxas-sweep) without local memory: the wide form
// (flash-mix-wide, FlashMixWide.cpp) assembles without local memory at the
// block counts it states to ptxas (nvvm.minctasm, flashMixWideBlocks): its
// lowering test's
// chunks (K = 12, 24 with a mask, causal and the lse, 64, the fused top-k,
// ws, attention_posterior) and every case of the GPU harness under the
// option (the training forwards' recomputed mixing of the backward too); and
// the 3xTF32 tensor-core kernel (flash-mma-tf32, FlashTf32.cpp, with the wide
// form beside it as the lease's folder builds them): its lowering test's
// chunks (D = 64, K = 12; D = 40, K = 64 in 32-key tiles, causal, masked,
// the lse) and the harness's cases.

// CHECK: ptxas report: {{[0-9]+}} kernels, 0 failures
// TABLE: | sm_90 | sim | similarity_inform_0 | {{[0-9]+}} | 16640 | 0 | 0 | 0 |
// TABLE: | sm_90 | big | similarity_inform_0 | {{[0-9]+}} | 28928 | 0 | 0 | 0 |
// TF32: | sm_90 | sim | similarity_inform_tf32_0 | {{[0-9]+}} | 47104 | 0 | 0 | 0 |
// TF32: | sm_90 | fwd | similarity_inform_fwd_tf32_0 | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
