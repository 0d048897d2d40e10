/*===- KernelJIT.h - In-process kernel compiler and loader -------*- C -*-===*\
|*                                                                            *|
|* Part of the MoE-MLIR project.                                              *|
|*                                                                            *|
|* What the torch ops' kernel cache (python/moe_mlir/runtime/cache.py) uses  *|
|* to build a kernel without starting a process: MLIR text through a moe     *|
|* pass pipeline, LLVM IR, the LLVM optimizer and code generator for the     *|
|* host into a relocatable object (kept in the disk cache), and an ORC JIT   *|
|* that links such an object into the process and returns a symbol's        *|
|* address. A CUDA kernel is a host object like any other: its GPU code is   *|
|* embedded (gpu.binary) and loaded by its initializer.                      *|
|*                                                                            *|
|* A C ABI (ctypes); errors are messages in `err` (NUL-terminated, at most   *|
|* `errCap` bytes), never exceptions or aborts; a crash of a compiler pass   *|
|* is an error of the call. Calls are serialized inside.                     *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_KERNELJIT_H
#define MOE_RUNTIME_KERNELJIT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Compiles `len` bytes of MLIR text with the passes `pipeline` on the
/// module (the textual syntax inside moe-opt's --pass-pipeline=
/// 'builtin.module(...)', e.g.
/// "canonicalize,moe-lower-to-llvm{target-cpu=native}"), which must end in
/// the LLVM dialect, and writes the host object to
/// `objectPath`. `targetCpu` is the host CPU the code is generated for
/// ("native" or an LLVM CPU name such as "x86-64-v3"); `optLevel` is the LLVM
/// optimization level (0-3). The module's static constructors (the CUDA
/// binary's load) are gathered into one function, `__moe_init`, which
/// moeJitLoad runs. `seconds`, unless NULL, receives the time of each stage:
/// parse and pipeline, translation to LLVM IR, the LLVM optimizer, code
/// generation and the write. Returns 0, or 1 with the diagnostics in `err`.
int32_t moeJitCompile(const char *mlir, int64_t len, const char *pipeline,
                      const char *targetCpu, int32_t optLevel,
                      const char *objectPath, double *seconds, char *err,
                      int64_t errCap);

/// Links the object at `objectPath` into the process, its undefined symbols
/// resolved in the `numLibs` shared libraries `libs` (each one's own
/// symbols and its dependencies', in that order), then in the archives
/// `archives` (e.g. compiler-rt's builtins), then in the process; runs its
/// `__moe_init` and returns the address of `symbol`. Each call links its own
/// copy (a kernel loaded again for another device gets its own module).
/// Returns NULL with the reason in `err`.
void *moeJitLoad(const char *objectPath, const char *const *libs,
                 int32_t numLibs, const char *const *archives,
                 int32_t numArchives, const char *symbol, char *err,
                 int64_t errCap);

#ifdef __cplusplus
}
#endif

#endif /* MOE_RUNTIME_KERNELJIT_H */
