//===- KernelKeyC.cpp - A kernel key as MLIR, for C callers ---------------===//
//
// Part of the MoE-MLIR project.
//
// moeKernelModule and moeKernelKeyOp (include/MoE/Runtime/KernelCompiler.h):
// the op of a torch op's kernel key built with its ODS builder, result types
// inferred and verified (MoE/IR/KernelKey.h), for the torch ops' kernel cache
// and for the FX importer (python/moe_mlir/runtime/compiler.py). Each call has
// its own context; diagnostics go to `err`.
//
//===----------------------------------------------------------------------===//

#include "ErrorBuffer.h"
#include "MoE/IR/KernelKey.h"
#include "MoE/Runtime/KernelCompiler.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include "llvm/Support/raw_ostream.h"

#include <cstring>

using namespace mlir;

namespace {
/// Runs `produce(context, text)` in a fresh context holding the dialects a
/// key's module uses; copies its text into `out` (NUL-terminated when it fits
/// in `outCap` bytes), its length into `*outLen`; 0, or 1 with the
/// diagnostics in `err`.
template <typename Produce>
int32_t withKey(const char *what, const char *key, int64_t len, char *out,
                int64_t outCap, int64_t *outLen, char *err, int64_t errCap,
                Produce produce) {
  if (!key || len < 0 || !outLen) {
    moe::writeErrorBuffer(err, errCap,
                          std::string(what) + ": null key or length");
    return 1;
  }
  DialectRegistry registry;
  registry.insert<moe::MoEDialect, func::FuncDialect, arith::ArithDialect,
                  math::MathDialect>();
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    if (!diagnostics.empty())
      diagnostics += "\n";
    diagnostics += diag.str();
    for (const Diagnostic &note : diag.getNotes())
      diagnostics += "\n  note: " + note.str();
    return success();
  });
  std::string text;
  if (failed(produce(&context, llvm::StringRef(key, size_t(len)), text))) {
    moe::writeErrorBuffer(
        err, errCap,
        diagnostics.empty()
            ? std::string(what) + " failed"
            : moe::inKeyNames(llvm::StringRef(key, size_t(len)), diagnostics));
    return 1;
  }
  *outLen = int64_t(text.size());
  if (out && outCap > int64_t(text.size())) {
    std::memcpy(out, text.data(), text.size());
    out[text.size()] = '\0';
  }
  return 0;
}
} // namespace

extern "C" int32_t moeKernelModule(const char *key, int64_t len, char *out,
                                   int64_t outCap, int64_t *outLen, char *err,
                                   int64_t errCap) {
  return withKey("moeKernelModule", key, len, out, outCap, outLen, err, errCap,
                 [](MLIRContext *context, StringRef key, std::string &text) {
                   OwningOpRef<ModuleOp> module =
                       moe::buildKernelModule(context, key);
                   if (!module)
                     return failure();
                   llvm::raw_string_ostream os(text);
                   module->print(os);
                   return success();
                 });
}

extern "C" int32_t moeKernelKeyOps(char *out, int64_t outCap,
                                   int64_t *outLen) {
  std::string text = llvm::join(moe::kernelKeyOps(), " ");
  *outLen = int64_t(text.size());
  if (out && outCap > int64_t(text.size())) {
    std::memcpy(out, text.data(), text.size());
    out[text.size()] = '\0';
  }
  return 0;
}

extern "C" int32_t moeKernelKeyOp(const char *key, int64_t len, char *out,
                                  int64_t outCap, int64_t *outLen, char *err,
                                  int64_t errCap) {
  return withKey(
      "moeKernelKeyOp", key, len, out, outCap, outLen, err, errCap,
      [](MLIRContext *context, StringRef key, std::string &text) {
        OwningOpRef<ModuleOp> module = moe::buildKernelModule(context, key);
        if (!module)
          return failure();
        auto func = cast<func::FuncOp>(module->getBody()->front());
        Operation &op = func.getBody().front().front();
        llvm::raw_string_ostream os(text);
        os << op.getName() << " " << op.getNumRegions() << "\n";
        llvm::interleave(
            op.getOperands(), os,
            [&](Value v) { os << cast<BlockArgument>(v).getArgNumber(); },
            " ");
        os << "\n";
        NamedAttrList attrs(op.getDiscardableAttrDictionary());
        if (auto props = dyn_cast_or_null<DictionaryAttr>(
                op.getPropertiesAsAttribute()))
          attrs.append(props.getValue());
        attrs.getDictionary(context).print(os);
        os << "\n";
        for (Type type : op.getResultTypes())
          os << type << "\n";
        return success();
      });
}
