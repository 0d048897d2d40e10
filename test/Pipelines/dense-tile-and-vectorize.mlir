// RUN: moe-opt %s --split-input-file --moe-dense-tile-and-vectorize="num-threads=2" --canonicalize --cse | FileCheck %s
// RUN: moe-opt %s --split-input-file --moe-dense-tile-and-vectorize="num-threads=2 blas=true" --canonicalize --cse \
// RUN:   | FileCheck %s --check-prefix=BLAS
// RUN: moe-opt %s --split-input-file --moe-dense-tile-and-vectorize="num-threads=2 tile-m=4 tile-n=16" \
// RUN:   --canonicalize --cse | FileCheck %s --check-prefix=TILE

// A matmul with its bias + relu consumer: one thread loop (scf.forall over 8 row blocks of 128), 8x32
// register tiles, a k loop of step 1 whose accumulator is a vector iter_arg (no tensor traffic inside), the
// consumer fused after it in the same tile. No linalg op is left.
// CHECK-LABEL: func.func @matmul_bias_relu
// CHECK:         scf.forall (%{{.*}}) = (0) to (1024) step (128)
// CHECK:           scf.for %{{.*}} = %c0 to %c128 step %c8
// CHECK:             scf.for %{{.*}} = %c0 to %c64 step %c32
// CHECK:               scf.for %{{.*}} = %c0 to %c128 step %c1 iter_args(%{{.*}} = %{{.*}}) -> (vector<8x32xf32>)
// CHECK:                 vector.transfer_read {{.*}} vector<8x1xf32>
// CHECK:                 vector.transfer_read {{.*}} vector<1x32xf32>
// CHECK:                 vector.contract {{.*}} vector<8x1xf32>, vector<1x32xf32> into vector<8x32xf32>
// CHECK:               arith.addf {{.*}} : vector<8x32xf32>
// CHECK:               arith.maximumf {{.*}} : vector<8x32xf32>
// CHECK:               vector.transfer_write {{.*}} : vector<8x32xf32>
// CHECK:           scf.forall.in_parallel
// CHECK-NOT:     scf.forall (
// CHECK-NOT:     linalg.
// CHECK:         return

// With blas=true the matmul is split into thread tiles only, marked for moe-linalg-to-blas; its consumer is
// not fused into it.
// BLAS-LABEL: func.func @matmul_bias_relu
// BLAS:         scf.forall
// BLAS:           linalg.matmul {moe.blas} ins({{.*}} : tensor<128x128xf32>, tensor<128x64xf32>)
// BLAS:         scf.forall
// BLAS-NOT:       linalg.
// BLAS:           arith.maximumf {{.*}} : vector<8x32xf32>

// TILE-LABEL: func.func @matmul_bias_relu
// TILE:         scf.for %{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (vector<4x16xf32>)
// TILE:           vector.contract {{.*}} vector<4x1xf32>, vector<1x16xf32> into vector<4x16xf32>
func.func @matmul_bias_relu(%a: tensor<1024x128xf32>, %b: tensor<128x64xf32>, %bias: tensor<64xf32>) -> tensor<1024x64xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1024x64xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<1024x64xf32>) -> tensor<1024x64xf32>
  %m = linalg.matmul ins(%a, %b : tensor<1024x128xf32>, tensor<128x64xf32>) outs(%f : tensor<1024x64xf32>) -> tensor<1024x64xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%m, %bias : tensor<1024x64xf32>, tensor<64xf32>) outs(%e : tensor<1024x64xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    %z = arith.maximumf %s, %c0 : f32
    linalg.yield %z : f32
  } -> tensor<1024x64xf32>
  return %r : tensor<1024x64xf32>
}

// -----

