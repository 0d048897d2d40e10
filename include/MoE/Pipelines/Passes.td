//===- Passes.td - The dense CPU strategy of moe-lower-to-llvm -*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_PASSES_TD
#define MOE_PIPELINES_PASSES_TD

include "mlir/Pass/PassBase.td"

def DenseTileAndVectorize : Pass<"moe-dense-tile-and-vectorize", "::mlir::func::FuncOp"> {
  let summary = "Tile, fuse and vectorize the dense linalg ops on tensors (the CPU strategy)";
  let description = [{
    The dense part of `moe-lower-to-llvm`: every linalg op on tensors with static shapes that the moe kernels
    left (the importer's `linalg.matmul`, `linalg.batch_matmul`, contractions and reductions written as
    `linalg.generic`, elementwise chains, transposes, fills) is

    1. tiled into an `scf.forall` over its outer parallel dimensions (the thread level: about
       4 × `num-threads` tiles; `moe-lower-to-llvm` maps the loop onto the async runtime), the op chosen as the
       *root* being the last op of a chain: its producers with one use (elementwise ops, fills, reductions,
       matmuls) are fused into the tile, so an elementwise consumer and its producer share one loop nest; an
       elementwise producer whose users all feed the root (softmax's exp, read by the row sum and the divide)
       is fused into each of them, recomputed rather than written to memory;
    2. tiled again inside the tile with `scf.for` to register tiles: a contraction to `tile-m` × `tile-n` output
       tiles and a reduction loop of step 1 over k (so that vectorization gives a `tile-m`×`tile-n`×1
       `vector.contract`, i.e. `tile-m` broadcast-FMAs on `tile-n`-wide rows, the accumulator kept in registers);
       other ops to rows of at most 64 elements on the innermost dimension; a reduction with one reduction loop
       longer than 64 becomes a *partial* reduction (upstream `PartialReductionOuterReduction` tiling): a loop
       that combines 64-element chunks elementwise into a 64-lane accumulator and one horizontal reduction per
       row after it (a horizontal reduction per chunk was 8x slower than eager for a row sum); other long
       reductions go in chunks of 256;
    3. vectorized (`linalg::vectorize`, static shapes only; an op it refuses stays as loops).

    Matmuls that `moe-linalg-to-blas` will turn into BLAS calls (`blas=true`, f32, at least `blas-min-flops`
    multiply-adds) are left alone. Ops with dynamic shapes are left for `convert-linalg-to-loops`.
  }];
  let options = [
    Option<"numThreads", "num-threads", "int64_t", /*default=*/"1",
           "workers the thread-level tiles are spread over (tile count ~ 4 x workers)">,
    Option<"tileM", "tile-m", "int64_t", /*default=*/"8",
           "register tile: output rows of a contraction per vector.contract">,
    Option<"tileN", "tile-n", "int64_t", /*default=*/"32",
           "register tile: output columns of a contraction per vector.contract (a multiple of 16 fills zmm registers)">,
    Option<"blas", "blas", "bool", /*default=*/"false",
           "leave the matmuls that moe-linalg-to-blas takes (see blas-min-flops) untiled">,
    Option<"blasMinFlops", "blas-min-flops", "int64_t", /*default=*/"1048576",
           "smallest M*N*K (per batch element) sent to BLAS">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
    "::mlir::vector::VectorDialect",
  ];
}

def DenseLowerVectors : Pass<"moe-dense-lower-vectors", "::mlir::func::FuncOp"> {
  let summary = "Hoist and lower the dense strategy's vector ops on buffers";
  let description = [{
    After bufferization: hoists loop-invariant `vector.transfer_read`/`transfer_write` pairs out of the reduction
    loops (the contraction's accumulator stays in registers over k), then lowers `vector.contract` to outer
    products (FMAs: `vector.fma` of a broadcast row element and a `tile-n`-wide row), `vector.multi_reduction`
    to inner reductions, transposes, broadcasts and transfer permutation maps, ready for `convert-vector-to-scf`
    and `convert-vector-to-llvm`.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect",
  ];
}

def LinalgToBlas : Pass<"moe-linalg-to-blas", "::mlir::ModuleOp"> {
  let summary = "Replace large f32 GEMM-shaped contractions on buffers by cblas_sgemm calls";
  let description = [{
    A contraction that is one GEMM per batch element, `C[b, m, n] += A[b?, m, k] · B[b?, k, n]` (`linalg.matmul`,
    `linalg.batch_matmul`, or a multiply-add `linalg.generic` such as the importer's einsums: `m`, `n` the two
    innermost dimensions of C, one reduction loop `k` read by both operands, at most one batch loop of size > 1,
    which A or B may not read: a broadcast, batch stride 0), on f32 memrefs with static strides, a unit stride
    along one of each operand's two matrix dimensions and at least `blas-min-flops` multiply-adds (per batch
    element) becomes a call to the CBLAS function `cblas_sgemm` (row-major; an operand with unit stride along its
    rows is passed transposed; beta = 1 since linalg accumulates into its output; batches: an `scf.for` of calls). The pointers are the operands' aligned base pointers plus their offsets. The library (OpenBLAS
    from Debian: `libopenblas.so`) must be loaded at run time: the execution API does it, `mlir-runner` needs
    `-shared-libs=/usr/lib/x86_64-linux-gnu/libopenblas.so`. Its thread count is OpenBLAS's own
    (`OPENBLAS_NUM_THREADS`, else `OMP_NUM_THREADS`, else all cores).
  }];
  let options = [
    Option<"minFlops", "blas-min-flops", "int64_t", /*default=*/"1048576",
           "smallest M*N*K (per batch element) sent to BLAS">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
  ];
}

def ApproximateVectorMath : Pass<"moe-approximate-vector-math", "::mlir::func::FuncOp"> {
  let summary = "Replace vector math functions (exp, log, tanh, erf, ...) by upstream polynomial approximations";
  let description = [{
    LLVM has no vector form of `expf`, `logf`, `tanhf` or `erff` without a vector math library, so a
    `math.exp` on `vector<16xf32>` that reaches `convert-math-to-llvm` becomes sixteen scalar libm calls (a
    vectorized softmax ran 11x slower than eager because of it). This pass rewrites the math ops whose result is
    a vector with upstream's polynomial approximations (`populateMathPolynomialApproximationPatterns`, the
    Cephes-style range reductions of `mlir/Dialect/Math/Transforms`), which are plain vector arithmetic. Scalar
    math ops are left to libm (exact to the last ulp). `math.rsqrt` is left alone: it lowers to a vector
    `sqrt` and a division, both native.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::math::MathDialect",
    "::mlir::vector::VectorDialect",
  ];
}

#endif // MOE_PIPELINES_PASSES_TD
