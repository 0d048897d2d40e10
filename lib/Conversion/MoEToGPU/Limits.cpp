//===- Limits.cpp - Compile-time checks of CUDA launch limits -------------===//
//
// Part of the MoE-MLIR project.
//
// See Limits.h. The check runs on what the lowering produced rather than on a
// per-op formula, so it stays right when a kernel's tiles change: shared
// memory is the sum of the kernel's workgroup buffers, launch sizes are the
// launch operands folded down to constants where the op's shapes are static
// (dynamic sizes are left to the launch, whose error the runtime reports).
//
//===----------------------------------------------------------------------===//

#include "Limits.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/Support/MathExtras.h"

#include <optional>

using namespace mlir;
using namespace mlir::moe::gpu_lowering;

/// The value of an index computed from constants and static dims (memref.dim
/// of a static size, arith on those), by folding; nullopt when it depends on
/// a dynamic size.
static std::optional<int64_t> staticValue(Value v, unsigned depth = 0) {
  APInt constant;
  if (matchPattern(v, m_ConstantInt(&constant)))
    return constant.getSExtValue();
  Operation *def = v.getDefiningOp();
  if (!def || depth > 32)
    return std::nullopt;
  if (auto dim = dyn_cast<memref::DimOp>(def)) {
    std::optional<int64_t> index = dim.getConstantIndex();
    auto type = dyn_cast<MemRefType>(dim.getSource().getType());
    if (!index || !type || *index < 0 || *index >= type.getRank() ||
        type.isDynamicDim(*index))
      return std::nullopt;
    return type.getDimSize(*index);
  }
  if (def->getNumResults() != 1 || !isPure(def))
    return std::nullopt;
  SmallVector<Attribute> operands;
  for (Value operand : def->getOperands()) {
    std::optional<int64_t> value = staticValue(operand, depth + 1);
    if (!value || !operand.getType().isIntOrIndex())
      return std::nullopt;
    operands.push_back(IntegerAttr::get(operand.getType(), *value));
  }
  SmallVector<OpFoldResult> folded;
  if (failed(def->fold(operands, folded)) || folded.size() != 1)
    return std::nullopt;
  if (auto value = dyn_cast<Value>(folded[0]))
    return value == v ? std::nullopt : staticValue(value, depth + 1);
  if (auto attr = dyn_cast<IntegerAttr>(cast<Attribute>(folded[0])))
    return attr.getValue().getSExtValue();
  return std::nullopt;
}

/// Bytes of a kernel's workgroup buffers (static shared memory).
static int64_t staticSharedMemory(gpu::GPUFuncOp kernel) {
  int64_t bytes = 0;
  for (BlockArgument buffer : kernel.getWorkgroupAttributions()) {
    auto type = cast<MemRefType>(buffer.getType());
    // Index elements have no bit width here; 8 bytes on every CUDA target.
    int64_t elementBytes =
        type.getElementType().isIntOrFloat()
            ? llvm::divideCeil(type.getElementTypeBitWidth(), 8)
            : 8;
    if (type.hasStaticShape())
      bytes += type.getNumElements() * elementBytes;
  }
  return bytes;
}

/// The kernels of the module's gpu.modules.
static SmallVector<gpu::GPUFuncOp> kernelsOf(ModuleOp module) {
  SmallVector<gpu::GPUFuncOp> kernels;
  for (auto kernelModule : module.getOps<gpu::GPUModuleOp>())
    llvm::append_range(kernels, kernelModule.getOps<gpu::GPUFuncOp>());
  return kernels;
}

/// "@module::@kernel", the key of a kernel and of its launches.
static std::string kernelKey(gpu::GPUFuncOp kernel) {
  auto parent = kernel->getParentOfType<gpu::GPUModuleOp>();
  return (parent.getName() + "::" + kernel.getName()).str();
}