// Softmax as the importer writes it (max, exp(x - max), sum, divide) over 1024 columns: one thread loop over
// rows holds the whole chain (the exp, read by the sum and the divide, is fused into both instead of going
// through memory); the row max and row sum are partial reductions: 64-lane accumulators over the row
// (elementwise maximumf / addf on vector<1x64xf32>), one horizontal reduction per row after the loop; the
// divide works on 8x32 vectors. Vector exp is left to moe-approximate-vector-math.
// CHECK-LABEL: func.func @softmax
// CHECK:         scf.forall
// CHECK:           scf.for {{.*}} -> (vector<1x64xf32>)
// CHECK:             arith.maximumf {{.*}} : vector<1x64xf32>
// CHECK:           vector.multi_reduction <maximumf>, {{.*}} : vector<1x64xf32> to vector<1xf32>
// CHECK:           scf.for {{.*}} -> (vector<1x64xf32>)
// CHECK:             math.exp {{.*}} : vector<1x64xf32>
// CHECK:             arith.addf {{.*}} : vector<1x64xf32>
// CHECK:           vector.multi_reduction <add>, {{.*}} : vector<1x64xf32> to vector<1xf32>
// CHECK:           math.exp {{.*}} : vector<8x32xf32>
// CHECK:           arith.divf {{.*}} : vector<8x32xf32>
// CHECK-NOT:     scf.forall (
// CHECK-NOT:     linalg.
// CHECK:         return
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @softmax(%x: tensor<512x1024xf32>) -> tensor<512x1024xf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<512xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<512xf32>) -> tensor<512xf32>
  %max = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%x : tensor<512x1024xf32>) outs(%fm : tensor<512xf32>) {
  ^bb0(%a: f32, %m: f32):
    %r = arith.maximumf %a, %m : f32
    linalg.yield %r : f32
  } -> tensor<512xf32>
  %e = tensor.empty() : tensor<512x1024xf32>
  %ex = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]} ins(%x, %max : tensor<512x1024xf32>, tensor<512xf32>) outs(%e : tensor<512x1024xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %d = arith.subf %a, %m : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<512x1024xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%er : tensor<512xf32>) -> tensor<512xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%ex : tensor<512x1024xf32>) outs(%fs : tensor<512xf32>) {
  ^bb0(%a: f32, %s: f32):
    %r = arith.addf %a, %s : f32
    linalg.yield %r : f32
  } -> tensor<512xf32>
  %y = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]} ins(%ex, %sum : tensor<512x1024xf32>, tensor<512xf32>) outs(%e : tensor<512x1024xf32>) {
  ^bb0(%a: f32, %s: f32, %o: f32):
    %r = arith.divf %a, %s : f32
    linalg.yield %r : f32
  } -> tensor<512x1024xf32>
  return %y : tensor<512x1024xf32>
}

// -----

// Attention scores as the importer writes them (a generic contraction with K transposed): one vector.contract
// per 8x32 tile and k step (batch and head tiles of 1: unit dimensions the vector lowering drops).
// CHECK-LABEL: func.func @attention_scores
// CHECK:         scf.forall
// CHECK:           vector.contract {{.*}} into vector<1x1x8x32xf32>
// CHECK-NOT:     linalg.
// CHECK:         return
func.func @attention_scores(%q: tensor<2x4x128x64xf32>, %k: tensor<2x4x128x64xf32>) -> tensor<2x4x128x128xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x4x128x128xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x4x128x128xf32>) -> tensor<2x4x128x128xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(b, h, m, n, k) -> (b, h, m, k)>, affine_map<(b, h, m, n, k) -> (b, h, n, k)>, affine_map<(b, h, m, n, k) -> (b, h, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%q, %k : tensor<2x4x128x64xf32>, tensor<2x4x128x64xf32>) outs(%f : tensor<2x4x128x128xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %p = arith.mulf %a, %b : f32
    %r = arith.addf %c, %p : f32
    linalg.yield %r : f32
  } -> tensor<2x4x128x128xf32>
  return %s : tensor<2x4x128x128xf32>
}

// -----

// Dynamic shapes are left for convert-linalg-to-loops.
// CHECK-LABEL: func.func @dynamic
// CHECK-NOT:     scf.forall (
// CHECK:         linalg.matmul
func.func @dynamic(%a: tensor<?x64xf32>, %b: tensor<64x64xf32>, %c: tensor<?x64xf32>) -> tensor<?x64xf32> {
  %m = linalg.matmul ins(%a, %b : tensor<?x64xf32>, tensor<64x64xf32>) outs(%c : tensor<?x64xf32>) -> tensor<?x64xf32>
  return %m : tensor<?x64xf32>
}

