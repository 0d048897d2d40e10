// A torch op's kernel key (lib/Runtime/Torch/TorchKernels.h) is the compiler's input: moe-opt --kernel-key builds
// its op with the ODS builder from include/MoE/IR/KernelKeys.td, infers the result types, wraps it in
// @kernel(inputs in the key's order) -> (the results the kernel returns), and verifies it: the module the torch ops'
// kernel cache compiles. This file is not read: each RUN line's key is the input.

// RUN: moe-opt --kernel-key='route|k=2|scoring=sigmoid|order=score_then_topk|n_group=2|topk_group=1|group_score=top2_sum|renormalize=1|routed_scaling_factor=2.5|device=cuda:0|in:logits:bf16:?x8|in:bias:f32:8' | FileCheck %s --check-prefix=ROUTE
// ROUTE:      func.func @kernel(%[[L:.*]]: tensor<?x8xbf16>, %[[B:.*]]: tensor<8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
// ROUTE-NEXT:   %[[W:.*]], %[[I:.*]] = moe.route %[[L]] bias(%[[B]] : tensor<8xf32>) k(2) scoring(sigmoid) n_group(2) renormalize(true) routed_scaling_factor(2.500000e+00) :
// ROUTE-NEXT:   return %[[W]], %[[I]]

// A custom score: the region is parsed from the key and checked by the op's region verifier.
// RUN: moe-opt --kernel-key='route|k=1|scoring=custom:^bb0(%x: f32): %y = math.tanh %x : f32 moe.yield %y : f32|in:logits:f32:?x4' | FileCheck %s --check-prefix=CUSTOM
// CUSTOM:      moe.route %{{.*}} k(1) scoring(custom) score {
// CUSTOM-NEXT: ^bb0(%[[X:.*]]: f32):
// CUSTOM-NEXT:   %[[S:.*]] = math.tanh %[[X]] : f32
// CUSTOM-NEXT:   moe.yield %[[S]] : f32

// Renamed names (grad_w -> dw), an optional attribute given as none, and the results a kernel keeps.
// RUN: moe-opt --kernel-key='topk_renorm_backward|mode=probs|renormalize=0|in:scores:f32:?x6|in:indices:i32:?x2|in:grad_w:f32:?x2' | FileCheck %s --check-prefix=GRAD
// GRAD: moe.topk_renorm_grad %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<?x2xf32>) mode(probs) renormalize(false)
// RUN: moe-opt --kernel-key='attention_posterior|sigma=0.5|head_select=min_entropy|head_scale=none|in:scores:f32:?x3x?x?|in:u:f32:?x?x8|in:v:f32:?x3x?x4|in:wo:f32:8x12|in:e:f32:?x?x6' | FileCheck %s --check-prefix=NONE
// NONE-NOT: head_scale
// NONE: moe.attention_posterior {{.*}} sigma(5.000000e-01) :
// RUN: moe-opt --kernel-key='hyper_router_backward|num_experts=4|weight_grads=0|in:grad_w:f32:4x20|in:grad_b:f32:4|in:emb:f32:24|in:w1:f32:40x24|in:b1:f32:40|in:w2:f32:84x40|in:b2:f32:84' | FileCheck %s --check-prefix=KEPT
// KEPT:      func.func @kernel(%[[DW:.*]]: tensor<4x20xf32>, %[[DB:.*]]: tensor<4xf32>, %[[EMB:.*]]: tensor<24xf32>,
// KEPT-SAME:   -> (tensor<24xf32>, tensor<40xf32>, tensor<84xf32>)
// KEPT:      %d_emb, %d_w1, %d_b1, %d_w2, %d_b2 = moe.hyper_router_grad %[[EMB]], {{.*}} dw(%[[DW]] : tensor<4x20xf32>) db(%[[DB]] : tensor<4xf32>)
// KEPT:      return %d_emb, %d_b1, %d_b2 :
// The capacity kernel takes the weights; the op, only with drop(probability).
// RUN: moe-opt --kernel-key='apply_capacity|num_experts=4|capacity=3|drop=position|in:indices:i64:?x2|in:weights:f32:?x2' | FileCheck %s --check-prefix=CAP
// CAP:      func.func @kernel(%[[IDX:.*]]: tensor<?x2xi64>, %{{.*}}: tensor<?x2xf32>) -> (tensor<?xi32>, tensor<4xi32>)
// CAP:      = moe.dispatch_plan %[[IDX]] num_experts(4) capacity(3) :

