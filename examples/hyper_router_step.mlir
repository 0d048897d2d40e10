// The demo: one HyperRouter routing step for 6 tokens over 4 experts, compiled for the CPU.
//
// At inference the hypernetwork's inputs are constants, so `moe.hyper_router` folds away and the router is
// generated once at compile time (HyperRouter App. C.4); what runs is logits = x·wᵀ + b and the top-2 gate.
//
// Run: build/bin/moe-opt examples/hyper_router_step.mlir --moe-lower-to-llvm |
//        mlir-runner -e main -entry-point-result=void -shared-libs=<llvm-22>/lib/libmlir_runner_utils.so,...

func.func @route(%x: tensor<6x3xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>) {
  // Hypernetwork H(emb) = w2 · relu(w1 · emb + b1) + b2 with De = Dh = 2, E = 4, D = 3: w2 has E·(D+1) = 16 rows.
  %emb = arith.constant dense<[1.0, -0.5]> : tensor<2xf32>
  %w1 = arith.constant dense<[[0.8, 0.1], [-0.3, 0.9]]> : tensor<2x2xf32>
  %b1 = arith.constant dense<[0.1, 1.0]> : tensor<2xf32>
  %w2 = arith.constant dense<[[ 1.0,  0.0], [ 0.0,  1.0], [ 0.5, -0.5], [ 0.1,  0.0],
                              [-1.0,  0.5], [ 0.3,  0.3], [ 0.0, -1.0], [ 0.0,  0.2],
                              [ 0.2,  0.2], [-0.5,  1.0], [ 1.0,  1.0], [-0.1,  0.0],
                              [ 0.0,  0.0], [ 1.0, -1.0], [-0.2,  0.4], [ 0.0,  0.1]]> : tensor<16x2xf32>
  %b2 = arith.constant dense<0.0> : tensor<16xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<16x2xf32>, tensor<16xf32> -> tensor<4x3xf32>, tensor<4xf32>

  // Router logits r = x · wᵀ + b.
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<6x4xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<6x4xf32>) -> tensor<6x4xf32>
  %xw = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>,
                                       affine_map<(m, n, k) -> (m, n)>]
      ins(%x, %w : tensor<6x3xf32>, tensor<4x3xf32>) outs(%acc : tensor<6x4xf32>) -> tensor<6x4xf32>
  %logits = linalg.generic {indexing_maps = [affine_map<(t, e) -> (t, e)>, affine_map<(t, e) -> (e)>,
                                             affine_map<(t, e) -> (t, e)>],
                            iterator_types = ["parallel", "parallel"]}
      ins(%xw, %b : tensor<6x4xf32>, tensor<4xf32>) outs(%init : tensor<6x4xf32>) {
  ^bb0(%l: f32, %bias: f32, %out: f32):
    %s = arith.addf %l, %bias : f32
    linalg.yield %s : f32
  } -> tensor<6x4xf32>

  // Top-2 gate: softmax over the two selected logits (ties: lowest expert first).
  %gw, %gi = moe.topk_renorm %logits k(2) : tensor<6x4xf32> -> tensor<6x2xf32>, tensor<6x2xi32>
  return %gw, %gi : tensor<6x2xf32>, tensor<6x2xi32>
}

func.func @main() {
  // Token 3 is all zeros: its logits are the generated biases. Token 5 is a copy of token 0.
  %x = arith.constant dense<[[ 1.0, 0.0, 0.0], [ 0.0, 1.0, 0.0], [ 0.0, 0.0, 1.0],
                             [ 0.0, 0.0, 0.0], [ 0.5, -1.0, 2.0], [ 1.0, 0.0, 0.0]]> : tensor<6x3xf32>
  %w, %i = call @route(%x) : (tensor<6x3xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  %wu = tensor.cast %w : tensor<6x2xf32> to tensor<*xf32>
  %iu = tensor.cast %i : tensor<6x2xi32> to tensor<*xi32>
  call @printMemrefF32(%wu) : (tensor<*xf32>) -> ()
  call @printMemrefI32(%iu) : (tensor<*xi32>) -> ()
  return
}

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)