// -----

// A softmax over heads as the importer writes it for attention (1 x H x N x N, keepdim reductions with
// `(d0, d1, d2, 0)` maps): the unit dimensions fold away and the reshapes between the folded ops cancel, so the
// whole chain lands in one thread loop as for the 2-D case (it was five loops, every intermediate materialized).
// CHECK-LABEL: func.func @softmax_heads
// CHECK:         tensor.collapse_shape
// CHECK:         scf.forall
// CHECK:           vector.multi_reduction <maximumf>, {{.*}} : vector<1x1x64xf32> to vector<1x1xf32>
// CHECK:           math.exp {{.*}} : vector<1x1x64xf32>
// CHECK:           vector.multi_reduction <add>, {{.*}} : vector<1x1x64xf32> to vector<1x1xf32>
// CHECK:           arith.divf
// CHECK-NOT:     scf.forall (
// CHECK-NOT:     linalg.
// CHECK:         tensor.expand_shape
// CHECK:         return
func.func @softmax_heads(%arg0: tensor<1x4x64x512xf32>) -> tensor<1x4x64x512xf32> {
  %c1 = arith.constant 0xFF800000 : f32
  %2 = tensor.empty() : tensor<1x4x64x1xf32>
  %3 = linalg.fill ins(%c1 : f32) outs(%2 : tensor<1x4x64x1xf32>) -> tensor<1x4x64x1xf32>
  %4 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%arg0 : tensor<1x4x64x512xf32>) outs(%3 : tensor<1x4x64x1xf32>) {
  ^bb0(%in5: f32, %out6: f32):
    %7 = arith.maximumf %out6, %in5 : f32
    linalg.yield %7 : f32
  } -> tensor<1x4x64x1xf32>
  %8 = tensor.empty() : tensor<1x4x64x512xf32>
  %9 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0, %4 : tensor<1x4x64x512xf32>, tensor<1x4x64x1xf32>) outs(%8 : tensor<1x4x64x512xf32>) {
  ^bb0(%in10: f32, %in11: f32, %out12: f32):
    %13 = arith.subf %in10, %in11 : f32
    linalg.yield %13 : f32
  } -> tensor<1x4x64x512xf32>
  %14 = tensor.empty() : tensor<1x4x64x512xf32>
  %15 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%9 : tensor<1x4x64x512xf32>) outs(%14 : tensor<1x4x64x512xf32>) {
  ^bb0(%in16: f32, %out17: f32):
    %18 = math.exp %in16 : f32
    linalg.yield %18 : f32
  } -> tensor<1x4x64x512xf32>
  %c19 = arith.constant 0.000000000e+00 : f32
  %20 = tensor.empty() : tensor<1x4x64x1xf32>
  %21 = linalg.fill ins(%c19 : f32) outs(%20 : tensor<1x4x64x1xf32>) -> tensor<1x4x64x1xf32>
  %22 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%15 : tensor<1x4x64x512xf32>) outs(%21 : tensor<1x4x64x1xf32>) {
  ^bb0(%in23: f32, %out24: f32):
    %25 = arith.addf %out24, %in23 : f32
    linalg.yield %25 : f32
  } -> tensor<1x4x64x1xf32>
  %26 = tensor.empty() : tensor<1x4x64x512xf32>
  %27 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%15, %22 : tensor<1x4x64x512xf32>, tensor<1x4x64x1xf32>) outs(%26 : tensor<1x4x64x512xf32>) {
  ^bb0(%in28: f32, %in29: f32, %out30: f32):
    %31 = arith.divf %in28, %in29 : f32
    linalg.yield %31 : f32
  } -> tensor<1x4x64x512xf32>
  return %27 : tensor<1x4x64x512xf32>
}

// -----

