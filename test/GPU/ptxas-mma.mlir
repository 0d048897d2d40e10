// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --lower-chip sm_80 --pipeline-options "%flash_base64" --keep-ptx %t --out %t/report.md %S/Inputs/ptxas-mma-cases.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t/report.md
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --lower-chip sm_80 --out %t/report-default.md %S/Inputs/ptxas-mma-cases.mlir | FileCheck %s --check-prefix=SPLIT
// RUN: FileCheck %s --check-prefix=PTX < %t/ptxas-mma-cases.sm_80.0.ptx

// The tensor-core flash kernels (moe-lower-to-nvvm,
// FlashMma.cpp) assemble with ptxas for sm_80 and sm_90 without local memory
// (every case is a nospill_ one), and their PTX holds the warp-level MMA:
// mma.sync m16n8k16 on f16 and on bf16 operands with f32 sums, fed by
// ldmatrix (x4; .trans for the values). Each option set is lowered once, for
// sm_80, and assembled for both chips (--lower-chip; sass-budget lowers the
// tensor-core kernels for sm_90). The fused top-k's kernels too: their
// epilogue's candidates live beside the accumulators. attention_posterior's
// mixing and its _topk form too (4 kernels a case: entropy, head select,
// head means, the mixing), the bias and the added scores read into the
// logits' fragments. Two option sets: the kernel of one row tile a warp
// (%flash_base64: 64 rows a block, no key splits, the cp.async staging in
// two stages) and the defaults (two row tiles a warp where they fit, the
// keys split, the lazy rescale and three stages in dynamic shared memory;
// the split's combine kernels too). Each applies where it fits: the row sums
// on the tensor cores not past 160 registers of held fragments, nor for
// attention_posterior past D = 128; two row tiles only without
// attention_posterior and where both tiles' fragments fit.

// CHECK: ptxas report: 72 kernels, 0 failures
// The fused top-k's kernel of one row tile takes no 128-register cap with
// the cp.async staging: at 128 it spilled 12 bytes on sm_80 with a key mask,
// D = 40, K = 12.
// SPLIT: ptxas report: {{[0-9]+}} kernels, 0 failures

// TABLE-DAG: | sm_80 | nospill_mma_f16_d64_k16 | similarity_inform_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_bf16_d64_k16 | similarity_inform_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_bf16_d256_k64_causal | similarity_inform_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_f16_d256_k256 | similarity_inform_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_fwd_lse_f16 | similarity_inform_fwd_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_topk_f16_d64_k16 | similarity_inform_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_topk_bf16_d64_k16_causal | similarity_inform_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_topk_bf16_d256_k64 | similarity_inform_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_topk_f16_d256_k256 | similarity_inform_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_topk_f16_d16_k256 | similarity_inform_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_topk_bf16_mask_odd | similarity_inform_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_post_f16_d64_k16 | attention_posterior_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_post_f16_d64_k16 | attention_posterior_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_post_bf16_d64_k64 | attention_posterior_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_post_bf16_d256_k16 | attention_posterior_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_post_f16_d256_k64 | attention_posterior_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_post_f16_d256_k64 | attention_posterior_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | nospill_mma_post_topk_bf16_d64_k16 | attention_posterior_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | nospill_mma_post_topk_f16_d256_k64 | attention_posterior_topk_mma_{{[0-9]+}} | {{[0-9]+}} | {{[0-9]+}} | 0 | 0 | 0 |
// TABLE-NOT: Failures

// PTX-DAG: ldmatrix.sync.aligned.m8n8.x4.shared.b16
// PTX-DAG: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
// PTX-DAG: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// PTX-DAG: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
