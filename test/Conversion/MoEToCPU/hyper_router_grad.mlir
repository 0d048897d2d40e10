// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s
// RUN: moe-opt %s "--convert-moe-to-cpu=num-threads=2 vector-bits=256" | FileCheck %s --check-prefix=AVX2
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | FileCheck %s --check-prefix=LLVM

// hyper_router_grad's kernel (HyperRouterGrad.cpp): h recomputed by the forward's GEMV, d_b2 = dout = [dw | db]
// (vector copies of dw's rows, db[e] after each), then one pass over the rows of w2 in memory order: per row r,
// d_w2[r, :] = dout[r] · h and the row block's partial += dout[r] · w2[r, :] (four vectors a step, single vectors,
// a masked tail under an scf.if), the partials ([blocks, Dh padded]) summed in block order into dh; da = dh where
// h > 0 or unordered (a NaN); then the same pass over w1 (d_w1 = da ⊗ emb, d_emb from the partials).

// CHECK-LABEL: func.func @live
// CHECK-SAME: %[[EMB:[^:]+]]: tensor<64xf32>, %[[W1:[^:]+]]: tensor<32x64xf32>, %[[B1:[^:]+]]: tensor<32xf32>, %[[W2:[^:]+]]: tensor<1040x32xf32>
// CHECK-NOT: moe.hyper_router_grad
// One kernel; the five gradients are its outs.
// CHECK: moe.kernel ins(%[[EMB]], %[[W1]], %[[B1]], %[[W2]], %{{[^ ]+}}, %{{[^ ]+}}, %{{[^ ]+}} :
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<64xf32>, %{{[^:]+}}: memref<32x64xf32>, %{{[^:]+}}: memref<32xf32>, %[[W2B:[^:]+]]: memref<1040x32xf32>, %{{[^:]+}}: memref<1040xf32>, %{{[^:]+}}: memref<{{[^>]+}}>, %{{[^:]+}}: memref<{{[^>]+}}>, %[[DEMB:[^:]+]]: memref<64xf32>, %[[DW1:[^:]+]]: memref<32x64xf32>, %[[DA:[^:]+]]: memref<32xf32>, %[[DW2:[^:]+]]: memref<1040x32xf32>, %[[DOUT:[^:]+]]: memref<1040xf32>):
// Hidden layer, by the forward's GEMV.
// CHECK: %[[H:.+]] = memref.alloc() {alignment = 64 : i64} : memref<32xf32>
// CHECK: arith.maximumf
// dout = d_b2.
// CHECK: vector.store %{{.+}}, %[[DOUT]][%{{.+}}] : memref<1040xf32>, vector<16xf32>
// CHECK: vector.maskedstore %[[DOUT]]
// CHECK: memref.store %{{.+}}, %[[DOUT]]
// The pass over w2 (the inline branch of the workers; the parallel one repeats it).
// CHECK: %[[SMALL:.+]] = arith.cmpi ule, %{{.+}}, %c262144
// CHECK: %[[P:.+]] = memref.alloc(%{{.+}}, %{{.+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: scf.for %[[BLK:.+]] = %c0 to
// CHECK: vector.store %{{.+}}, %[[P]][%[[BLK]], %{{.+}}] : memref<?x?xf32>, vector<16xf32>
// CHECK: scf.for %[[R:.+]] = %{{.+}} to %{{.+}} step %c1 {
// CHECK-NEXT: %[[G:.+]] = memref.load %[[DOUT]][%[[R]]]
// CHECK-NEXT: %[[GV:.+]] = vector.broadcast %[[G]]
// CHECK: scf.for %{{.+}} step %c4 {
// CHECK-COUNT-4: vector.store %{{.+}}, %[[DW2]][%[[R]], %{{.+}}] : memref<1040x32xf32>, vector<16xf32>
// CHECK: scf.for
// CHECK: %[[WV:.+]] = vector.load %[[W2B]][%[[R]], %[[C:.+]]] : memref<1040x32xf32>, vector<16xf32>
// CHECK-NEXT: %[[PV:.+]] = vector.load %[[P]][%[[BLK]], %[[C]]]
// CHECK-NEXT: %[[HV:.+]] = vector.load %[[H]][%[[C]]]
// CHECK-NEXT: %[[O:.+]] = arith.mulf %[[GV]], %[[HV]] : vector<16xf32>
// CHECK-NEXT: %[[F:.+]] = vector.fma %[[GV]], %[[WV]], %[[PV]] : vector<16xf32>
// CHECK-NEXT: vector.store %[[F]], %[[P]][%[[BLK]], %[[C]]]
// CHECK-NEXT: vector.store %[[O]], %[[DW2]][%[[R]], %[[C]]]
// CHECK: scf.if
// CHECK: vector.maskedload %[[W2B]]
// CHECK: vector.maskedstore %[[DW2]]
// CHECK: scf.parallel
// The partials, in block order.
// CHECK: %[[DH:.+]] = memref.alloc() {alignment = 64 : i64} : memref<32xf32>
// CHECK: scf.for %{{.+}} = %c0 to %{{.+}} step %c1 iter_args(%{{.+}} = %{{.+}}) -> (vector<16xf32>) {
// CHECK: vector.load %[[P]]
// CHECK: vector.store %{{.+}}, %[[DH]]
// The ReLU.
// CHECK: %[[HI:.+]] = memref.load %[[H]]
// CHECK-NEXT: %[[DHI:.+]] = memref.load %[[DH]]
// CHECK-NEXT: %[[OPEN:.+]] = arith.cmpf ugt, %[[HI]], %{{.+}} : f32
// CHECK-NEXT: arith.select %[[OPEN]], %[[DHI]]
// The pass over w1.
// CHECK: memref.load %[[DA]]
// CHECK: vector.store %{{.+}}, %[[DW1]]
// CHECK: } -> tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
// AVX2-LABEL: func.func @live
// AVX2: vector.fma %{{.+}} : vector<8xf32>
// AVX2-NOT: vector<16xf32>
// AVX2-LABEL: func.func @fwd_bwd
// LLVM-LABEL: llvm.func @live
// LLVM-NOT: moe.
func.func @live(%emb: tensor<64xf32>, %w1: tensor<32x64xf32>, %b1: tensor<32xf32>, %w2: tensor<1040x32xf32>,
                %b2: tensor<1040xf32>, %dw: tensor<16x64xf32>, %db: tensor<16xf32>)
    -> (tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>) {
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<16x64xf32>)
      db(%db : tensor<16xf32>) num_experts(16)
      : tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
      -> tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
  return %a, %g1, %g2, %g3, %g4 : tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
}

