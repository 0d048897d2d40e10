//===- ErrorReporting.cpp - Run-time errors of compiled moe code ----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/ErrorReporting.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace {
/// One slot per thread: kernels may run on several threads of the caller, and
/// each caller reads back the errors of its own call.
thread_local std::string firstError;
bool echoErrors = true;

const char *describe(int32_t op) {
  switch (op) {
  case kMoEErrorMadDispersionAssign:
    return "moe.mad_dispersion: 'assign'";
  case kMoEErrorAdjacencyUpdateIdx:
    return "moe.adjacency_update: 'idx'";
  case kMoEErrorDispatchPlanIndices:
    return "moe.dispatch_plan: 'indices'";
  default:
    return "moe: index operand";
  }
}
} // namespace

extern "C" void moeReportIndexError(int32_t op, int64_t position,
                                    int64_t value, int64_t bound) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer),
                "%s element %lld is %lld, outside [0, %lld); the element was "
                "skipped",
                describe(op), static_cast<long long>(position),
                static_cast<long long>(value), static_cast<long long>(bound));
  if (echoErrors)
    std::fprintf(stderr, "error: %s\n", buffer);
  if (firstError.empty())
    firstError = buffer;
}

extern "C" int32_t moeTakeError(char *message, int64_t capacity) {
  if (firstError.empty())
    return 0;
  if (message && capacity > 0) {
    std::strncpy(message, firstError.c_str(), capacity - 1);
    message[capacity - 1] = '\0';
  }
  firstError.clear();
  return 1;
}

extern "C" void moeSetErrorEcho(int32_t enabled) { echoErrors = enabled != 0; }
