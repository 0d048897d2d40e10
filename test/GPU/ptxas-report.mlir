// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --out %moe_obj_root/test/GPU/ptxas-report.md %S/Inputs/ptxas-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %moe_obj_root/test/GPU/ptxas-report.md

// Every kernel of every op assembles with ptxas for sm_80 and sm_90 and uses
// no local memory: every function of the cases is a nospill_ one, and the
// script fails on spill stores/loads, a stack frame or lmem of any kernel.
// The flash backward kernels (dq, dk) state 3 blocks per multiprocessor
// (FlashGrad.cpp): the causal and saved-statistics similarity grads and the
// f32 attention grad spilled in the key-major kernel under ptxas's own
// occupancy target. ptxas-sweep.mlir holds every test input's kernels to the
// same.
// The per-kernel table (registers, smem, stack, spills) is written to
// build/test/GPU/ptxas-report.md (a copy is kept in bench/results/).

// CHECK: ptxas report: {{[0-9]+}} kernels, 0 failures

// TABLE-DAG: | sm_80 | nospill_topk_k256 | topk_renorm_warp_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | {{.*}} | similarity_inform_topk_{{[0-9]+}} |
// TABLE-DAG: | sm_90 | {{.*}} | attention_posterior_topk_{{[0-9]+}} |
// TABLE-DAG: | sm_90 | {{.*}} | mad_epilogue_{{[0-9]+}} |
// TABLE-DAG: | sm_90 | nospill_topk_k8_logits | topk_renorm_warp_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_route_deepseek_v3 | route_lanes_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_route_kimi_k2 | route_lanes_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_dispatch_plan | dispatch_scatter_{{[0-9]+}} |
// TABLE-DAG: | sm_90 | nospill_similarity_inform_grad | similarity_inform_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_similarity_inform_grad_k256 | similarity_inform_grad_mix_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_hyper_bf16_dynamic | hyper_router_out_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_hyper_router_grad | hyper_router_grad_layer_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_hyper_router_grad | hyper_router_grad_sum_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_hyper_router_grad_frozen_bf16 | hyper_router_grad_layer_{{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_attention_posterior_grad | attention_posterior_grad_dq_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_attention_posterior_grad | attention_posterior_grad_mix_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_attention_posterior_grad_k256 | attention_posterior_grad_dq_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_attention_posterior_grad_k256 | attention_posterior_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_similarity_ws_mask | similarity_inform_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_similarity_inform_grad_causal | similarity_inform_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_similarity_inform_grad_saved | similarity_inform_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_attention_posterior_grad_f32 | attention_posterior_grad_dk_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-NOT: Failures
