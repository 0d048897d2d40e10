// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 -split-input-file | FileCheck %s

// A custom score region in the route kernel: step 1 runs the region's ops on the row's vector<16xf32> chunks where
// it computes the sigmoid preset (math.exp as the kernel's polynomial exp: floor, FMAs, the exponent bits), and
// stores the scores for the candidate pass.

// CHECK-LABEL: func.func @sqrtsoftplus
// CHECK: moe.kernel
// CHECK: %[[X:.+]] = vector.maskedload %{{.+}} : memref<?x64xf32>, vector<16xi1>, vector<16xf32> into vector<16xf32>
// CHECK-NEXT: %[[A:.+]] = math.absf %[[X]] : vector<16xf32>
// CHECK-NEXT: %[[N:.+]] = arith.negf %[[A]] : vector<16xf32>
// CHECK-NOT: math.exp
// CHECK: vector.fma
// CHECK: %[[L:.+]] = math.log1p %{{.+}} : vector<16xf32>
// CHECK-NEXT: %[[M:.+]] = arith.maximumf %[[X]], %{{.+}} : vector<16xf32>
// CHECK-NEXT: %[[SP:.+]] = arith.addf %[[L]], %[[M]] : vector<16xf32>
// CHECK-NEXT: %[[S:.+]] = math.sqrt %[[SP]] : vector<16xf32>
// CHECK-NEXT: vector.store %[[S]], %{{.+}} : memref<?xf32, strided<[1], offset: ?>>, vector<16xf32>
func.func @sqrtsoftplus(%l: tensor<?x64xf32>, %b: tensor<64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<64xf32>) k(8) scoring(custom) renormalize(true) routed_scaling_factor(2.5) score {
  ^bb0(%x: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %a = math.absf %x : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %s = math.log1p %e : f32
    %m = arith.maximumf %x, %zero : f32
    %sp = arith.addf %s, %m : f32
    %r = math.sqrt %sp : f32
    moe.yield %r : f32
  } : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// moe.route_grad with k = 8: the eight picks' logits in the lanes of one vector<8xf32>, the score and its
// symbolic derivative on that vector (d(x·tanh x) = tanh x + x·(1 − tanh² x); dx/dx = 1 multiplies nothing; a
// product-rule term with an exact zero factor is 0), the row sums S = Σ s and C = Σ dw·s over the live lanes,
// a·(dw − C/S)/S·f' (0 where S = 0), the row zeroed in 16-lane stores, and each pick's gradient added at its
// expert when its index is in range.

// CHECK-LABEL: func.func @route_grad_xtanh
// CHECK: moe.kernel
// CHECK-COUNT-8: vector.insert %{{.+}} : f32 into vector<8xf32>
// CHECK-NEXT: %[[T:.+]] = math.tanh %[[V:.+]] : vector<8xf32>
// CHECK-NEXT: %[[T2:.+]] = arith.mulf %[[T]], %[[T]] : vector<8xf32>
// CHECK-NEXT: %[[SECH:.+]] = arith.subf %{{.+}}, %[[T2]] : vector<8xf32>
// CHECK-NEXT: %[[S:.+]] = arith.mulf %[[V]], %[[T]] : vector<8xf32>
// CHECK: %[[XSECH:.+]] = arith.mulf %[[SECH]], %[[V]] : vector<8xf32>
// CHECK-NEXT: %[[TERM:.+]] = arith.select %{{.+}}, %{{.+}}, %[[XSECH]] : vector<8xi1>, vector<8xf32>
// CHECK-NEXT: %[[DS:.+]] = arith.addf %[[T]], %[[TERM]] : vector<8xf32>
// CHECK: %[[G:.+]] = vector.maskedload %{{.+}} : memref<?x8xf32>, vector<8xi1>, vector<8xf32> into vector<8xf32>
// CHECK: vector.reduction <add>, %{{.+}} : vector<8xf32> into f32
// CHECK: %[[GS:.+]] = arith.mulf %[[G]], %[[S]] : vector<8xf32>
// CHECK: vector.reduction <add>
// CHECK: arith.divf
// CHECK-NEXT: arith.subf
// CHECK-NEXT: %[[Q:.+]] = arith.divf
// CHECK-NEXT: %[[SCALED:.+]] = arith.mulf %[[Q]], %{{.+}} : vector<8xf32>
// CHECK-NEXT: %[[D0:.+]] = arith.mulf %[[SCALED]], %[[DS]] : vector<8xf32>
// CHECK-NEXT: %[[ZERO:.+]] = arith.cmpf oeq
// CHECK-NEXT: %[[D:.+]] = arith.select %[[ZERO]], %{{.+}}, %[[D0]] : vector<8xi1>, vector<8xf32>
// CHECK: vector.maskedstore
// CHECK: vector.extract %[[D]][0] : f32 from vector<8xf32>
// CHECK-NEXT: scf.if
// CHECK-NEXT: memref.load
// CHECK-NEXT: arith.addf
// CHECK-NEXT: memref.store
func.func @route_grad_xtanh(%l: tensor<?x64xf32>, %i: tensor<?x8xi32>, %dw: tensor<?x8xf32>) -> tensor<?x64xf32> {
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x8xf32>) scoring(custom) renormalize(true) routed_scaling_factor(2.5) score {
  ^bb0(%x: f32):
    %t = math.tanh %x : f32
    %r = arith.mulf %x, %t : f32
    moe.yield %r : f32
  } : tensor<?x64xf32>, tensor<?x8xi32> -> tensor<?x64xf32>
  return %d : tensor<?x64xf32>
}

// -----

// More picks than a vector holds (k = 20): the same formulas in scalar loops over the picks (the polynomial exp
// on scalars: its range reduction is a math.floor).
// CHECK-LABEL: func.func @route_grad_sigmoid_k20
// CHECK: scf.for {{.+}} iter_args
// CHECK: memref.load %{{.+}} : memref<?x20xi32>
// CHECK: math.floor %{{.+}} : f32
// CHECK: scf.yield
// CHECK: vector.maskedstore
func.func @route_grad_sigmoid_k20(%l: tensor<?x64xf32>, %i: tensor<?x20xi32>, %dw: tensor<?x20xf32>) -> tensor<?x64xf32> {
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x20xf32>) scoring(sigmoid) renormalize(true) : tensor<?x64xf32>, tensor<?x20xi32> -> tensor<?x64xf32>
  return %d : tensor<?x64xf32>
}
