//===- ErrorBuffer.h - Messages into a C caller's buffer --------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_COMPILER_ERRORBUFFER_H
#define MOE_RUNTIME_COMPILER_ERRORBUFFER_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace mlir::moe {
/// Copies `msg` into the C ABI's `err` buffer of `errCap` bytes, truncated and
/// NUL-terminated (nothing when the buffer is null or empty).
inline void writeErrorBuffer(char *err, int64_t errCap,
                             const std::string &msg) {
  if (!err || errCap <= 0)
    return;
  size_t n = std::min<size_t>(msg.size(), static_cast<size_t>(errCap - 1));
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}
} // namespace mlir::moe

#endif // MOE_RUNTIME_COMPILER_ERRORBUFFER_H
