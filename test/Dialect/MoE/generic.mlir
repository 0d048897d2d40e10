// The generic form is part of the contract (shared/spec/DIALECT.md): op names, operand order, attribute names
// and result order. The torch importer writes this form; it must parse, and print back with these names.
// RUN: moe-opt %s --mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: "func.func"() <{function_type = {{.*}}, sym_name = "generic_forms"}>
func.func @generic_forms(%s: tensor<8x16xf32>, %u: tensor<1x8x4xf32>, %e: tensor<1x8x16xf32>, %ws: tensor<4x4xf32>,
                         %m: tensor<1x8xi1>, %sc: tensor<1x2x8x8xf32>, %v: tensor<1x2x8x2xf32>, %wo: tensor<4x4xf32>,
                         %x: tensor<8x4xf32>, %as: tensor<8xi32>, %a: tensor<16x16xf32>, %idx: tensor<8x2xi32>,
                         %emb: tensor<3xf32>, %w1: tensor<5x3xf32>, %b1: tensor<5xf32>, %w2: tensor<10x5xf32>, %b2: tensor<10xf32>) {
  // CHECK: "moe.topk_renorm"(%{{.*}}) <{k = 2 : i64, mode = #moe<topk_mode probs>, renormalize = false}>
  %0:2 = "moe.topk_renorm"(%s) {k = 2 : i64, mode = #moe<topk_mode probs>, renormalize = false}
      : (tensor<8x16xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>)
  // CHECK: "moe.similarity_inform"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) <{causal = true, operandSegmentSizes = array<i32: 1, 1, 1, 1>, tau = 2.000000e+00 : f32}>
  %1 = "moe.similarity_inform"(%u, %e, %ws, %m) {tau = 2.0 : f32, causal = true, operandSegmentSizes = array<i32: 1, 1, 1, 1>}
      : (tensor<1x8x4xf32>, tensor<1x8x16xf32>, tensor<4x4xf32>, tensor<1x8xi1>) -> tensor<1x8x16xf32>
  // CHECK: "moe.attention_posterior"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) <{head_scale = 1.000000e+00 : f32, head_select = #moe<head_select all>, sigma = 5.000000e-01 : f32}>
  %2:2 = "moe.attention_posterior"(%sc, %u, %v, %wo, %e) {sigma = 0.5 : f32, head_select = #moe<head_select all>, head_scale = 1.0 : f32}
      : (tensor<1x2x8x8xf32>, tensor<1x8x4xf32>, tensor<1x2x8x2xf32>, tensor<4x4xf32>, tensor<1x8x16xf32>) -> (tensor<1x8x16xf32>, tensor<1xi32>)
  // CHECK: "moe.mad_dispersion"(%{{.*}}, %{{.*}}) <{clip = 0.000000e+00 : f32, empty = #moe<empty raw>, eps = 1.000000e-01 : f32, measure = #moe<measure variance>, normalize = #moe<normalize global>, num_experts = 4 : i64}>
  %3:2 = "moe.mad_dispersion"(%x, %as) {num_experts = 4 : i64, eps = 0.1 : f32, clip = 0.0 : f32, normalize = #moe<normalize global>,
                                        measure = #moe<measure variance>, empty = #moe<empty raw>}
      : (tensor<8x4xf32>, tensor<8xi32>) -> (tensor<4x4xf32>, tensor<4xi32>)
  // CHECK: "moe.adjacency_update"(%{{.*}}, %{{.*}}) <{beta = 8.000000e-01 : f32, include_self = false, norm = #moe<norm col>}>
  %4 = "moe.adjacency_update"(%a, %idx) {beta = 0.8 : f32, norm = #moe<norm col>, include_self = false}
      : (tensor<16x16xf32>, tensor<8x2xi32>) -> tensor<16x16xf32>
  // CHECK: "moe.hyper_router"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) <{num_experts = 2 : i64}>
  %5:2 = "moe.hyper_router"(%emb, %w1, %b1, %w2, %b2) {num_experts = 2 : i64}
      : (tensor<3xf32>, tensor<5x3xf32>, tensor<5xf32>, tensor<10x5xf32>, tensor<10xf32>) -> (tensor<2x4xf32>, tensor<2xf32>)
  return
}

// Attributes left out take the defaults of DIALECT.md.
// CHECK-LABEL: sym_name = "generic_defaults"
func.func @generic_defaults(%s: tensor<8x16xf32>, %a: tensor<16x16xf32>, %idx: tensor<8x2xi32>, %x: tensor<8x4xf32>, %as: tensor<8xi32>) {
  // CHECK: "moe.topk_renorm"(%{{.*}}) <{k = 1 : i64, mode = #moe<topk_mode logits>, renormalize = true}>
  %0:2 = "moe.topk_renorm"(%s) {k = 1 : i64} : (tensor<8x16xf32>) -> (tensor<8x1xf32>, tensor<8x1xi32>)
  // CHECK: "moe.adjacency_update"(%{{.*}}, %{{.*}}) <{beta = 0.899999976 : f32, include_self = true, norm = #moe<norm row>}>
  %1 = "moe.adjacency_update"(%a, %idx) : (tensor<16x16xf32>, tensor<8x2xi32>) -> tensor<16x16xf32>
  // CHECK: "moe.mad_dispersion"(%{{.*}}, %{{.*}}) <{clip = 1.000000e+01 : f32, empty = #moe<empty identity>, eps = 9.99999974E-5 : f32, measure = #moe<measure mad>, normalize = #moe<normalize feature>, num_experts = 4 : i64}>
  %2:2 = "moe.mad_dispersion"(%x, %as) {num_experts = 4 : i64} : (tensor<8x4xf32>, tensor<8xi32>) -> (tensor<4x4xf32>, tensor<4xi32>)
  return
}
