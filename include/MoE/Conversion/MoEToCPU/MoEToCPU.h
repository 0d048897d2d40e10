//===- MoEToCPU.h - Fast CPU kernels for moe ops ----------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// convert-moe-to-cpu rewrites the moe ops it has a kernel for into tiled,
// vectorized loops on memrefs (vector dialect, one vector register of the
// target per vector: vector<16xf32> on AVX-512, vector<8xf32> on AVX2) whose independent items (tokens, query tiles, feature blocks) run
// on `num-threads` workers. Ops or forms without a kernel are left for
// convert-moe-to-linalg, the portable reference lowering, which
// moe-lower-to-llvm runs right after.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOCPU_MOETOCPU_H
#define MOE_CONVERSION_MOETOCPU_MOETOCPU_H

#include "mlir/Pass/Pass.h"

#include <cstdint>
#include <memory>

namespace mlir {
class RewritePatternSet;

namespace moe {
#define GEN_PASS_DECL_CONVERTMOETOCPU
#include "MoE/Conversion/Passes.h.inc"

/// Adds the fast-kernel patterns of convert-moe-to-cpu, one or more per moe
/// op (a kernel wins over the portable pattern of its op: benefit 2), and the
/// split of the fused routing ops; `options.numThreads` workers per parallel
/// loop (1 = sequential code that needs no runtime library); vectors as wide
/// as the target's registers (`options.vectorBits`: 512 for AVX-512, 256 for
/// AVX2). A kernel declines the forms it does not specialise with a match
/// failure and no op must lower: apply them greedily (as convert-moe-to-cpu
/// does), and lower what stays with populateMoEToLinalgPatterns.
void populateMoEToCPUPatterns(RewritePatternSet &patterns,
                              const ConvertMoEToCPUOptions &options);

/// The convert-moe-to-cpu pass (options `num-threads`, default 1, and
/// `vector-bits`, default 512).
std::unique_ptr<Pass> createConvertMoEToCPUPass(int64_t numThreads = 1,
                                                int64_t vectorBits = 512);
} // namespace moe
} // namespace mlir

#endif // MOE_CONVERSION_MOETOCPU_MOETOCPU_H