// An index result as the call asks for it (out:<result>:<type>; the torch ops' indices_dtype=torch.int64): set on
// the inferred op, then verified (the fused mixing ops' indices stay i32).
// RUN: moe-opt --kernel-key='route|k=2|out:indices:i64|in:logits:f32:?x8' | FileCheck %s --check-prefix=OUT
// OUT:      func.func @kernel(%{{.*}}: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
// OUT-NEXT:   moe.route %{{.*}} k(2) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi64>
// RUN: not moe-opt --kernel-key='route|k=2|out:idx:i64|in:logits:f32:?x8' 2>&1 | FileCheck %s --check-prefix=NO-OUT
// NO-OUT: error: kernel key 'route': no result 'idx' of element type 'i64'
// RUN: not moe-opt --kernel-key='similarity_inform_topk|k=2|out:indices:i64|in:u:f32:1x?x8|in:e:f32:1x?x4' 2>&1 | FileCheck %s --check-prefix=OUT-I32
// OUT-I32: error: 'moe.similarity_inform_topk' op result #1 must be ranked tensor of 32-bit signless integer values
// RUN: not moe-opt --kernel-key='route|k=2|out:indices|in:logits:f32:?x8' 2>&1 | FileCheck %s --check-prefix=OUT-MALFORMED
// OUT-MALFORMED: error: malformed kernel key: malformed output 'out:indices' (expected out:<name>:<element type>)

// The errors: the op's verifier, a name the op lacks, a missing input, a key of no op, a value of the wrong type,
// a malformed key.
// RUN: not moe-opt --kernel-key='route|k=9|in:logits:f32:?x8' 2>&1 | FileCheck %s --check-prefix=VERIFY
// VERIFY: error: 'moe.route' op 'k' (9) must be in [1, 8]
// RUN: not moe-opt --kernel-key='route|k=2|top_k=2|in:logits:f32:?x8' 2>&1 | FileCheck %s --check-prefix=EXTRA
// EXTRA: error: kernel key 'route': 'top_k' is no attribute of moe.route
// RUN: not moe-opt --kernel-key='route|k=2|in:scores:f32:?x8' 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: error: kernel key 'route': no input 'logits'
// RUN: not moe-opt --kernel-key='no_such_op|in:x:f32:4' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: error: kernel key 'no_such_op' names no op (known: topk_renorm, topk_renorm_backward,
// RUN: not moe-opt --kernel-key='route|k=2|scoring=cosine|in:logits:f32:?x8' 2>&1 | FileCheck %s --check-prefix=ENUM
// ENUM: error: kernel key 'route': 'scoring' must be one of 'softmax', 'sigmoid', 'none', 'custom', got 'cosine'
// An operand's element type against its ODS type constraint, in the torch ops' words (not "operand #0 must be ...").
// RUN: not moe-opt --kernel-key='topk_renorm|k=2|in:scores:i64:4x16' 2>&1 | FileCheck %s --check-prefix=TYPE
// TYPE: error: kernel key 'topk_renorm': 'scores' must be f32, f16 or bf16, got i64
// RUN: not moe-opt --kernel-key='similarity_inform|tau=1.0|in:u:f32:1x4x8|in:e:f32:1x4x3|in:key_mask:f32:1x4' 2>&1 | FileCheck %s --check-prefix=BOOL
// BOOL: error: kernel key 'similarity_inform': 'key_mask' must be bool (i1), got f32
// A result past the kernels' i32 indexing (the call's sizes static), after the verifier.
// RUN: not moe-opt --kernel-key='mad_dispersion|num_experts=268435456|eps=0.001|clip=0|normalize=feature|measure=mad|empty=identity|in:tokens:f32:?x8|in:assign:i64:?' 2>&1 | FileCheck %s --check-prefix=LIMIT
// LIMIT: error: kernel key 'mad_dispersion': the result 'weights' of shape [268435456, 8] would have 2147483648 elements, more than the kernels support
// RUN: not moe-opt --kernel-key='route|k=2|in:logits:f32:?xA' 2>&1 | FileCheck %s --check-prefix=MALFORMED
// MALFORMED: error: malformed kernel key: malformed dimension 'A' of input 'logits'
// RUN: not moe-opt --kernel-key='route|k=1|scoring=custom:^bb0(%x: f32): moe.yield %x : f32 }|in:logits:f32:?x4' 2>&1 | FileCheck %s --check-prefix=REGION
// REGION: error: kernel key 'route': the custom score's region does not parse
// RUN: not moe-opt --kernel-key='apply_capacity|num_experts=8|drop=position|in:indices:i32:?x2|in:weights:f32:?x2' 2>&1 | FileCheck %s --check-prefix=NO-CAPACITY
// NO-CAPACITY: error: kernel key 'apply_capacity': the op has no result 7 to return (moe.dispatch_plan has 7)
