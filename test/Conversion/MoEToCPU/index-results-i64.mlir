// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=256" | FileCheck %s

// Indices written as i64 in the CPU kernels: the row-per-lane block extends its index vectors before the stores
// (AVX2: vector<8xi32> -> vector<8xi64>), the per-row path each scalar index (RowLanes.h's storeColumns,
// Route.cpp's picks); no second pass over the indices.
// CHECK-LABEL: func.func @route_lanes
// CHECK: arith.extsi %{{.*}} : vector<8xi32> to vector<8xi64>
// CHECK: vector.store %{{.*}} : memref<?xi64>, vector<8xi64>
// CHECK: arith.extsi %{{.*}} : i32 to i64
// CHECK: memref.store %{{.*}} : memref<?x4xi64>
func.func @route_lanes(%l: tensor<?x16xf32>) -> (tensor<?x4xf32>, tensor<?x4xi64>) {
  %w, %i = moe.route %l k(4) scoring(sigmoid) : tensor<?x16xf32> -> tensor<?x4xf32>, tensor<?x4xi64>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi64>
}
