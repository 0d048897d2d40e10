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
    "::mlir::bufferization::BufferizationDialect",
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
    vector register of the target per vector: `vector<16xf32>` with `vector-bits=512` (AVX-512, the default),
    `vector<8xf32>` with `vector-bits=256` (AVX2); `moe-lower-to-llvm` derives it from its `target-cpu`) whose independent items (tokens, query tiles, feature blocks) run on
    `num-threads` workers: an `scf.parallel` over the workers, each taking whole items in a fixed cyclic order, so
    results are bit-identical whatever the thread count. `moe-lower-to-llvm` maps that loop onto the MLIR async
    runtime (`async-parallel-for`, one task per worker); with `num-threads=1` it is a plain `scf.for` that needs no
    runtime library.

    Kernels: `topk_renorm` (vectorized max rounds over packed (key, index) candidates), `similarity_inform` and
    `attention_posterior` (flash-style key tiles with an online softmax; N×N is never built), `mad_dispersion`
    (segmented statistics), `adjacency_update` (co-selection counts), `hyper_router` (GEMVs), `route` (vector
    scoring passes, group scores by masked vector maxes, the same max rounds as `topk_renorm`) and `dispatch_plan`
    (a counting sort whose two O(T·k) phases run on the workers, per-item cursors keeping the order stable); a
    `route` whose indices feed a `dispatch_plan` over the same experts is one kernel (the plan's counts are taken
    while the routed rows are in cache). Fused routing ops are split first, so that their mixing op and gate get
    kernels. Ops or forms without a kernel are left for
    `convert-moe-to-linalg`, the portable reference lowering, which `moe-lower-to-llvm` runs right after.

    Per target: read-modify-write loops over vectors (`mad_dispersion`'s statistics) use plain loads and
    stores for whole vectors and masked ones only for a ragged tail, emitted as a separate branch (masked stores
    are microcoded on AVX2 machines and defeat store-to-load forwarding); no kernel emits gathers or scatters.
    `topk_renorm` over at most 16 experts (a power of two), and `route` so (k <= 8, no groups or replay, a
    sigmoid, no score, or a custom score taken before the selection), put one row per lane (a block of rows transposed in registers by shuffles), so
    that small K fills the vector.

    Buffers: each kernel is a `moe.kernel` (destination style: the operands it reads as `ins`, `tensor.empty`
    destinations of its results as `outs`) whose body works on their buffers; only the kernel's own scratch is a
    `memref.alloc`. One-shot bufferization, which `moe-lower-to-llvm` runs after the conversions, inlines the body
    on the operands' buffers and decides where each result lives (a fresh allocation, or the caller's buffer).
  }];
  let options = [
    Option<"numThreads", "num-threads", "int64_t", /*default=*/"1",
           "workers of the parallel token loops (1 = sequential, no runtime library needed)">,
    Option<"vectorBits", "vector-bits", "int64_t", /*default=*/"512",
           "width of the target's vector registers: 512 (AVX-512: 16 f32 lanes), 256 (AVX2: 8 lanes) or 128 "
           "(4 lanes)">,
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
    Rewrites every tensor-level `moe` op into a destination-style `moe.kernel` whose `ins` are its operands and whose
    `outs` are `bufferization.alloc_tensor`s of its results; the kernel's body is the host code on their buffers: one
    or more `gpu.launch_func` of kernels generated into `gpu.module @moe_kernels`, with `gpu.alloc`/`gpu.dealloc` of
    temporaries. `moe-gpu-bufferize` (one-shot bufferization) then makes the outs device allocations and the function
    boundaries device memrefs. Each op runs on one stream (`gpu.wait async` ... `gpu.wait`), which
    `moe-gpu-host-stream` then joins into one stream per function with one host wait. Kernels: a (sub-)warp per
    token top-k with butterfly shuffles (`topk_renorm`, a block per token beyond 1024 experts), flash-style mixers
    that stream key tiles through workgroup memory with an online softmax and a K-wide accumulator (`similarity_inform`,
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
    Option<"topkRounds", "topk-rounds", "std::string", /*default=*/"\"butterfly\"",
           "rounds of the register top-k of topk_renorm (K <= 1024): `butterfly` (shuffles of packed 64-bit "
           "candidates, any chip; the default), `redux` (32-bit keys, redux.sync max/min; sm_80+) or `list` "
           "(sm_80+): 4 lanes a token for K <= 64, 8 up to 256, 16-byte loads where the row is aligned, each "
           "lane's best ceil(k / lanes) + 3 candidates sorted in registers, a round = the group's best head (two "
           "32-bit butterflies, redux.sync for whole warps) and a pop, the lists refilled outside the round loop "
           "when one runs out; or `list-redux` (sm_80+): both kernels, redux up to 6144 tokens and list past them, "
           "chosen on the host by the token count (list is the faster at many tokens, redux at few). "
           "moe-lower-to-nvvm picks list-redux for sm_80 and later">,
    Option<"balanceKernels", "balance-kernels", "bool", /*default=*/"true",
           "lower the load-balancing ops router_stats, router_stats_grad, load_balancing_loss, router_z_loss "
           "and router_z_loss_grad (a warp per row, per-block partials summed in a fixed order, no atomics; "
           "RouterStats.cpp, RouterZLoss.cpp). On by default; false: these ops have no GPU lowering">,
    Option<"flashMmaBlockRows", "flash-mma-block-rows", "int64_t", /*default=*/"128",
           "query rows a block of the tensor-core kernel's 4 warps: 64 (one 16-row MMA tile a warp) "
           "or 128 (the default; two: each key and value fragment loaded by ldmatrix feeds both tiles' MMAs), with the "
           "staging's 16-byte alignment decided once outside the key loops (the aligned loops' 16-byte loads or "
           "cp.async copies unrolled, issued back to back). 128 applies to similarity_inform, its training "
           "forward and the fused top-k (the thread's four rows selected one after another; not "
           "attention_posterior) and both tiles' fragments fit (D = 64; not D = 256)">,
    Option<"flashMmaKeySplits", "flash-mma-key-splits", "int64_t", /*default=*/"4",
           "with flash-mma-block-rows=128 (where it applies): at most this many blocks (1-16) share a row "
           "block's keys when the grid has fewer than 264 blocks (two blocks on each of 132 multiprocessors; the "
           "splits chosen at run time from B and N): each writes its rows' unnormalized sums, max and sum to a "
           "workspace and a second kernel combines them in split order (for the fused top-k a quad of lanes a row, "
           "selecting as the kernel's epilogue does; 4: the default). 1: no split">,
    Option<"flashMmaGrad", "flash-mma-grad", "bool", /*default=*/"false",
           "similarity_inform_grad with f16/bf16 u and e (one type), no ws, at most 256 features and 64 experts on "
           "tensor cores (FlashMmaGrad.cpp, issue #47 item 3): FlashAttention-2's backward as two deterministic "
           "passes, by query (dq) and by key (de, dk), each recomputing S = X U^T and <dp, e> on mma.sync with one "
           "FFMA and one EX2 a score and taking the sums dX U and P dp on mma.sync (dp, P and dX rounded to the "
           "operand type); past 128 features the features split over two blocks along the grid's z, the column "
           "tiles copied by cp.async; the recomputed forward, where p and lse are not saved, on the tensor-core "
           "kernel. Off by default">,
    Option<"flashMmaTf32", "flash-mma-tf32", "bool", /*default=*/"false",
           "similarity_inform, its training forward and similarity_inform_grad's recomputed forward with f32 operands "
           "(ws's f32 query too), at most 64 features and experts, "
           "no fused top-k, on the tensor cores at f32's accuracy by 3xTF32 (FlashTf32.cpp): each operand split "
           "into a tf32 big part and the f32 rest, a product the sum of three mma.sync m16n8k8 tf32 products with "
           "f32 sums (big.big + big.small + small.big: about 2^-20 of a product's magnitude, against f32's 2^-24 "
           "a rounding); FlashAttention-2's tiles (4 warps, 64 rows, 64-key tiles in shared memory, P.e from the "
           "logits' C fragments with the keys taken in an order that makes them the A fragments). Off by default">,
    Option<"flashCausalBalance", "flash-causal-balance", "bool", /*default=*/"true",
           "under a causal mask, the flash kernels' blocks (similarity_inform, its training forward and "
           "backward; scalar and tensor-core; the split-key kernel where it is estimated at most 176 registers) "
           "take the row tiles heaviest first, and the first wave's second round (blocks %nsmid to 2 %nsmid) in "
           "reverse, so that the two blocks a multiprocessor holds carry about equal work (FlashTile.h, "
           "FlashBlockOrder). A permutation of the blocks: the same results. false: the grid's order (tile x of "
           "batch element y), the light tiles first">,
    Option<"dynamicSharedMemoryBytes", "dynamic-shared-memory-bytes", "int64_t", /*default=*/"0",
           "the chip's opt-in maximum of shared memory a block (bytes; a multiprocessor holds it plus 1 KiB), "
           "the limit of the kernels that opt in past shared-memory-bytes; 0: none. "
           "moe-lower-to-nvvm sets it from its chip where it is 0: 227 KiB on sm_90, 163 KiB on sm_80 and "
           "sm_87, 99 KiB on sm_86 and sm_89, 96 KiB on sm_70 and sm_72, 64 KiB on sm_75">,
    Option<"routeMap", "route-map", "std::string", /*default=*/"\"lanes\"",
           "how route's kernel maps a token onto lanes: `warp` (one warp a token, the experts strided over its "
           "lanes, butterflies of 64-bit candidates; E <= 1024) or `lanes` (the default): "
           "4-32 lanes a token sized by E (8 for DeepSeek-V3's 256: one lane a group of 32), each lane holding "
           "a contiguous run of experts loaded 16 bytes at a time where aligned, scored once (sigmoid with "
           "ex2.approx/rcp.approx), groups ranked from the lanes' top-2 sums by shuffles, the top-k by "
           "topk-rounds=list's candidate lists, the picks' scores kept in shared memory and the weights "
           "stored coalesced; E <= 4096 (up to 128 experts a lane), k <= E, groups of any size split evenly "
           "over lanes or whole on a lane, or past 1024 experts spread over lanes with empty slots "
           "(otherwise the warp kernel); the block halves where its shared "
           "memory or registers would not fit">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::func::FuncDialect",
    "::mlir::NVVM::NVVMDialect",
    "::mlir::nvgpu::NVGPUDialect",
    "::mlir::vector::VectorDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
  ];
}

