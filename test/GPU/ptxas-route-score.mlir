// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --split-input-file --all-nospill --pipeline-options "route-map=warp" --out %t.md %moe_src_root/test/Conversion/MoEToGPU/route-score.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t.md
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --split-input-file --all-nospill --pipeline-options "route-map=lanes" --out %t.lanes.md %moe_src_root/test/Conversion/MoEToGPU/route-score.mlir | FileCheck %s

// moe.route with custom score regions (DeepSeek-V4's sqrtsoftplus before the top-k, x·tanh(x) + 2 after it),
// through moe-lower-to-nvvm and ptxas for sm_80 and sm_90, in both route mappings (a warp per token, and
// route-map=lanes): the inlined region (libdevice's expf, log1pf, sqrtf, tanhf) assembles without local memory
// (no spill, no stack frame). ptxas-sweep.mlir covers the same file with the other lowering tests; this test names
// the custom score's kernels.

// CHECK: ptxas report: {{[0-9]+}} kernels, 0 failures

// TABLE-DAG: | sm_80 | {{.*}}deepseek_v4_sqrtsoftplus | route_warp_0 | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | {{.*}}deepseek_v4_sqrtsoftplus | route_warp_0 | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | {{.*}}xtanh_topk_then_score | route_warp_0 | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | {{.*}}xtanh_topk_then_score | route_warp_0 | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
