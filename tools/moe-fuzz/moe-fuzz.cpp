//===- moe-fuzz.cpp - libFuzzer target: parser, verifier, moe pipelines ---===//
//
// Part of the MoE-MLIR project.
//
// One input = one byte choosing a pipeline, then MLIR text (the seed corpus is
// test/**/*.mlir, split at `// -----`, see scripts/fuzz.sh). The target
// parses, verifies and runs the pipeline; libFuzzer reports a crash, an abort,
// a sanitizer error, a hang (-timeout) or memory blow-up (-rss_limit_mb).
//
// One more rule (issue #15), checked on inputs made only of the dialects a
// model uses (builtin, func, arith, tensor, moe): an input the verifier
// accepts lowers, or fails with a diagnostic of a moe op (a limit, an
// unsupported mode) -- never an error from the IR a lowering produced
// (invalid IR, an out-of-bounds slice, a failed legalization). Such a
// failure aborts, so libFuzzer keeps the input as a crash.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/Passes.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/Pipelines/GPUPipeline.h"
#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Support/NestingDepth.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mlir;

namespace {
/// The pipelines of issue #15: folds, the portable, CPU and GPU lowerings.
const char *const kPipelines[] = {
    "canonicalize",
    "convert-moe-to-linalg",
    "moe-lower-to-llvm{num-threads=1}",
    "moe-lower-to-llvm{num-threads=1 cpu-kernels=false}",
    "moe-fuse-routing,moe-split-fused-routing,canonicalize",
    "moe-lower-to-nvvm{chip=sm_90 format=isa}",
    "moe-legalize-shapes,convert-moe-to-gpu",
};
constexpr size_t kNumPipelines = sizeof(kPipelines) / sizeof(kPipelines[0]);

MLIRContext &context() {
  static MLIRContext *ctx = [] {
    registerAllPasses();
    moe::registerMoEConversionPasses();
    moe::registerMoEPipelines();
    moe::registerMoEGPUPipelines();
    moe::registerMoETransformsPasses();
    DialectRegistry registry;
    registry.insert<moe::MoEDialect>();
    registerAllDialects(registry);
    registerAllExtensions(registry);
    registerAllToLLVMIRTranslations(registry);
    auto *c = new MLIRContext(registry, MLIRContext::Threading::DISABLED);
    c->loadAllAvailableDialects();
    return c;
  }();
  return *ctx;
}

/// How far the inputs got, printed at exit when MOE_FUZZ_STATS is set (to
/// tell a run that reached the pipelines from one that only hit the parser).
struct Stats {
  uint64_t inputs = 0, verified = 0, lowered = 0, diagnosed = 0;
  ~Stats() {
    if (std::getenv("MOE_FUZZ_STATS"))
      llvm::errs() << "moe-fuzz stats: " << inputs << " inputs, " << verified
                   << " verified, " << lowered << " lowered, " << diagnosed
                   << " rejected by a pass with a diagnostic\n";
  }
} stats;

/// Only builtin/func/arith/tensor/moe ops: the inputs the strict rule covers.
bool isModelOnly(ModuleOp module) {
  bool only = true;
  module.walk([&](Operation *op) {
    StringRef ns = op->getName().getDialectNamespace();
    if (ns != "builtin" && ns != "func" && ns != "arith" && ns != "tensor" &&
        ns != "moe")
      only = false;
  });
  return only;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  ++stats.inputs;
  const char *pipeline = kPipelines[data[0] % kNumPipelines];
  std::string text(reinterpret_cast<const char *>(data) + 1, size - 1);
  // Known crashes of the upstream parser (tools/moe-fuzz/upstream/*.mlir
  // reproduce them): not ours to fix, and they would hide ours.
  if (text.find("linalg.reduce") != std::string::npos)
    return 0;
  // The parser's recursion per nesting level (upstream, no limit): moe-opt
  // rejects such input before parsing with the same check.
  if (moe::findExcessiveNesting(text))
    return 0;
  MLIRContext &ctx = context();

  std::vector<std::string> diagnostics;
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &diag) {
    diagnostics.push_back(diag.str());
    return success();
  });
  ParserConfig config(&ctx);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, config);
  if (!module || failed(verify(*module)))
    return 0;
  ++stats.verified;
  bool strict = isModelOnly(*module);

  PassManager pm(&ctx);
  diagnostics.clear();
  if (failed(parsePassPipeline(std::string("builtin.module(") + pipeline + ")",
                               pm)))
    std::abort(); // a typo above, not the input
  if (succeeded(pm.run(*module))) {
    ++stats.lowered;
    return 0;
  }
  ++stats.diagnosed;
  if (!strict)
    return 0;
  for (const std::string &message : diagnostics)
    if (StringRef(message).starts_with("'moe."))
      return 0; // a diagnostic of a moe op: a limit or an unsupported mode
  llvm::errs() << "moe-fuzz: verified input failed in '" << pipeline
               << "' without a moe diagnostic:\n";
  for (const std::string &message : diagnostics)
    llvm::errs() << "  " << message << "\n";
  std::abort();
}
