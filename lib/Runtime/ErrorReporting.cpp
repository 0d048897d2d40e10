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

/// The op and operand of an error, and what the kernel did instead.
struct Description {
  const char *operand;
  const char *consequence;
};

Description describe(int32_t op) {
  switch (op) {
  case kMoEErrorMadDispersionAssign:
    return {"moe.mad_dispersion: 'assign'", "the element was skipped"};
  case kMoEErrorAdjacencyUpdateIdx:
    return {"moe.adjacency_update: 'idx'", "the element was skipped"};
  case kMoEErrorDispatchPlanIndices:
    return {"moe.dispatch_plan: 'indices'", "the element was skipped"};
  case kMoEErrorAttentionHead:
    // h* selects the head of a whole batch element: that element is what
    // the kernels skip.
    return {"moe.attention_posterior_grad: 'head'",
            "the batch element was skipped (its gradients are 0)"};
  case kMoEErrorRouteReplay:
    return {"moe.route: 'replay'", "the pick was read as expert 0"};
  default:
    return {"moe: index operand", "the element was skipped"};
  }
}
} // namespace

extern "C" void moeReportIndexError(int32_t op, int64_t position,
                                    int64_t value, int64_t bound) {
  char buffer[256];
  Description d = describe(op);
  std::snprintf(buffer, sizeof(buffer),
                "%s element %lld is %lld, outside [0, %lld); %s", d.operand,
                static_cast<long long>(position), static_cast<long long>(value),
                static_cast<long long>(bound), d.consequence);
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
