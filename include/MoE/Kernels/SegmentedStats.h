//===- SegmentedStats.h - Per-cluster statistics, once ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// moe.mad_dispersion's maths, shared by its CPU kernel (column blocks of
// vector lanes, scatter per token) and its GPU kernels (a thread per column,
// chunk partials): a token joins the cluster assign[t] when that id is in
// [0, E) (an id outside adds nothing and is reported by the caller); the
// cluster's mean is Σ x / count (0 for an empty cluster, as the authors'
// index_reduce leaves it); its dispersion sums |x - mean| (mad) or
// (x - mean)² (variance); the weight is 1 / (mean dispersion + eps).
// Every function takes scalars or vectors (lane-wise); counts are i32.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_SEGMENTEDSTATS_H
#define MOE_KERNELS_SEGMENTEDSTATS_H

#include "MoE/Kernels/Builder.h"

namespace mlir::moe::kernels {

/// True when the integer id `v` lies in [0, bound); `bound` has v's type.
Value idInRange(KernelBuilder &kb, Value v, Value bound);

/// sum / count, 0 when count (an i32 scalar) is 0; `sum` is f32 or a vector
/// of it.
Value segmentMean(KernelBuilder &kb, Value sum, Value count);

/// The dispersion term of x around its cluster's mean: (x - mean)² when
/// `variance`, else |x - mean|.
Value dispersionTerm(KernelBuilder &kb, Value x, Value mean, bool variance);

/// The weight of a mean dispersion s: 1 / (s + eps).
Value dispersionWeight(KernelBuilder &kb, Value s, float eps);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_SEGMENTEDSTATS_H
