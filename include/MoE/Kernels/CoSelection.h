//===- CoSelection.h - Co-selection counts and update, once -----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// moe.adjacency_update's maths: a slot of idx counts when its expert id is in
// [0, E) (idInRange of SegmentedStats.h) and it is the token's first slot
// holding that expert; C[j, m] counts the tokens that chose both j and m; the
// next matrix is
//
//   a_next = beta · a + (1 - beta) · N(C),  N(C) = C / Σ_line C (0 for an
//   all-zero line) with norm = row or col, C itself with norm = none.
//
// The GPU kernels (a thread per token with i32 atomics, a block per line)
// compute a_next with coSelectionNext. The CPU kernel counts C itself
// (per-worker counts, a mask histogram or mask rows) and finishes with the
// portable lowering's tensor tail (linalg_lowering::finishAdjacencyUpdate,
// MoE/Conversion/MoEToLinalg), not with this function: the two a_next
// formulas are still written twice.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_COSELECTION_H
#define MOE_KERNELS_COSELECTION_H

#include "MoE/Kernels/Builder.h"

namespace mlir::moe::kernels {

/// One entry of a_next from the entry `a` (f32), its count `count` (f32) and,
/// for norm = row/col, its line's total `total` (f32; null for norm = none).
Value coSelectionNext(KernelBuilder &kb, Value a, Value count, Value total,
                      float beta);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_COSELECTION_H
