// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --lower-chip sm_80 --split-input-file --all-nospill --out %t.md %moe_src_root/test/Conversion/MoEToGPU/*.mlir %moe_src_root/test/GPU/Inputs/gpu-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t.md
// RUN: not %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --lower-chip sm_90 --out %t.bad.md %s 2>&1 | FileCheck %s --check-prefix=BADCHIP

// No kernel lowered from any GPU test input uses local memory on sm_80 or
// sm_90: every `// -----` chunk of the lowering tests that expects no
// diagnostic, and the GPU harness's cases (ptxas-report.mlir covers
// Inputs/ptxas-cases.mlir). The script fails on spill stores/loads, a stack
// frame or lmem of any kernel (--all-nospill). Each chunk is lowered once, for
// sm_80, and its PTX assembled for both chips (--lower-chip: our passes emit
// the same kernels for both; the lowering was two thirds of this test's time).
// sm_90's own lowering runs in sass-budget, ptxas-report, gpu-check-selftest
// and the ASan run's gpu-sweep.

// CHECK: ptxas report: {{[0-9]+}} kernels, 0 failures

// PTX lowered for sm_90 cannot be assembled for sm_80: refused before any lowering.
// BADCHIP: --lower-chip sm_90: every chip of --chips must be at least it

// The key-major and query-major backward kernels of the harness that spilled
// before the flash backward kernels stated their blocks per multiprocessor.
// TABLE-DAG: | sm_80 | simgrad_k256 | similarity_inform_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | simgrad_k256 | similarity_inform_grad_dq_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | apgrad | attention_posterior_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | apgrad_bf16 | attention_posterior_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-NOT: Failures
