// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// hyper_router: two GEMVs y = W x + b (ReLU on the hidden layer). Row blocks go to the workers (blocks of 64
// rows; a matrix of at most 2^18 elements as at most four blocks, which the workers run on the calling thread);
// each row is a vector<16> dot product over its contiguous columns, rows in memory order, four rows a step with
// AVX-512 (x's chunk loaded once for the four), four accumulators per row (four vectors a step), then single vectors
// and a masked tail for columns that are not a multiple of 64 or 16. The kernel's outs are the op's results: row
// r of the output layer goes to b[r / (D+1)] when r mod (D+1) = D, else to w[r / (D+1), r mod (D+1)] (no flat
// buffer, no copy).

// CHECK-LABEL: func.func @hyper
// CHECK-SAME: %[[EMB:[^:]+]]: tensor<256xf32>, %[[W1:[^:]+]]: tensor<256x256xf32>, %[[B1:[^:]+]]: tensor<256xf32>, %[[W2:[^:]+]]: tensor<4112x256xf32>, %[[B2:[^:]+]]: tensor<4112xf32>
// One kernel: w and b are its outs, the hidden vector its scratch.
// CHECK: moe.kernel ins(%[[W1]], %[[EMB]], %[[B1]], %[[W2]], %[[B2]] : {{.*}}) outs(%{{.+}}, %{{.+}} : tensor<16x256xf32>, tensor<16xf32>)
// CHECK-NEXT: ^bb0(%[[W1B:[^:]+]]: memref<256x256xf32>, %[[EB:[^:]+]]: memref<256xf32>, %{{[^:]+}}: memref<256xf32>, %[[W2B:[^:]+]]: memref<4112x256xf32>, %{{[^:]+}}: memref<4112xf32>, %[[WOUT:[^:]+]]: memref<16x256xf32>, %[[BOUT:[^:]+]]: memref<16xf32>):
// Hidden layer.
// CHECK: %[[H:.+]] = memref.alloc() {alignment = 64 : i64} : memref<256xf32>
// CHECK: %[[SMALL:.+]] = arith.cmpi ule, %{{.+}}, %c262144
// CHECK: %[[ROWS:.+]] = arith.select %[[SMALL]], %{{.+}}, %c64
// CHECK: scf.for %[[R:.+]] = %{{.+}} to %{{.+}} step %c4 {
// CHECK: scf.for {{.*}} step %c4 iter_args({{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>)
// CHECK: vector.load %[[W1B]][%[[R]], %{{.+}}] : memref<256x256xf32>, vector<16xf32>
// CHECK-COUNT-3: vector.load %[[W1B]]
// CHECK-NEXT: vector.load %[[EB]]
// CHECK-COUNT-4: vector.fma {{.*}} : vector<16xf32>
// CHECK: vector.maskedload %[[W1B]]
// CHECK: vector.reduction <add>
// CHECK: arith.maximumf
// CHECK: memref.store %{{.+}}, %[[H]]
// Rows left over after the steps of four: one at a time.
// CHECK: scf.for %[[R1:.+]] = %{{.+}} to %{{.+}} step %c1 {
// CHECK: scf.for {{.*}} step %c4 iter_args({{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>)
// CHECK-COUNT-4: vector.load %[[W1B]][%[[R1]], %{{.+}}] : memref<256x256xf32>, vector<16xf32>
// Output layer, from the hidden vector, straight into w and b.
// CHECK: scf.parallel
// CHECK: scf.for {{.*}} step %c4 iter_args({{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>)
// CHECK-COUNT-4: vector.load %[[W2B]]
// CHECK-NEXT: vector.load %[[H]]
// CHECK: vector.maskedload %[[W2B]]
// CHECK: %[[E:.+]] = arith.divui
// CHECK: %[[C:.+]] = arith.remui
// CHECK: %[[ISB:.+]] = arith.cmpi eq, %[[C]]
// CHECK: scf.if %[[ISB]] {
// CHECK-NEXT: memref.store %{{.+}}, %[[BOUT]][%[[E]]] : memref<16xf32>
// CHECK-NEXT: } else {
// CHECK-NEXT: memref.store %{{.+}}, %[[WOUT]][%[[E]], %[[C]]] : memref<16x256xf32>
// CHECK-NOT: tensor.extract_slice
// CHECK-NOT: moe.hyper_router
func.func @hyper(%emb: tensor<256xf32>, %w1: tensor<256x256xf32>, %b1: tensor<256xf32>, %w2: tensor<4112x256xf32>,
                 %b2: tensor<4112xf32>) -> (tensor<16x256xf32>, tensor<16xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16)
      : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32>
      -> tensor<16x256xf32>, tensor<16xf32>
  return %w, %b : tensor<16x256xf32>, tensor<16xf32>
}
