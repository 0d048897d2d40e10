/*===- ExecutorC.h - C interface of the execution API ------------*- C -*-===*\
|*                                                                            *|
|* Part of the MoE-MLIR project.                                              *|
|*                                                                            *|
|* A C ABI over include/MoE/Runtime/Executor.h for callers that cannot use   *|
|* C++ (the Python package loads it with ctypes). Errors are returned as     *|
|* messages, never as exceptions or aborts.                                   *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_EXECUTORC_H
#define MOE_RUNTIME_EXECUTORC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// A host tensor: `dtype` is the index of mlir::moe::DType (f32, f16, bf16,
/// f64, i1, i8, i32, i64), `shape` holds `rank` sizes, `data` is dense
/// row-major storage owned by the caller.
typedef struct {
  int32_t dtype;
  int32_t rank;
  const int64_t *shape;
  void *data;
} MoeTensorC;

/// Compiles `len` bytes of MLIR text; returns NULL and writes the reason into
/// `err` (NUL-terminated, at most `errCap` bytes) on failure.
void *moeExecCompile(const char *mlir, int64_t len, int32_t optLevel,
                     char *err, int64_t errCap);

/// Calls `fn` with `inputs`; results are written into the caller-allocated
/// `outputs` (exact result shapes). Returns 0, or 1 with the reason in `err`.
int32_t moeExecCall(void *module, const char *fn, const MoeTensorC *inputs,
                    int32_t numInputs, MoeTensorC *outputs, int32_t numOutputs,
                    char *err, int64_t errCap);

/// Releases a module returned by moeExecCompile (NULL is ignored).
void moeExecDestroy(void *module);

#ifdef __cplusplus
}
#endif

#endif /* MOE_RUNTIME_EXECUTORC_H */