// With the forward, only d_emb used (a frozen hypernetwork): d_w1 and d_w2 are neither allocated nor written.
// CHECK-LABEL: func.func @fwd_bwd
// CHECK-NOT: moe.hyper_router
// CHECK-NOT: memref.alloc() {{.*}} : memref<1040x32xf32>
// CHECK-NOT: memref.alloc() {{.*}} : memref<32x64xf32>
// CHECK-NOT: store {{.*}} memref<1040x32xf32>
// CHECK-NOT: store {{.*}} memref<32x64xf32>
// CHECK: return
// LLVM-LABEL: llvm.func @fwd_bwd
// LLVM-NOT: moe.
func.func @fwd_bwd(%emb: tensor<64xf32>, %w1: tensor<32x64xf32>, %b1: tensor<32xf32>, %w2: tensor<1040x32xf32>,
                   %b2: tensor<1040xf32>, %dw: tensor<16x64xf32>, %db: tensor<16xf32>)
    -> (tensor<16x64xf32>, tensor<64xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16)
      : tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
      -> tensor<16x64xf32>, tensor<16xf32>
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<16x64xf32>)
      db(%db : tensor<16xf32>) num_experts(16)
      : tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
      -> tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
  return %w, %a : tensor<16x64xf32>, tensor<64xf32>
}

// Dynamic sizes and bf16 operands: the same kernel on memref<?x?xbf16> (widened loads), results cast back.
// CHECK-LABEL: func.func @dynamic
// CHECK-NOT: moe.hyper_router_grad
// CHECK: memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?xf32>
// CHECK: vector.load %{{.+}} : memref<?x?xbf16>, vector<16xbf16>
// CHECK: arith.extf %{{.+}} : vector<16xbf16> to vector<16xf32>
// CHECK: memref.alloc(%{{.+}}, %{{.+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: return
// LLVM-LABEL: llvm.func @dynamic
// LLVM-NOT: moe.
func.func @dynamic(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xbf16>, %w2: tensor<?x?xbf16>,
                   %b2: tensor<?xbf16>, %dw: tensor<?x?xf32>, %db: tensor<?xf32>)
    -> (tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>) {
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<?x?xf32>)
      db(%db : tensor<?xf32>) num_experts(4)
      : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>
      -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %g1, %g2, %g3, %g4 : tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
}

// A static zero-sized dimension (De = 0): left to the portable lowering, which the pipeline then runs.
// CHECK-LABEL: func.func @zero_sized
// CHECK: moe.hyper_router_grad
// LLVM-LABEL: llvm.func @zero_sized
// LLVM-NOT: moe.
func.func @zero_sized(%emb: tensor<0xf32>, %w1: tensor<4x0xf32>, %b1: tensor<4xf32>, %w2: tensor<6x4xf32>,
                      %b2: tensor<6xf32>, %dw: tensor<3x1xf32>, %db: tensor<3xf32>)
    -> (tensor<0xf32>, tensor<4x0xf32>, tensor<4xf32>, tensor<6x4xf32>, tensor<6xf32>) {
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<3x1xf32>)
      db(%db : tensor<3xf32>) num_experts(3)
      : tensor<0xf32>, tensor<4x0xf32>, tensor<4xf32>, tensor<6x4xf32>, tensor<6xf32>
      -> tensor<0xf32>, tensor<4x0xf32>, tensor<4xf32>, tensor<6x4xf32>, tensor<6xf32>
  return %a, %g1, %g2, %g3, %g4 : tensor<0xf32>, tensor<4x0xf32>, tensor<4xf32>, tensor<6x4xf32>, tensor<6xf32>
}
