// tools/moe-tblgen on the pipelines (include/MoE/Pipelines/Pipelines.td): each Pipeline record gets its options
// struct in its own GEN_PIPELINE_OPTIONS_ section, its registration's name and summary, a member per option as
// upstream declares a pass's, and, for the pass whose options it shows (PassOptionsOf), a member per option of the
// pass's record but the hidden ones, with the pass's help and default or the override's, and the method that hands
// them to the pass; the table's mistakes are tblgen errors.
// RUN: moe-tblgen -gen-moe-pipeline-options %tblgen_includes %s | FileCheck %s
// RUN: not moe-tblgen -gen-moe-pipeline-options -D UNKNOWN_HIDDEN %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=UNKNOWN-HIDDEN
// RUN: not moe-tblgen -gen-moe-pipeline-options -D UNKNOWN_OVERRIDE %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=UNKNOWN-OVERRIDE
// RUN: not moe-tblgen -gen-moe-pipeline-options -D HIDDEN_OVERRIDE %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=HIDDEN-OVERRIDE
// RUN: not moe-tblgen -gen-moe-pipeline-options -D TWICE %tblgen_includes %s 2>&1 | FileCheck %s --check-prefix=TWICE

include "MoE/Pipelines/Pipelines.td"

#ifdef UNKNOWN_HIDDEN
def Bad : Pipeline<"bad", "BadOptions"> { let passOptions = PassOptionsOf<ConvertMoEToGPU, ["block-sizes"]>; }
#endif
#ifdef UNKNOWN_OVERRIDE
def Bad : Pipeline<"bad", "BadOptions"> {
  let passOptions = PassOptionsOf<ConvertMoEToGPU, [], [PassOptionOverride<"topk", "\"auto\"", "">]>;
}
#endif
#ifdef HIDDEN_OVERRIDE
def Bad : Pipeline<"bad", "BadOptions"> {
  let passOptions = PassOptionsOf<ConvertMoEToGPU, ["topk-rounds"], [PassOptionOverride<"topk-rounds", "\"auto\"", "">]>;
}
#endif
#ifdef TWICE
def Bad : Pipeline<"bad", "BadOptions"> {
  let options = [Option<"balanceKernels", "balance-kernels", "bool", "true", "the pipeline's own">];
  let passOptions = PassOptionsOf<ConvertMoEToGPU>;
}
#endif

// moe-lower-to-llvm: its own options only, default and help as the record says.
// CHECK:      #ifdef GEN_PIPELINE_OPTIONS_MOELOWERTOLLVM
// CHECK:      struct LowerToLLVMOptions : public ::mlir::PassPipelineOptions<LowerToLLVMOptions> {
// CHECK:        return ::llvm::StringLiteral("moe-lower-to-llvm");
// CHECK:        return ::llvm::StringLiteral(R"PO(Lower tensor functions holding moe ops to the LLVM dialect (CPU))PO");
// CHECK:      ::mlir::detail::PassOptions::Option<bool> cpuKernels{*this, "cpu-kernels", ::llvm::cl::desc(R"PO(lower the moe ops with the fast CPU kernels (convert-moe-to-cpu) before
// CHECK-SAME:   ::llvm::cl::init(true)};
// CHECK:      ::mlir::detail::PassOptions::Option<int64_t> blasMinFlops{{.*}}::llvm::cl::init(1 << 20)};
// CHECK-NOT:  Options() const
// CHECK:      #undef GEN_PIPELINE_OPTIONS_MOELOWERTOLLVM

// moe-lower-to-nvvm: its own options, then convert-moe-to-gpu's in Passes.td's order, block-size hidden,
// topk-rounds with the pipeline's default and more help, all of them handed to the pass.
// CHECK:      #ifdef GEN_PIPELINE_OPTIONS_MOELOWERTONVVM
// CHECK:      struct MoELowerToNVVMOptions : public ::mlir::PassPipelineOptions<MoELowerToNVVMOptions> {
// CHECK:      ::mlir::detail::PassOptions::Option<std::string> features{*this, "features", ::llvm::cl::desc(R"PO(PTX features (default +ptx80, what sm_90 needs))PO"), ::llvm::cl::init("")};
// CHECK:      ::mlir::detail::PassOptions::Option<unsigned> optLevel{
// CHECK:      // convert-moe-to-gpu's options (Passes.td) but block-size.
// CHECK-NOT:  blockSize
// CHECK:      ::mlir::detail::PassOptions::Option<int64_t> sharedMemoryBytes{*this, "shared-memory-bytes", {{.*}}::llvm::cl::init(49152)};
// CHECK-NEXT: ::mlir::detail::PassOptions::Option<std::string> topkRounds{*this, "topk-rounds", {{.*}}moe-lower-to-nvvm picks list-redux for sm_80 and later; here also `auto` (the default): list-redux for sm_80 and later, else butterfly)PO"), ::llvm::cl::init("auto")};
// CHECK-NEXT: ::mlir::detail::PassOptions::Option<bool> balanceKernels{*this, "balance-kernels", {{.*}}::llvm::cl::init(true)};
// CHECK:      ::mlir::detail::PassOptions::Option<int64_t> dynamicSharedMemoryBytes{*this, "dynamic-shared-memory-bytes", {{.*}}::llvm::cl::init(0)};
// CHECK:      ::mlir::detail::PassOptions::Option<std::string> routeMap{*this, "route-map", {{.*}}::llvm::cl::init("lanes")};
// CHECK:      ConvertMoEToGPUOptions convertMoEToGPUOptions() const {
// CHECK-NEXT:   ConvertMoEToGPUOptions options;
// CHECK-NEXT:   options.sharedMemoryBytes = sharedMemoryBytes.getValue();
// CHECK-NEXT:   options.topkRounds = topkRounds.getValue();
// CHECK-NOT:    blockSize
// CHECK:        options.routeMap = routeMap.getValue();
// CHECK-NEXT:   return options;
// CHECK:      #undef GEN_PIPELINE_OPTIONS_MOELOWERTONVVM

// UNKNOWN-HIDDEN: error: convert-moe-to-gpu has no option 'block-sizes'
// UNKNOWN-OVERRIDE: error: convert-moe-to-gpu has no option 'topk'
// HIDDEN-OVERRIDE: error: 'topk-rounds' is overridden twice or hidden
// TWICE: error: the option 'balance-kernels' (balanceKernels) is declared twice
