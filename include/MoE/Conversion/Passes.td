//===- Passes.td - Conversions out of the moe dialect ------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg"> {
  let summary = "Lower moe ops to linalg, tensor, arith, math and scf (the portable CPU reference)";
  let description = [{
    Rewrites every `moe` op into upstream structured ops on tensors: `linalg.generic` reductions, `linalg.matmul`,
    `linalg.softmax` where one fits, `tensor` reshapes and `scf` loops where the computation is sequential by
    nature (top-k selection rounds, online-softmax key tiles). The result stays on tensors, so one-shot
    bufferization and the upstream CPU pipeline take it from there (see `moe-lower-to-llvm`).
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::cf::ControlFlowDialect",
    "::mlir::func::FuncDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
  ];
}

def ConvertMoEToCPU : Pass<"convert-moe-to-cpu"> {
  let summary = "Lower moe ops to tiled, vectorized and parallel CPU kernels";
  let description = [{
    Rewrites the moe ops it has a kernel for into tiled, vectorized loops on memrefs (`vector` dialect, one
    `vector<16xf32>` per AVX-512 register) whose independent items (tokens, query tiles, feature blocks) run on
    `num-threads` workers: an `scf.parallel` over the workers, each taking whole items in a fixed cyclic order, so
    results are bit-identical whatever the thread count. `moe-lower-to-llvm` maps that loop onto the MLIR async
    runtime (`async-parallel-for`, one task per worker); with `num-threads=1` it is a plain `scf.for` that needs no
    runtime library.

    Kernels: `topk_renorm` (vectorized max rounds over packed (key, index) candidates), `similarity_inform` and
    `attention_posterior` (flash-style key tiles with an online softmax; N×N is never built), `mad_dispersion`
    (segmented statistics), `adjacency_update` (co-selection counts) and `hyper_router` (GEMVs). Fused routing
    ops are split first, so that their mixing op and gate get kernels. Ops or forms without a kernel are left for
    `convert-moe-to-linalg`, the portable reference lowering, which `moe-lower-to-llvm` runs right after.
  }];
  let options = [
    Option<"numThreads", "num-threads", "int64_t", /*default=*/"1",
           "workers of the parallel token loops (1 = sequential, no runtime library needed)">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::func::FuncDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
    "::mlir::vector::VectorDialect",
  ];
}

def ConvertMoEToGPU : Pass<"convert-moe-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Lower moe ops to hand-designed fused GPU kernels (gpu dialect) launched from host code";
  let description = [{
    Rewrites every tensor-level `moe` op into `bufferization.to_buffer` of its operands, `gpu.alloc` of its results,
    one or more `gpu.launch_func` of kernels generated into `gpu.module @moe_kernels`, and
    `bufferization.to_tensor` of the results; one-shot bufferization then makes the function boundaries device
    memrefs. Each op runs on one stream (`gpu.wait async` ... `gpu.wait`). Kernels: a (sub-)warp per token top-k with
    butterfly shuffles (`topk_renorm`, a block per token beyond 1024 experts), flash-style mixers that stream key
    tiles through workgroup memory with an online softmax and a K-wide accumulator (`similarity_inform`,
    `attention_posterior`, their `_topk` forms select the experts in the epilogue), an entropy reduction for the
    min-entropy head, deterministic segmented reductions (`mad_dispersion`), integer co-selection counts
    (`adjacency_update`) and warp GEMVs (`hyper_router`). Out-of-range `assign`/`idx` elements are skipped and
    recorded in the device error word of the runtime (lib/Runtime/CUDA), which the host code checks after the op.

    Sizes over what a CUDA device supports are compile-time errors of the op that name the limit: shared memory
    per block (`shared-memory-bytes`, and 48 KiB of static shared memory on every device), threads per block
    (1024; 1024 x 1024 x 64) and, where the shapes are static, the grid (2^31 - 1 blocks in x, 65535 in y and z).
    A grid that only a dynamic size makes too large fails at launch, reported by the runtime.
  }];
  let options = [
    Option<"blockSize", "block-size", "int64_t", /*default=*/"128",
           "threads per block of the token-parallel kernels (a multiple of 32)">,
    Option<"sharedMemoryBytes", "shared-memory-bytes", "int64_t", /*default=*/"49152",
           "shared memory per block the kernels may use (bytes); the default, 48 KiB, is what every CUDA device "
           "gives a block without an opt-in, and the cap of static shared memory">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
  ];
}

#endif // MOE_CONVERSION_PASSES_TD
