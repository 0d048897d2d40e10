// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_90 --lower-chip sm_90 --pipeline-options "flash-mma-tf32=true" --split-input-file --all-nospill --out %t.tf32.md %moe_src_root/test/Conversion/MoEToGPU/similarity_inform_tf32.mlir %moe_src_root/test/GPU/Inputs/gpu-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TF32 < %t.tf32.md

// The f32 flash mixing kernel behind an option assembles for sm_90 (the chip
// of the lease that decides it; sm_80 joins when the option is adopted and
// its kernels enter ptxas-sweep) without local memory: the 3xTF32
// tensor-core kernel (flash-mma-tf32, FlashTf32.cpp): its lowering test's
// chunks (D = 64, K = 12; D = 40, K = 64 in 32-key tiles, causal, masked,
// the lse) and every case of the GPU harness under the option (the training
// forwards' recomputed mixing of the backward too).

// CHECK: ptxas report: {{[0-9]+}} kernels, 0 failures
// TF32: | sm_90 | sim | similarity_inform_tf32_0 | {{[0-9]+}} | 47104 | 0 | 0 | 0 |
// TF32: | sm_90 | fwd | similarity_inform_fwd_tf32_0 | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
