// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --pipeline-options balance-kernels=true --keep-ptx %t --out %t/report.md %S/Inputs/ptxas-balance-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t/report.md
// RUN: FileCheck %s --check-prefix=PTX < %t/ptxas-balance-cases.sm_80.0.ptx
// RUN: FileCheck %s --check-prefix=PTX < %t/ptxas-balance-cases.sm_90.0.ptx
// RUN: FileCheck %s --check-prefix=NOATOM < %t/ptxas-balance-cases.sm_80.0.ptx
// RUN: FileCheck %s --check-prefix=NOATOM < %t/ptxas-balance-cases.sm_90.0.ptx

// The load-balancing kernels (moe-lower-to-nvvm balance-kernels=true,
// RouterZLoss.cpp, RouterStats.cpp) assemble with ptxas for sm_80 and sm_90
// without local memory (every case is a nospill_ one): the row-block kernels
// of the z-loss (64 row values in workgroup memory) and of router_stats (64
// shifts and k-th picks), their block-order sums, the gradients and the
// load-balancing loss.
// Their reductions are warp butterflies and fixed-order loops: no atomics.

// CHECK: ptxas report: 24 kernels, 0 failures

// TABLE-DAG: | sm_80 | nospill_z_loss_bf16_e64 | router_z_loss_rows_{{[0-9]+}} | {{[0-9]+}} | 256 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_z_loss_bf16_e64 | router_z_loss_rows_{{[0-9]+}} | {{[0-9]+}} | 256 | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_z_loss_f32_dyn | router_z_loss_sum_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_z_loss_f32_dyn | router_z_loss_rows_{{[0-9]+}} | {{[0-9]+}} | 256 | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_z_loss_grad_f32_e256 | router_z_loss_grad_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_z_loss_grad_f16_e100 | router_z_loss_grad_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_stats_bf16_e64_k2_mask | router_stats_rows_{{[0-9]+}} | {{[0-9]+}} | 768 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_stats_f32_e256_k8 | router_stats_rows_{{[0-9]+}} | {{[0-9]+}} | 768 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_stats_f32_e256_k8 | router_stats_sum_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_stats_grad_f16_dyn_mask | router_stats_grad_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_load_balancing_loss_e64 | load_balancing_loss_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-NOT: Failures

// PTX-DAG: .entry router_z_loss_rows_0
// PTX-DAG: .entry router_z_loss_sum_0
// PTX-DAG: .entry router_z_loss_grad_0
// PTX-DAG: .entry router_stats_rows_0
// PTX-DAG: .entry router_stats_sum_0
// PTX-DAG: .entry router_stats_grad_0
// PTX-DAG: .entry load_balancing_loss_0
// PTX-DAG: shfl.sync.bfly.b32
// PTX-DAG: bar.sync
// NOATOM-NOT: {{^[[:space:]]*(atom|red)\.}}
