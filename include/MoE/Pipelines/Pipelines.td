//===- Pipelines.td - The lowering pipelines and their options -*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// Each pipeline's name, summary and options, declared once: tools/moe-tblgen
// (-gen-moe-pipeline-options, PipelineOptions.cpp) derives from a Pipeline
// record its options struct (a PassPipelineOptions, the C++ API's and the
// command line's), which Pipelines.h and GPUPipeline.h include, and the
// arguments of its registration. The options are upstream's pass options
// (PassBase.td's Option), so a pipeline's read like a pass's.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_PIPELINES_TD
#define MOE_PIPELINES_PIPELINES_TD

include "mlir/Pass/PassBase.td"
include "MoE/Conversion/Passes.td"

// An option of `PassOptionsOf`'s pass that the pipeline shows with another
// default, `default` (a C++ expression, as an Option's), and `moreHelp` after
// the pass's help: a value the pass does not take, which the pipeline resolves
// before it hands the options on.
class PassOptionOverride<string optionArg, string default, string help> {
  string argument = optionArg;
  string defaultValue = default;
  string moreHelp = help;
}

// The options of `pass` (its Passes.td record) as the pipeline's own: each
// under the pass's argument, C++ name and type, with the pass's help and
// default, and handed to the pass by the options struct's
// `<pass, first letter lower case>Options()` (the pass's generated options
// struct, Passes.td's defaults with the pipeline's values put in). Every
// option of the pass is one, so that a new one reaches the pipeline with no
// edit, but those named in `hidden` (the pass keeps its default); those in
// `overrides` take the pipeline's default and help.
class PassOptionsOf<PassBase ofPass, list<string> hiddenArgs = [],
                    list<PassOptionOverride> optionOverrides = []> {
  PassBase pass = ofPass;
  list<string> hidden = hiddenArgs;
  list<PassOptionOverride> overrides = optionOverrides;
}

// A pass pipeline: its registration (`argument`, `summary`) and its options
// struct `cppOptionsName`, emitted where GEN_PIPELINE_OPTIONS_<the record's
// name in upper case> is defined. The struct's static getArgument() and
// getSummary() are the registration's.
class Pipeline<string pipelineArg, string optionsName> {
  string argument = pipelineArg;
  string cppOptionsName = optionsName;
  // A short one-line summary (moe-opt --help).
  string summary = "";
  // The options, in the order of the struct's members (--help sorts them).
  list<Option> options = [];
  // A pass whose options the pipeline shows too, after `options`; unset: none.
  PassOptionsOf passOptions = ?;
}

