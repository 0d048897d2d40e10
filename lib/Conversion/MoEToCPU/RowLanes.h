//===- RowLanes.h - One row per lane: the few-expert top-k layout -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// With few experts (E a power of two <= 16) a row is shorter than a register,
// and a per-row top-k spends its time on horizontal reductions and scalar
// stores. The row-per-lane layout puts one row in each lane instead: a block
// of `lanes` rows (E·lanes contiguous values) is loaded as E vectors and
// transposed in registers by log2(E) unzip rounds of two-input shuffles, so
// that vector j holds expert j of every row of the block; a k-deep insertion
// network keeps the k best per lane, and the results are zipped back to
// row-major [rows, k] and stored whole. No gathers or scatters: shuffles are
// what AVX2 and AVX-512 both do in a cycle or two. moe.topk_renorm and
// moe.route share it (TopkRenorm.cpp, Route.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_ROWLANES_H
#define MOE_LIB_CONVERSION_MOETOCPU_ROWLANES_H

#include "KernelBuilder.h"

namespace mlir::moe::cpu_lowering {

/// The row-per-lane layout's bounds: E (a power of two) up to this many
/// experts and k up to kMaxLaneK selections.
constexpr int64_t kMaxLaneExperts = 16;
constexpr int64_t kMaxLaneK = 8;

/// Whether `numExperts` (static, or ShapedType::kDynamic) and `k` fit the
/// row-per-lane layout.
bool fitsRowLanes(int64_t numExperts, int64_t k);

/// One unzip round over vectors holding a row-major sequence: vector q <
/// n/2 takes the even elements of vectors 2q, 2q+1, vector q + n/2 the odd
/// ones. log2(n) rounds turn n vectors of a [lanes, n] row-major block into
/// its n columns.
SmallVector<Value> unzipRound(CpuKernelBuilder &kb, ArrayRef<Value> v);
/// The inverse of unzipRound: vectors 2q, 2q+1 interleave vectors q and
/// q + n/2.
SmallVector<Value> zipRound(CpuKernelBuilder &kb, ArrayRef<Value> v);

/// memref [rows, X] -> [rows * X] (identity layout).
Value flatten(CpuKernelBuilder &kb, Value buffer);

/// The `numExperts` columns of rows [r0, r0 + lanes) of the flat row-major
/// [rows * numExperts] buffer `flat`: vector j holds element j of each row.
SmallVector<Value> loadColumns(CpuKernelBuilder &kb, Value flat, Value r0,
                               int64_t numExperts);

/// Stores `cols[s]` (lane l = row r0 + l, column s) into the flat row-major
/// [rows * n] buffer `flat`.
void storeColumns(CpuKernelBuilder &kb, ArrayRef<Value> cols, Value flat,
                  Value r0);

/// The k best of each lane over the columns, best first.
struct LaneTopk {
  /// i32 ordered keys, the values they were taken with, the i32 columns.
  SmallVector<Value> keys, vals, idxs;
};
/// The k best per lane of `numExperts` columns, column j ranked by the i32
/// ordered key (MoE/Kernels/TopK.h) `keyOf(j)` and carrying `valueOf(j)`:
/// columns in ascending order, each inserted only above a strictly smaller
/// key, so equal keys keep the lower column first (the dialect's ties) and
/// NaN (the largest key) comes first.
LaneTopk laneTopk(CpuKernelBuilder &kb, int64_t k, int64_t numExperts,
                  function_ref<Value(int64_t j)> keyOf,
                  function_ref<Value(int64_t j)> valueOf);

} // namespace mlir::moe::cpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOCPU_ROWLANES_H