// A pre-LN residual: h = x + matmul(a, w) is read by a row op (the next layer's norm, here a scale) and by the
// final add y = h + g. The copy of h fused into the final add's loop reads the matmul's result from memory:
// the matmul is computed once (one vector.contract in the whole function), not once more inside the final
// add's loop (the ACMoE stack computed its first layer's experts twice that way).
// CHECK-LABEL: func.func @residual_no_recompute
// CHECK-COUNT-1: vector.contract
// CHECK-NOT:     vector.contract
// CHECK:         return
func.func @residual_no_recompute(%x: tensor<512x64xf32>, %a: tensor<512x64xf32>, %w: tensor<64x64xf32>) -> tensor<512x64xf32> {
  %c0 = arith.constant 0.0 : f32
  %c2 = arith.constant 2.0 : f32
  %e = tensor.empty() : tensor<512x64xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<512x64xf32>) -> tensor<512x64xf32>
  %m = linalg.matmul ins(%a, %w : tensor<512x64xf32>, tensor<64x64xf32>) outs(%f : tensor<512x64xf32>) -> tensor<512x64xf32>
  %h = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x, %m : tensor<512x64xf32>, tensor<512x64xf32>) outs(%e : tensor<512x64xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %s = arith.addf %p, %q : f32
    linalg.yield %s : f32
  } -> tensor<512x64xf32>
  %g = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%h : tensor<512x64xf32>) outs(%e : tensor<512x64xf32>) {
  ^bb0(%p: f32, %o: f32):
    %s = arith.mulf %p, %c2 : f32
    %t = math.tanh %s : f32
    linalg.yield %t : f32
  } -> tensor<512x64xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%h, %g : tensor<512x64xf32>, tensor<512x64xf32>) outs(%e : tensor<512x64xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %s = arith.addf %p, %q : f32
    linalg.yield %s : f32
  } -> tensor<512x64xf32>
  return %y : tensor<512x64xf32>
}

// -----

// The importer's expert einsum `td,edf->etf` (a contraction generic, the batch loop e not read by the tokens):
// with blas=true it is one GEMM per expert, split into thread tiles over (e, t) and marked for
// moe-linalg-to-blas; without BLAS it is vectorized like a matmul.
// CHECK-LABEL: func.func @expert_einsum
// CHECK:         vector.contract
// CHECK-NOT:     linalg.generic
// BLAS-LABEL: func.func @expert_einsum
// BLAS:         scf.forall (%{{.*}}, %{{.*}}) = (0, 0) to (4, 256)
// BLAS:           linalg.generic {{.*}} ins({{.*}} : tensor<128x128xf32>, tensor<1x128x64xf32>) {{.*}} attrs = {moe.blas}
// BLAS-NOT:       vector.contract
func.func @expert_einsum(%u: tensor<256x128xf32>, %w: tensor<4x128x64xf32>) -> tensor<4x256x64xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x256x64xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<4x256x64xf32>) -> tensor<4x256x64xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(e, t, f, d) -> (t, d)>, affine_map<(e, t, f, d) -> (e, d, f)>,
                                        affine_map<(e, t, f, d) -> (e, t, f)>],
                       iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%u, %w : tensor<256x128xf32>, tensor<4x128x64xf32>) outs(%f : tensor<4x256x64xf32>) {
  ^bb0(%x: f32, %v: f32, %acc: f32):
    %p = arith.mulf %x, %v : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  } -> tensor<4x256x64xf32>
  return %y : tensor<4x256x64xf32>
}

// -----

// A chain of fewer than 2^17 iterations (a 256 x 256 elementwise op) stays on the calling thread: a parallel
// region costs tens of microseconds, more than its work (mad_dispersion's O(E·D) tail at E = D = 256 took 0.3 ms
// more on two threads). The matmul above, 2^23 iterations, keeps its thread loop with its small consumer fused.
// CHECK-LABEL: func.func @small_elementwise
// CHECK-NOT:     scf.forall
// CHECK:         scf.for
// CHECK:           arith.divf {{.*}} : vector<8x32xf32>
// CHECK-NOT:     scf.forall
// CHECK:         return
func.func @small_elementwise(%x: tensor<256x256xf32>, %y: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %e = tensor.empty() : tensor<256x256xf32>
  %0 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>,
                                        affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %y : tensor<256x256xf32>, tensor<256x256xf32>) outs(%e : tensor<256x256xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.divf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<256x256xf32>
  return %0 : tensor<256x256xf32>
}
