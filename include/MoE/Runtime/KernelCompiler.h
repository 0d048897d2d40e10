/*===- KernelCompiler.h - In-process kernel compiler -------------*- C -*-===*\
|*                                                                            *|
|* Part of the MoE-MLIR project.                                              *|
|*                                                                            *|
|* What the torch ops' kernel cache (python/moe_mlir/runtime/cache.py) uses  *|
|* to build a kernel without starting a process: MLIR text through a moe     *|
|* pass pipeline, LLVM IR, the LLVM optimizer and code generator for the     *|
|* host, and lld's ELF linker, into a shared object (kept in the disk cache  *|
|* and loaded with dlopen, as any other). A CUDA kernel is a host shared     *|
|* object like any other: its GPU code is embedded (gpu.binary) and loaded   *|
|* by its constructor.                                                       *|
|*                                                                            *|
|* A C ABI (ctypes); errors are messages in `err` (NUL-terminated, at most   *|
|* `errCap` bytes), never exceptions or aborts; a crash of a compiler pass   *|
|* is an error of the call. Calls are serialized inside.                     *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_KERNELCOMPILER_H
#define MOE_RUNTIME_KERNELCOMPILER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Compiles `len` bytes of MLIR text with the passes `pipeline` on the
/// module (the textual syntax inside moe-opt's --pass-pipeline=
/// 'builtin.module(...)', e.g.
/// "canonicalize,moe-lower-to-llvm{target-cpu=native}"), which must end in
/// the LLVM dialect, generates code for the host CPU `targetCpu` ("native"
/// or an LLVM CPU name such as "x86-64-v3") at the LLVM optimization level
/// `optLevel` (0-3), and links the object with the `numLinkArgs` arguments
/// `linkArgs` of ld.lld (libraries, archives, run paths) into the shared
/// object `sharedObjectPath`. `seconds`, unless NULL, receives the time of
/// each stage: parse and pipeline, translation to LLVM IR, the LLVM
/// optimizer, code generation, the link. Returns 0, or 1 with the
/// diagnostics in `err`.
int32_t moeCompileKernel(const char *mlir, int64_t len, const char *pipeline,
                         const char *targetCpu, int32_t optLevel,
                         const char *const *linkArgs, int32_t numLinkArgs,
                         const char *sharedObjectPath, double *seconds,
                         char *err, int64_t errCap);

/// The kernel module of a torch op's kernel key (`len` bytes; MoE/IR/KernelKey.h:
/// `func.func @kernel(inputs...) -> (results...)` around the op the key names,
/// built with its ODS builder, result types inferred, verified) as MLIR text:
/// its length in `*outLen`, the text (NUL-terminated) in `out` when it fits in
/// `outCap` bytes (else call again with a larger buffer). Returns 0, or 1 with
/// the diagnostics (the op's verifier's among them) in `err`.
int32_t moeKernelModule(const char *key, int64_t len, char *out,
                        int64_t outCap, int64_t *outLen, char *err,
                        int64_t errCap);

/// The same op for a caller that prints it itself (the FX importer), as lines:
/// its name and number of regions; its operands as indices into the key's
/// inputs; its attributes, properties included, as one dictionary (the
/// generic form's); then each result type.
int32_t moeKernelKeyOp(const char *key, int64_t len, char *out,
                       int64_t outCap, int64_t *outLen, char *err,
                       int64_t errCap);

/// The ops of the kernel-key table (KernelKeys.td), space-separated, as
/// moeKernelModule returns its text. Returns 0.
int32_t moeKernelKeyOps(char *out, int64_t outCap, int64_t *outLen);

#ifdef __cplusplus
}
#endif

#endif /* MOE_RUNTIME_KERNELCOMPILER_H */
