// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 -split-input-file | FileCheck %s

// moe.route weighing softmax scores renormalized over its k picks: the softmax's normaliser cancels,
// w_j = exp(x_j - m) / Σ_l exp(x_l - m) with m the row's max, so the kernel weighs the k picked logits in the lanes
// of one vector (RouteSpec::weighsPickedTerms). Each kernel is emitted twice (inline for a few rows, then over the
// workers): the checks read the first.

// A hash router (the choice given by a table): one pass of maxima over the row and no exponential in it, then the
// k = 6 picked logits in the lanes of a vector<8xf32> and one vector exponential (the polynomial has one floor).
// CHECK-LABEL: func.func @hash_router_replay
// CHECK: moe.kernel
// CHECK-NOT: vector<8xi64>
// CHECK: scf.for %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (vector<16xf32>) {
// CHECK-NEXT: arith.muli
// CHECK-NEXT: arith.subi
// CHECK-NEXT: vector.create_mask
// CHECK-NEXT: vector.maskedload
// CHECK-NEXT: arith.maximumf %{{.+}} : vector<16xf32>
// CHECK-NEXT: scf.yield
// CHECK-NEXT: }
// CHECK-NEXT: %[[MAX:.+]] = vector.reduction <maximumf>, %{{.+}} : vector<16xf32> into f32
// CHECK-NOT: vector.maskedload
// CHECK-NOT: scf.for
// CHECK-COUNT-6: vector.insert %{{.+}} : f32 into vector<8xf32>
// CHECK-NOT: vector.insert
// CHECK: vector.broadcast %[[MAX]] : f32 to vector<8xf32>
// CHECK: math.floor %{{.+}} : vector<8xf32>
// CHECK-NOT: math.floor
// CHECK: vector.reduction <add>, %{{.+}} : vector<8xf32> into f32
// CHECK: arith.divf %{{.+}} : vector<8xf32>
// CHECK-NOT: math.floor
// CHECK-COUNT-6: memref.store %{{.+}} : memref<?x6xf32>
// CHECK: } else {
func.func @hash_router_replay(%l: tensor<?x64xf32>, %r: tensor<?x6xi64>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<?x6xi64>) k(6) renormalize(true) routed_scaling_factor(1.5)
      : tensor<?x64xf32> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}

// -----

// Without renormalization a pick's weight is its score s_j = exp(x_j - m) / Σ_e exp(x_e - m): the row's softmax
// (a second pass over the row, of exponentials), read back at the given experts.
// CHECK-LABEL: func.func @softmax_replay_not_renormalized
// CHECK: vector.reduction <maximumf>
// CHECK: scf.for
// CHECK: vector.maskedload
// CHECK: math.floor %{{.+}} : vector<16xf32>
// CHECK: } else {
func.func @softmax_replay_not_renormalized(%l: tensor<?x64xf32>, %r: tensor<?x6xi64>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<?x6xi64>) k(6) : tensor<?x64xf32> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}

// -----

// The router choosing (Mixtral, Qwen3-MoE): the choice needs the row's scores, and the weights are the k picks'
// terms as for a replay, so that its own choice replayed gets its weights bit for bit.
// CHECK-LABEL: func.func @chosen_renormalized_softmax
// CHECK: vector<8xi64>
// CHECK: memref.store %{{.+}} : memref<?x2xi32>
// CHECK: memref.load %{{.+}} : memref<?x2xi32>
// CHECK: vector.insert %{{.+}} [0] : f32 into vector<8xf32>
// CHECK: memref.load %{{.+}} : memref<?x2xi32>
// CHECK: vector.insert %{{.+}} [1] : f32 into vector<8xf32>
// CHECK: vector.reduction <add>, %{{.+}} : vector<8xf32> into f32
// CHECK: } else {
func.func @chosen_renormalized_softmax(%l: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.route %l k(2) renormalize(true) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
