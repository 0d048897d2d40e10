//===- CompiledModuleTest.h - A test suite sharing one compiled module ----===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_UNITTESTS_RUNTIME_COMPILEDMODULETEST_H
#define MOE_UNITTESTS_RUNTIME_COMPILEDMODULETEST_H

#include "MoE/Runtime/Executor.h"

#include "gtest/gtest.h"

#include <string>

namespace mlir::moe {
/// The fixture of a suite whose tests call one module, compiled once for the
/// whole suite (compilation is the slow part): `Suite::source()` is its MLIR.
/// Every test fails, with the compiler's message, when it does not compile.
template <typename Suite> class CompiledModuleTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    auto compiled = Executor::compile(Suite::source());
    if (!compiled) {
      compileError = new std::string(llvm::toString(compiled.takeError()));
      return;
    }
    module = compiled->release();
  }
  static void TearDownTestSuite() {
    delete module;
    module = nullptr;
    delete compileError;
    compileError = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(module, nullptr) << (compileError ? *compileError : "");
  }
  static inline CompiledModule *module = nullptr;
  static inline std::string *compileError = nullptr;
};
} // namespace mlir::moe

#endif // MOE_UNITTESTS_RUNTIME_COMPILEDMODULETEST_H
