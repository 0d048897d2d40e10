//===- ExecutorC.cpp - C interface of the execution API -------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/ExecutorC.h"
#include "MoE/Runtime/Executor.h"

#include "llvm/Support/Error.h"

#include <cstring>
#include <string>

using namespace mlir::moe;

namespace {
constexpr int32_t kNumDTypes = static_cast<int32_t>(DType::I64) + 1;

void writeError(char *err, int64_t errCap, const std::string &message) {
  if (!err || errCap <= 0)
    return;
  std::strncpy(err, message.c_str(), errCap - 1);
  err[errCap - 1] = '\0';
}

/// Views the C tensors as HostTensors; fails on an unknown dtype or a
/// negative rank before anything reads the data.
bool toHostTensors(const MoeTensorC *tensors, int32_t count, const char *what,
                   llvm::SmallVectorImpl<HostTensor> &out, std::string &why) {
  if (count < 0 || (count > 0 && !tensors)) {
    why = std::string("invalid ") + what + " array";
    return false;
  }
  for (int32_t i = 0; i < count; ++i) {
    const MoeTensorC &t = tensors[i];
    if (t.dtype < 0 || t.dtype >= kNumDTypes || t.rank < 0 ||
        (t.rank > 0 && !t.shape)) {
      why = std::string(what) + " #" + std::to_string(i) +
            ": invalid dtype code " + std::to_string(t.dtype) + " or rank " +
            std::to_string(t.rank);
      return false;
    }
    out.emplace_back(static_cast<DType>(t.dtype),
                     llvm::ArrayRef<int64_t>(t.shape, t.rank), t.data);
  }
  return true;
}
} // namespace

extern "C" void *moeExecCompile(const char *mlir, int64_t len,
                                int32_t optLevel, char *err, int64_t errCap) {
  if (!mlir || len < 0) {
    writeError(err, errCap, "moeExecCompile: no MLIR text");
    return nullptr;
  }
  CompileOptions options;
  options.optLevel = optLevel < 0 ? 0 : (optLevel > 3 ? 3 : optLevel);
  auto module = Executor::compile(llvm::StringRef(mlir, len), options);
  if (!module) {
    writeError(err, errCap, llvm::toString(module.takeError()));
    return nullptr;
  }
  return module->release();
}

extern "C" int32_t moeExecCall(void *module, const char *fn,
                               const MoeTensorC *inputs, int32_t numInputs,
                               MoeTensorC *outputs, int32_t numOutputs,
                               char *err, int64_t errCap) {
  if (!module || !fn) {
    writeError(err, errCap, "moeExecCall: no module or function name");
    return 1;
  }
  llvm::SmallVector<HostTensor, 8> in, out;
  std::string why;
  if (!toHostTensors(inputs, numInputs, "input", in, why) ||
      !toHostTensors(outputs, numOutputs, "output", out, why)) {
    writeError(err, errCap, std::string("@") + fn + ": " + why);
    return 1;
  }
  if (llvm::Error e =
          static_cast<CompiledModule *>(module)->call(fn, in, out)) {
    writeError(err, errCap, llvm::toString(std::move(e)));
    return 1;
  }
  return 0;
}

extern "C" void moeExecDestroy(void *module) {
  delete static_cast<CompiledModule *>(module);
}
