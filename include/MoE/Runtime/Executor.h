//===- Executor.h - Compile and run moe functions on the CPU ----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// A small, typed execution API over mlir::ExecutionEngine:
//
//   auto module = Executor::compile(mlirText);          // parse + lower + JIT
//   if (!module) ... llvm::toString(module.takeError()) ...
//   HostTensor x(DType::F32, {4, 16}, xData);
//   HostTensor w(DType::F32, {4, 2}, wData);
//   HostTensor idx(DType::I32, {4, 2}, idxData);
//   if (llvm::Error err = (*module)->call("gate", {x}, {w, idx})) ...
//
// `mlirText` holds tensor-level `func.func`s (moe ops and any upstream
// dialect). Every public function with a body can be called. Its signature is
// read from the IR before lowering, and every call is checked against it:
// number of inputs and outputs, element type, rank and static sizes, with an
// error that names the function and the argument. The compiled code's run-time
// errors (an index operand out of range, see ErrorReporting.h) come back as an
// llvm::Error of the call.
//
// Layout: HostTensor is a view of a dense row-major buffer owned by the
// caller. `i1` elements are bytes holding 0 or 1. Inputs are never written:
// their arguments are marked `bufferization.writable = false` before lowering.
// When every result of the module's functions has a static shape, they are
// lowered with results-to-out-params and compute straight into the caller's
// outputs (no copy). Otherwise results are allocated by the compiled code
// (malloc), copied into the caller's outputs and freed.
//
// Limitations: function arguments and results must be ranked tensors (rank 0
// included); dynamic sizes that the IR ties across arguments (e.g. the batch
// of two operands) are not checked against each other.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_EXECUTOR_H
#define MOE_RUNTIME_EXECUTOR_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlir {
class ExecutionEngine;

namespace moe {

/// Element types a HostTensor can hold. `I1` is one byte per element.
enum class DType : uint8_t { F32, F16, BF16, F64, I1, I8, I32, I64 };

/// Bytes per element.
size_t dtypeSize(DType dtype);
/// The MLIR spelling: "f32", "bf16", "i1", ...
llvm::StringRef dtypeName(DType dtype);

/// Marks a dynamic size in a TensorSignature (equal to ShapedType::kDynamic).
constexpr int64_t kDynamicSize = INT64_MIN;

/// A non-owning view of a dense, row-major buffer.
struct HostTensor {
  DType dtype = DType::F32;
  llvm::SmallVector<int64_t, 4> shape;
  void *data = nullptr;

  HostTensor() = default;
  HostTensor(DType dtype, llvm::ArrayRef<int64_t> shape, void *data)
      : dtype(dtype), shape(shape.begin(), shape.end()), data(data) {}
  HostTensor(DType dtype, std::initializer_list<int64_t> shape, void *data)
      : dtype(dtype), shape(shape.begin(), shape.end()), data(data) {}

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numElements() const;
  size_t sizeInBytes() const { return numElements() * dtypeSize(dtype); }
  /// "f32[4, 16]".
  std::string str() const;
};

/// A tensor that owns its buffer (8-byte aligned, zero-initialized).
class Tensor {
public:
  Tensor() = default;
  Tensor(DType dtype, llvm::ArrayRef<int64_t> shape);

  DType dtype() const { return dtype_; }
  llvm::ArrayRef<int64_t> shape() const { return shape_; }
  int64_t numElements() const;
  size_t sizeInBytes() const { return numElements() * dtypeSize(dtype_); }
  void *data() { return storage_.data(); }
  const void *data() const { return storage_.data(); }
  template <typename T> T *data() { return reinterpret_cast<T *>(data()); }
  template <typename T> const T *data() const {
    return reinterpret_cast<const T *>(data());
  }
  /// A view of this tensor (valid while it lives).
  HostTensor view() { return HostTensor(dtype_, shape_, data()); }

private:
  DType dtype_ = DType::F32;
  llvm::SmallVector<int64_t, 4> shape_;
  std::vector<uint64_t> storage_;
};

/// The type of one argument or result of a function as written in the IR.
struct TensorSignature {
  /// std::nullopt when the element type is not one of DType.
  std::optional<DType> dtype;
  /// kDynamicSize for `?`.
  llvm::SmallVector<int64_t, 4> shape;
  /// The IR type, e.g. "tensor<4x?xf32>".
  std::string typeStr;
  /// Empty when the type can be passed; otherwise why not.
  std::string unsupported;
};

struct FunctionSignature {
  std::string name;
  llvm::SmallVector<TensorSignature, 4> inputs;
  llvm::SmallVector<TensorSignature, 2> results;
};

struct CompileOptions {
  /// LLVM optimization level of the JIT (0-3).
  unsigned optLevel = 3;
  /// Print the module after lowering to llvm::errs() (debugging).
  bool dumpLoweredIR = false;
  /// The CPU to compile for (moe-lower-to-llvm target-cpu): "native", an
  /// x86-64 CPU name of LLVM (x86-64-v3 = AVX2, x86-64-v4 = AVX-512, ...);
  /// empty: $MOE_TARGET_CPU, else native. A target with a feature the host
  /// lacks is an error (its code would stop on an illegal instruction).
  std::string targetCpu;
};

/// A lowered, JIT-compiled module. Calls are thread-safe: run-time errors are
/// recorded per thread.
class CompiledModule {
public:
  ~CompiledModule();
  CompiledModule(const CompiledModule &) = delete;
  CompiledModule &operator=(const CompiledModule &) = delete;

  /// The callable functions (public, with a body), in IR order.
  llvm::ArrayRef<FunctionSignature> functions() const { return functions_; }
  /// nullptr when `fn` is not a callable function of the module.
  const FunctionSignature *signature(llvm::StringRef fn) const;

  /// Calls `fn` on `inputs`; its results are written into `outputs`, whose
  /// dtypes and shapes must match the results exactly (a dynamic result size
  /// is checked after the call).
  llvm::Error call(llvm::StringRef fn, llvm::ArrayRef<HostTensor> inputs,
                   llvm::ArrayRef<HostTensor> outputs) const;

  /// Calls `fn` on `inputs` and returns its results in fresh tensors of the
  /// shapes the compiled code returned.
  llvm::Expected<std::vector<Tensor>>
  call(llvm::StringRef fn, llvm::ArrayRef<HostTensor> inputs) const;

private:
  friend class Executor;
  CompiledModule();

  llvm::Error invoke(const FunctionSignature &sig,
                     llvm::ArrayRef<HostTensor> inputs,
                     llvm::ArrayRef<HostTensor> *outputs,
                     std::vector<Tensor> *owned) const;

  std::unique_ptr<ExecutionEngine> engine_;
  std::vector<FunctionSignature> functions_;
  /// Whether the functions take their results as out-params (every result
  /// has a static shape): the compiled code writes into the caller's
  /// buffers, no copy.
  bool outParams_ = false;
  /// Packed `_mlir__mlir_ciface_<fn>` entry points, parallel to functions_.
  std::vector<void (*)(void **)> entries_;
};

class Executor {
public:
  /// Parses `mlirText` (moe + upstream dialects), lowers it with
  /// buildLowerToLLVMPipeline and JIT-compiles it. Parse, verifier and
  /// lowering diagnostics come back in the error.
  static llvm::Expected<std::unique_ptr<CompiledModule>>
  compile(llvm::StringRef mlirText, const CompileOptions &options = {});
};

} // namespace moe
} // namespace mlir

#endif // MOE_RUNTIME_EXECUTOR_H
