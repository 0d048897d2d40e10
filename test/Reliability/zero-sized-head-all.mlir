// Issue #15: every op with a zero-sized dimension (static) lowers through the portable and CPU pipelines (the GPU lowering rejects head_select = all with a
// diagnostic), the result verifies
// (moe-opt verifies after each pass) and no moe op is left: moe-legalize-shapes, run first by each pipeline,
// rewrites them into their defined results (the values are checked by test/Integration/CPU/zero_sized.mlir).
// Names: <op>_<sizes>, e.g. ap_min_entropy_B_H_N_Nk_D_Dh_K, sim_B_N_D_K, mad_<empty>_T_D, hyper_De_Dh.
// RUN: moe-opt %s -split-input-file --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm=cpu-kernels=false | FileCheck %s

// CHECK-LABEL: @ap_all_0_2_4_5_6_3_3
// CHECK-NOT: moe.
func.func @ap_all_0_2_4_5_6_3_3(%s: tensor<0x2x4x5xf32>, %u: tensor<0x4x6xf32>, %v: tensor<0x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<0x5x3xf32>) -> (tensor<0x4x3xf32>, tensor<0xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<0x2x4x5xf32>, tensor<0x4x6xf32>, tensor<0x2x5x3xf32>, tensor<6x6xf32>, tensor<0x5x3xf32> -> tensor<0x4x3xf32>, tensor<0xi32>
  return %p, %h : tensor<0x4x3xf32>, tensor<0xi32>
}

// -----

// CHECK-LABEL: @ap_all_2_2_0_5_6_3_3
// CHECK-NOT: moe.
func.func @ap_all_2_2_0_5_6_3_3(%s: tensor<2x2x0x5xf32>, %u: tensor<2x0x6xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x5x3xf32>) -> (tensor<2x0x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<2x2x0x5xf32>, tensor<2x0x6xf32>, tensor<2x2x5x3xf32>, tensor<6x6xf32>, tensor<2x5x3xf32> -> tensor<2x0x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x0x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_all_2_2_4_0_6_3_3
// CHECK-NOT: moe.
func.func @ap_all_2_2_4_0_6_3_3(%s: tensor<2x2x4x0xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x0x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x0x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<2x2x4x0xf32>, tensor<2x4x6xf32>, tensor<2x2x0x3xf32>, tensor<6x6xf32>, tensor<2x0x3xf32> -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_all_2_2_4_5_0_3_3
// CHECK-NOT: moe.
func.func @ap_all_2_2_4_5_0_3_3(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x0xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<0x6xf32>, %e: tensor<2x5x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<2x2x4x5xf32>, tensor<2x4x0xf32>, tensor<2x2x5x3xf32>, tensor<0x6xf32>, tensor<2x5x3xf32> -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_all_2_2_4_5_6_0_3
// CHECK-NOT: moe.
func.func @ap_all_2_2_4_5_6_0_3(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x5x0xf32>, %wo: tensor<6x0xf32>, %e: tensor<2x5x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<2x2x4x5xf32>, tensor<2x4x6xf32>, tensor<2x2x5x0xf32>, tensor<6x0xf32>, tensor<2x5x3xf32> -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_all_2_2_4_5_6_3_0
// CHECK-NOT: moe.
func.func @ap_all_2_2_4_5_6_3_0(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x5x0xf32>) -> (tensor<2x4x0xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<2x2x4x5xf32>, tensor<2x4x6xf32>, tensor<2x2x5x3xf32>, tensor<6x6xf32>, tensor<2x5x0xf32> -> tensor<2x4x0xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x0xf32>, tensor<2xi32>
}