def MoEGPUBufferize : Pass<"moe-gpu-bufferize", "::mlir::ModuleOp"> {
  let summary = "One-shot bufferization of GPU host code: every allocation is a device allocation";
  let description = [{
    Upstream one-shot bufferization across function boundaries (identity layouts there, so public functions take and
    return plain memrefs), with the allocation and copy functions of device memory: a buffer one-shot allocates (the
    `outs` of the `moe.kernel`s of convert-moe-to-gpu, a returned `tensor.empty`, a copy) is `gpu.alloc async` and a
    copy is `gpu.memcpy async`, each on a stream of its own (`gpu.wait async` ... `gpu.wait`) that
    `moe-gpu-host-stream` joins with the host code around it. Nothing is deallocated: the results of a function are
    the caller's, and the host code frees its own temporaries on its stream.
  }];
  let dependentDialects = [
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::memref::MemRefDialect",
  ];
}

def MoEGPUHostStream : Pass<"moe-gpu-host-stream", "::mlir::func::FuncOp"> {
  let summary = "Run the GPU host code of a function on one stream, without a host wait per op";
  let description = [{
    `convert-moe-to-gpu` gives each op its own stream chain (`gpu.wait async` ... `gpu.wait`). On the buffers of a
    function (after bufferization), this pass joins the chains of each block into one: the blocking `gpu.wait` that
    ends an op's chain is dropped and the next op continues on its token (the same stream; `gpu-to-llvm` then
    creates one stream per block, the runtime's ambient stream when the caller set one). A host wait is kept
    only before an op with host side effects (e.g. `moeGpuCheckErrors`, which reads the error word) and, with
    `wait-at-return` (the default), before the block's terminator: one wait per function instead of one per op.

    With `wait-at-return=false` the function returns with its work in flight on the stream, and the calls to
    `moeGpuCheckErrors` are removed: for callers that run the function on their own stream (the runtime's ambient
    stream, `moeGpuSetStream`), order their work after it on that stream and read index errors with
    `moeGpuPollErrors` after they synchronize (the `torch.ops.moe.*` CUDA kernels). Without an ambient stream the
    function's stream is then never synchronized nor destroyed.

    ```mlir
    %t0 = gpu.wait async
    %t1 = gpu.launch_func async [%t0] @moe_kernels::@a ...
    gpu.wait [%t1]
    %t2 = gpu.wait async
    %t3 = gpu.launch_func async [%t2] @moe_kernels::@b ...
    gpu.wait [%t3]
    return
    // becomes
    %t0 = gpu.wait async
    %t1 = gpu.launch_func async [%t0] @moe_kernels::@a ...
    %t3 = gpu.launch_func async [%t1] @moe_kernels::@b ...
    gpu.wait [%t3]              // absent with wait-at-return=false
    return
    ```
  }];
  let options = [
    Option<"waitAtReturn", "wait-at-return", "bool", /*default=*/"true",
           "wait for the stream before the terminator of each block (false: return with the work in flight)">,
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEGPUResultsToOutParams : Pass<"moe-gpu-results-to-out-params", "::mlir::ModuleOp"> {
  let summary = "Device memref results of public functions as out-params the caller allocates";
  let description = [{
    The GPU form of upstream `buffer-results-to-out-params` (which handles host `memref.alloc` only): every memref
    result of a public function becomes an argument appended after the others. A result the function allocates
    with `gpu.alloc` (the results of the moe ops' host code) is computed in the caller's buffer: the allocation is
    removed and its stream order kept. Any other result (an argument returned as it is, a constant) is copied
    into the out-param with `gpu.memcpy` on a stream of its own, waited for. Run after bufferization, before
    `moe-gpu-host-stream` and the GPU-to-LLVM conversions. The `torch.ops.moe.*` CUDA kernels are compiled so
    (outputs allocated by torch, written in place).
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::memref::MemRefDialect"];
}

#endif // MOE_CONVERSION_PASSES_TD