KernelLimitCheck::KernelLimitCheck(ModuleOp module, Operation *op,
                                   int64_t sharedMemoryBytes,
                                   int64_t dynamicSharedMemoryBytes)
    : module(module), opName(op->getName().getStringRef().str()),
      loc(op->getLoc()), sharedMemoryBytes(sharedMemoryBytes),
      dynamicSharedMemoryBytes(dynamicSharedMemoryBytes) {
  for (gpu::GPUFuncOp kernel : kernelsOf(module))
    kernelsBefore.insert(kernelKey(kernel));
}

LogicalResult KernelLimitCheck::verify() {
  bool ok = true;
  auto error = [&]() {
    ok = false;
    InFlightDiagnostic diag = emitError(loc);
    diag << "'" << opName << "' op ";
    return diag;
  };
  // Static shared memory, once per new kernel.
  llvm::StringMap<int64_t> newKernels;
  for (gpu::GPUFuncOp kernel : kernelsOf(module)) {
    std::string key = kernelKey(kernel);
    if (kernelsBefore.contains(key))
      continue;
    int64_t shared = staticSharedMemory(kernel);
    newKernels[key] = shared;
    if (shared > kMaxStaticSharedMemory)
      error() << "needs " << shared << " bytes of static shared memory in "
              << "kernel @" << kernel.getName() << ", more than the "
              << kMaxStaticSharedMemory << " bytes a CUDA block can have";
    else if (shared > sharedMemoryBytes)
      error() << "needs " << shared << " bytes of shared memory per block in "
              << "kernel @" << kernel.getName() << ", more than the limit of "
              << sharedMemoryBytes << " bytes (option shared-memory-bytes)";
  }
  if (newKernels.empty())
    return success(ok);

  // Launch sizes where the shapes are static.
  static const char dimName[3] = {'x', 'y', 'z'};
  module.walk([&](gpu::LaunchFuncOp launch) {
    StringRef name = launch.getKernelName().getValue();
    auto it = newKernels.find(
        (launch.getKernelModuleName().getValue() + "::" + name).str());
    if (it == newKernels.end())
      return;
    if (Value dynamicBytes = launch.getDynamicSharedMemorySize()) {
      std::optional<int64_t> dynamicShared = staticValue(dynamicBytes);
      const bool optIn = dynamicSharedMemoryBytes > sharedMemoryBytes;
      const int64_t limit =
          optIn ? dynamicSharedMemoryBytes : sharedMemoryBytes;
      if (dynamicShared && it->second + *dynamicShared > limit)
        error() << "needs " << it->second + *dynamicShared
                << " bytes of shared memory per block in kernel @" << name
                << ", more than the limit of " << limit << " bytes (option "
                << (optIn ? "dynamic-shared-memory-bytes"
                          : "shared-memory-bytes")
                << ")";
    }
    gpu::KernelDim3 block = launch.getBlockSizeOperandValues();
    gpu::KernelDim3 grid = launch.getGridSizeOperandValues();
    Value blockDims[3] = {block.x, block.y, block.z};
    Value gridDims[3] = {grid.x, grid.y, grid.z};
    int64_t threads = 1;
    for (int d = 0; d < 3; ++d) {
      std::optional<int64_t> size = staticValue(blockDims[d]);
      if (!size)
        continue;
      threads *= *size;
      if (*size > kMaxBlockDim[d])
        error() << "launches kernel @" << name << " with " << *size
                << " threads in dimension " << dimName[d]
                << " of a block, more than the CUDA limit of "
                << kMaxBlockDim[d];
    }
    if (threads > kMaxThreadsPerBlock)
      error() << "launches kernel @" << name << " with " << threads
              << " threads per block, more than the CUDA limit of "
              << kMaxThreadsPerBlock;
    for (int d = 0; d < 3; ++d) {
      std::optional<int64_t> size = staticValue(gridDims[d]);
      if (size && *size > kMaxGridDim[d])
        error() << "launches kernel @" << name << " with a grid of " << *size
                << " blocks in dimension " << dimName[d]
                << ", more than the CUDA limit of " << kMaxGridDim[d];
    }
  });
  return success(ok);
}
