//===- Limits.h - Compile-time checks of CUDA launch limits -----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// A kernel that needs more shared memory, threads or blocks than the device
// gives fails at launch (cuLaunchKernel: "invalid argument", "too many
// resources requested") or, with static shared memory, in ptxas. Issue #15
// wants such sizes rejected at compile time with the limit named, so
// convert-moe-to-gpu checks the kernels and launches each op produced.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_LIMITS_H
#define MOE_LIB_CONVERSION_MOETOGPU_LIMITS_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringSet.h"

#include <cstdint>
#include <string>

namespace mlir::moe::gpu_lowering {

/// Limits of every CUDA device since sm_30 (CUDA C Programming Guide, table
/// "Technical Specifications per Compute Capability").
constexpr int64_t kMaxThreadsPerBlock = 1024;
constexpr int64_t kMaxBlockDim[3] = {1024, 1024, 64};
constexpr int64_t kMaxGridDim[3] = {2147483647, 65535, 65535};
/// Static shared memory (`__shared__`, what workgroup attributions become) is
/// capped at 48 KiB per block on every device; only dynamic shared memory can
/// go beyond, after an opt-in (up to 227 KiB on sm_90).
constexpr int64_t kMaxStaticSharedMemory = 48 * 1024;

/// Checks the kernels one moe op lowers to. Construct it before the lowering
/// (it records the kernels that exist), call verify() after a successful one:
/// every new kernel's shared memory (workgroup attributions plus constant
/// dynamic shared memory) must fit `sharedMemoryBytes` and the static cap,
/// or, with dynamic shared memory, the larger `dynamicSharedMemoryBytes` (the
/// chip's opt-in maximum, which the runtime asks for at the launch),
/// and every launch of it with static sizes must fit the block and grid
/// limits. Errors are reported at the op's location, as errors of the op (it
/// is gone by then).
class KernelLimitCheck {
public:
  KernelLimitCheck(ModuleOp module, Operation *op, int64_t sharedMemoryBytes,
                   int64_t dynamicSharedMemoryBytes = 0);
  LogicalResult verify();

private:
  ModuleOp module;
  std::string opName;
  Location loc;
  int64_t sharedMemoryBytes, dynamicSharedMemoryBytes;
  llvm::StringSet<> kernelsBefore;
};

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_LIMITS_H
