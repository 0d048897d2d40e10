// Found by moe-fuzz (issue #15 run): Debian's MLIR 22 parser crashes (SEGV in NamedAttrList::set called from
// linalg::ReduceOp::parse) on a `dimensions` list holding a bare identifier. Upstream, not ours: moe-fuzz skips
// inputs with linalg.reduce until the fix reaches the LLVM 22 packages. Reproduce: mlir-opt-22 <this file>.
func.func @f(%p: tensor<2x3xf32>, %z: tensor<f32>) -> tensor<f32> {
  %sum = linalg.reduce ins(%p : tensor<2x3xf32>) outs(%z : tensor<f32>) dimensions = [0,vecto]
    (%in: f32, %acc: f32) {
      %t = arith.addf %in, %acc : f32
      linalg.yield %t : f32
    }
  return %sum : tensor<f32>
}
