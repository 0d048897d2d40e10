// The GPU top-k's k rounds are an scf.for and each lane rescales its own entries in a loop, so compile time does
// not grow with k: k = 65536 lowers through the whole NVVM pipeline (PTX included) in about half a second here;
// the 2 s limit leaves a wide margin for a loaded machine.
// RUN: timeout 2 moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" -o /dev/null
// RUN: moe-opt %s --convert-moe-to-gpu | FileCheck %s

// CHECK-LABEL: gpu.func @topk_renorm
// CHECK: scf.for %{{.+}} = %{{.+}} to %c65536{{.*}} step %{{.+}} iter_args(
// CHECK-LABEL: func.func @topk_65536
// CHECK: gpu.launch_func
func.func @topk_65536(%x: tensor<1x65536xf32>) -> (tensor<1x65536xf32>, tensor<1x65536xi32>) {
  %w, %i = moe.topk_renorm %x k(65536) : tensor<1x65536xf32> -> tensor<1x65536xf32>, tensor<1x65536xi32>
  return %w, %i : tensor<1x65536xf32>, tensor<1x65536xi32>
}
