//===- ErrorReporting.h - Run-time errors of compiled moe code --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Lowered code never aborts the host and never writes out of bounds: when a
// run-time value breaks a rule the verifier could not check (an `assign` or
// `idx` value outside [0, E), a chosen head outside [0, H)), the kernel skips
// that element and calls
// moeReportIndexError. The execution API reads the error back after the call
// and turns it into an error for its caller; under mlir-runner the message is
// printed to stderr.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_ERRORREPORTING_H
#define MOE_RUNTIME_ERRORREPORTING_H

#include <cstdint>

#include "MoE/Kernels/IndexErrors.h"

extern "C" {

/// Records that element `position` of the index operand of `op` holds `value`,
/// outside [0, bound). Keeps the first error of the thread until it is taken.
void moeReportIndexError(int32_t op, int64_t position, int64_t value,
                         int64_t bound);

/// Copies the first error recorded on this thread since the last call into
/// `message` (NUL-terminated, at most `capacity` bytes), clears it, and returns
/// 1; returns 0 when there is none.
int32_t moeTakeError(char *message, int64_t capacity);

/// When set (the default under mlir-runner), errors are also printed to stderr.
void moeSetErrorEcho(int32_t enabled);
}

#endif // MOE_RUNTIME_ERRORREPORTING_H