def MoELowerToLLVM : Pipeline<"moe-lower-to-llvm", "LowerToLLVMOptions"> {
  let summary = "Lower tensor functions holding moe ops to the LLVM dialect (CPU)";
  let options = [
    Option<"cpuKernels", "cpu-kernels", "bool", /*default=*/"true",
           "lower the moe ops with the fast CPU kernels (convert-moe-to-cpu) before the portable lowering "
           "(convert-moe-to-linalg), which then only sees what has no kernel">,
    Option<"numThreads", "num-threads", "int64_t", /*default=*/"1",
           "workers of the kernels' token loops. 1 (default): sequential code, no runtime library. N > 1: "
           "async-parallel-for onto the MLIR async runtime, which needs libmlir_async_runtime.so at run time "
           "(mlir-runner -shared-libs=...; the execution API loads it). 0: defaultNumThreads()">,
    Option<"targetCpu", "target-cpu", "std::string", /*default=*/"\"native\"",
           "the x86-64 CPU the code is for: an LLVM CPU name (x86-64-v3 = AVX2, x86-64-v4 = AVX-512, znver3, "
           "skylake-avx512, ...) or native (default: the host). Sets the kernels' vector width (256 bits without "
           "avx512f, 512 with it) and, unless native, every function's target-cpu/target-features, which the JIT "
           "and clang then compile for">,
    Option<"vectorBits", "vector-bits", "int64_t", /*default=*/"0",
           "the kernels' vector width in bits (convert-moe-to-cpu vector-bits); 0 (default): from target-cpu">,
    Option<"dense", "dense", "bool", /*default=*/"true",
           "compile the dense linalg ops (matmuls, contractions, reductions, elementwise chains) with the tiled, "
           "fused, vectorized and multi-threaded strategy (moe-dense-tile-and-vectorize); false: plain "
           "convert-linalg-to-loops">,
    Option<"blas", "blas", "bool", /*default=*/"false",
           "call cblas_sgemm (OpenBLAS) for f32 GEMM-shaped contractions (matmul, batch_matmul, einsum generics) "
           "of at least blas-min-flops multiply-adds per batch element (moe-linalg-to-blas); needs "
           "libopenblas.so at run time (the execution API loads it)">,
    Option<"blasMinFlops", "blas-min-flops", "int64_t", /*default=*/"1 << 20",
           "smallest M*N*K (per batch element) sent to BLAS">,
    Option<"tileM", "tile-m", "int64_t", /*default=*/"8",
           "register tile of the dense strategy: output rows of a contraction per vector.contract">,
    Option<"tileN", "tile-n", "int64_t", /*default=*/"32",
           "register tile of the dense strategy: output columns of a contraction per vector.contract">,
    Option<"resultsToOutParams", "results-to-out-params", "bool", /*default=*/"false",
           "public functions take their memref results as out-params appended to the arguments (the caller "
           "allocates them), upstream buffer-results-to-out-params; a result the function allocates itself is "
           "computed in the caller's buffer (static and dynamic shapes), any other (an argument, a constant) is "
           "copied into it. false: results are returned (the execution API)">,
  ];
}

def MoELowerToNVVM : Pipeline<"moe-lower-to-nvvm", "MoELowerToNVVMOptions"> {
  let summary = "Lower tensor functions holding moe ops to host LLVM IR launching fused CUDA kernels "
                "(gpu.binary: PTX, cubin or fatbin)";
  let options = [
    Option<"chip", "chip", "std::string", /*default=*/"\"sm_90\"", "target chip: sm_80, sm_90, sm_90a, ...">,
    Option<"features", "features", "std::string", /*default=*/"\"\"",
           "PTX features (default +ptx80, what sm_90 needs)">,
    Option<"format", "format", "std::string", /*default=*/"\"fatbin\"",
           "gpu.binary format: isa (PTX), bin (cubin), fatbin">,
    Option<"toolkit", "toolkit", "std::string", /*default=*/"\"/usr/local/cuda\"",
           "CUDA toolkit with ptxas and fatbinary">,
    Option<"optLevel", "opt-level", "unsigned", /*default=*/"3", "LLVM optimization level of kernels">,
    Option<"resultsToOutParams", "results-to-out-params", "bool", /*default=*/"false",
           "memref results of public functions as out-params appended to the arguments, allocated by the caller "
           "(moe-gpu-results-to-out-params)">,
    Option<"waitAtReturn", "wait-at-return", "bool", /*default=*/"true",
           "the host waits for the function's stream before returning; false: the work stays in flight on the "
           "ambient stream and index errors are left for moeGpuPollErrors (moe-gpu-host-stream)">,
  ];
  // convert-moe-to-gpu's options, handed to it as they are but topk-rounds,
  // whose `auto` buildMoELowerToNVVMPipeline resolves for the chip first.
  // block-size is not one: the pipeline's kernels run at the pass's default.
  let passOptions = PassOptionsOf<ConvertMoEToGPU, ["block-size"], [
    PassOptionOverride<"topk-rounds", /*default=*/"\"auto\"",
                       "; here also `auto` (the default): list-redux for sm_80 and later, else butterfly">,
  ]>;
}

#endif // MOE_PIPELINES_PIPELINES_TD
