//===- IndexErrors.h - The codes of run-time index errors -------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Which op's index operand held a value outside its range: the first
// argument of moeReportIndexError (the CPU kernels and the portable lowering,
// MoE/Runtime/ErrorReporting.h) and the op field of the GPU kernels' error
// word (MoEToGPU's emitRecordIndexError, read back by the CUDA runtime). One
// enum for every lowering and runtime: the codes are their ABI. A new op
// appends a code here and its message in lib/Runtime/ErrorReporting.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_INDEXERRORS_H
#define MOE_KERNELS_INDEXERRORS_H

#include <cstdint>

extern "C" {
enum MoEErrorOp : int32_t {
  kMoEErrorMadDispersionAssign = 1,
  kMoEErrorAdjacencyUpdateIdx = 2,
  kMoEErrorDispatchPlanIndices = 3,
  /// moe.attention_posterior_grad's `head` (h* per batch element): the
  /// batch element is skipped (its gradients are 0).
  kMoEErrorAttentionHead = 4,
  /// moe.route's `replay` (the given experts): the pick is read as expert 0.
  kMoEErrorRouteReplay = 5,
};
}

#endif // MOE_KERNELS_INDEXERRORS_H
