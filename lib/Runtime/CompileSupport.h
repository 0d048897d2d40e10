//===- CompileSupport.h - Shared pieces of the in-process compilers -*- C++
//-*-===//
//
// Part of the MoE-MLIR project.
//
// What the execution API (Executor.cpp) and the kernel compiler
// (Compiler/Compile.cpp) both need: the diagnostics of a compilation as one
// message, and the code generator's level for an optimization level.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_COMPILESUPPORT_H
#define MOE_LIB_RUNTIME_COMPILESUPPORT_H

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/CodeGen.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <utility>

namespace mlir::moe::compile_support {

inline StringRef severityName(DiagnosticSeverity severity) {
  static constexpr std::pair<DiagnosticSeverity, StringLiteral> kNames[] = {
      {DiagnosticSeverity::Error, "error"},
      {DiagnosticSeverity::Warning, "warning"},
      {DiagnosticSeverity::Note, "note"},
      {DiagnosticSeverity::Remark, "remark"}};
  for (auto [s, name] : kNames)
    if (s == severity)
      return name;
  llvm_unreachable("unknown diagnostic severity");
}

/// Collects the diagnostics of a compilation into one string.
struct DiagnosticCollector {
  explicit DiagnosticCollector(MLIRContext &ctx)
      : handler(&ctx, [this](Diagnostic &diag) {
          llvm::raw_string_ostream os(messages);
          os << "\n  " << diag.getLocation() << ": ";
          os << severityName(diag.getSeverity()) << ": " << diag;
          for (Diagnostic &note : diag.getNotes())
            os << "\n    note: " << note;
          return success();
        }) {}
  std::string messages;
  ScopedDiagnosticHandler handler;
};

/// The code generator's level for the optimization level `optLevel` (0-3;
/// above 3 is 3).
inline llvm::CodeGenOptLevel codeGenLevel(unsigned optLevel) {
  switch (optLevel) {
  case 0:
    return llvm::CodeGenOptLevel::None;
  case 1:
    return llvm::CodeGenOptLevel::Less;
  case 2:
    return llvm::CodeGenOptLevel::Default;
  default:
    return llvm::CodeGenOptLevel::Aggressive;
  }
}

} // namespace mlir::moe::compile_support

#endif // MOE_LIB_RUNTIME_COMPILESUPPORT_H
