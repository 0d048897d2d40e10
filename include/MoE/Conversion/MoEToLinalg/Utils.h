//===- Utils.h - Builders shared by the moe -> linalg patterns --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Small builders the per-op lowerings share: f32 promotion, filled init
// tensors, linalg.generic with a lambda body (or one written over the
// kernels' builder, whose maths MoE/Kernels shares with the CPU and GPU
// kernels), the orderings used by every top-k/argmin, the online-softmax key
// loop, and the run-time index check that calls moeReportIndexError. Public:
// the fast CPU kernels (MoEToCPU) finish some ops with these tensor-level
// builders too.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOLINALG_UTILS_H
#define MOE_CONVERSION_MOETOLINALG_UTILS_H

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Builder.h"
#include "MoE/Kernels/IndexErrors.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Utils/StructuredOpsUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::moe::linalg_lowering {

/// Shorthands for the iterator types of the generics the lowerings build.
inline constexpr utils::IteratorType kPar = utils::IteratorType::parallel;
inline constexpr utils::IteratorType kRed = utils::IteratorType::reduction;

//===----------------------------------------------------------------------===//
// Scalars
//===----------------------------------------------------------------------===//

Value f32Const(OpBuilder &b, Location loc, double value);
Value i32Const(OpBuilder &b, Location loc, int32_t value);
Value indexConst(OpBuilder &b, Location loc, int64_t value);
Value negInf(OpBuilder &b, Location loc);

/// `x` is NaN.
Value isNaN(OpBuilder &b, Location loc, Value x);

/// Sign-extends or truncates an integer scalar of any width to index.
Value toIndex(OpBuilder &b, Location loc, Value intOrIndex);

/// `iv` (index) cast to the integer type `type`.
Value indexTo(OpBuilder &b, Location loc, Value iv, Type type);

/// The strict total order of every top-k of the dialect, on (value, index)
/// pairs: NaN first (the lower index first among NaNs), then larger values,
/// then on equal values the lower index. `descending = false` ranks smaller
/// values first (argmin), NaN still first.
Value ranksBefore(OpBuilder &b, Location loc, Value a, Value ai, Value c,
                  Value ci, bool descending = true);

//===----------------------------------------------------------------------===//
// Tensors
//===----------------------------------------------------------------------===//

/// Mixed static/dynamic sizes of a ranked tensor.
SmallVector<OpFoldResult> sizesOf(OpBuilder &b, Location loc, Value tensor);

/// The tensor type of `sizes`: static where a size is a constant.
RankedTensorType tensorTypeOf(ArrayRef<OpFoldResult> sizes, Type elementType);

/// A tensor.empty of `sizes` filled with `value`.
Value filled(OpBuilder &b, Location loc, ArrayRef<OpFoldResult> sizes,
             Value value);

/// A new tensor of `sizes` for a loop-carried scratch value (an scf.for
/// iter_arg that every iteration overwrites without reading):
/// bufferization.alloc_tensor, which CSE never merges. Two such iter_args
/// seeded by one merged tensor.empty are given one buffer by One-Shot
/// Bufferize (neither is read, so no conflict is seen), and an op writing both
/// then overwrites one result with the other.
Value loopScratch(OpBuilder &b, Location loc, ArrayRef<OpFoldResult> sizes,
                  Type elementType);

/// A loopScratch filled with `value`: the seed of an iter_arg that the loop
/// updates in place, distinct from every other seed even after CSE.
Value loopFilled(OpBuilder &b, Location loc, ArrayRef<OpFoldResult> sizes,
                 Value value);

/// `tensor` converted to f32 (arith.extf in a linalg.generic); f32 tensors are
/// returned unchanged. The result must only be read: it may be an operand.
Value promoteToF32(OpBuilder &b, Location loc, Value tensor);

/// Reads element `indices` of `tensor` as an f32 scalar (extf when needed).
Value extractF32(OpBuilder &b, Location loc, Value tensor, ValueRange indices);

/// A tensor.cast to `type` when the types differ; i32 indices for an i64
/// result are sign-extended first.
Value castTo(OpBuilder &b, Location loc, Value value, Type type);

/// Replaces `op` by `values`, each cast (castTo) to the type of its result.
void replaceWithCasts(RewriterBase &rw, Operation *op, ValueRange values);

/// Slice `[:, .., pos, .., :]` of `tensor` along `dim`, with that dimension
/// dropped (rank-reducing tensor.extract_slice).
Value sliceAlong(OpBuilder &b, Location loc, Value tensor, int64_t dim,
                 OpFoldResult pos);

/// out[b,i] = Σ_d rows[b,i,d] · key[b,d] in f32, d ascending, written into
/// `scratch` ([B, N], zeroed first): one key's logits against every query.
Value rowDotKey(OpBuilder &b, Location loc, Value rows, Value key,
                Value scratch);

/// Inserts `slice` (rank one less than `dest`) at `pos` along `dim` of `dest`.
Value insertAlong(OpBuilder &b, Location loc, Value slice, Value dest,
                  int64_t dim, OpFoldResult pos);

//===----------------------------------------------------------------------===//
// linalg.generic
//===----------------------------------------------------------------------===//

/// The map (d0, .., d{numDims-1}) -> (d{dims[0]}, d{dims[1]}, ..).
AffineMap dimsMap(MLIRContext *ctx, unsigned numDims, ArrayRef<unsigned> dims);

using GenericBody =
    function_ref<SmallVector<Value>(OpBuilder &, Location, ValueRange)>;

/// A linalg.generic over `ins`/`outs` whose body yields what `body` returns.
/// The body receives the block arguments (ins, then outs).
SmallVector<Value> generic(OpBuilder &b, Location loc, ValueRange ins,
                           ValueRange outs, ArrayRef<AffineMap> maps,
                           ArrayRef<utils::IteratorType> iterators,
                           GenericBody body);

using KernelBody =
    function_ref<SmallVector<Value>(kernels::KernelBuilder &, ValueRange)>;

/// generic() with a body written over the kernels' builder (scalar f32
/// maths of MoE/Kernels, e.g. OnlineSoftmax.h, inlined per element).
SmallVector<Value> kernelGeneric(OpBuilder &b, Location loc, ValueRange ins,
                                 ValueRange outs, ArrayRef<AffineMap> maps,
                                 ArrayRef<utils::IteratorType> iterators,
                                 KernelBody body);

/// The indexing maps and iterators of generics over a tensor whose last
/// dimension is the row: `all` the identity, `lead` the leading dimensions
/// (d0..d{n-1}) -> (d0..d{n-2}); `parallel` every dimension parallel, `reduce`
/// the last one a reduction.
struct RowMaps {
  RowMaps(MLIRContext *ctx, int64_t rank);
  /// The maps of a ranked tensor's rank.
  explicit RowMaps(Value tensor);

  AffineMap all, lead;
  SmallVector<utils::IteratorType> parallel, reduce;
};

/// The body acc + x·y of a generic whose block arguments are (x, y, acc).
SmallVector<Value> mulAddBody(OpBuilder &b, Location loc, ValueRange args);
/// The body acc + x of a generic whose block arguments are (x, acc).
SmallVector<Value> addBody(OpBuilder &b, Location loc, ValueRange args);

/// `linalg.index dim` inside a generic body.
Value loopIndex(OpBuilder &b, Location loc, int64_t dim);

//===----------------------------------------------------------------------===//
// Online softmax (flash-style), one key at a time
//===----------------------------------------------------------------------===//

/// The running state of a streaming softmax over keys for a [B, N] block of
/// query rows with values of width K: max m [B, N], sum l [B, N] and the
/// unnormalized accumulator acc [B, N, K].
struct OnlineSoftmaxState {
  Value m, l, acc;
};

/// The seed of a streaming softmax for [B, N] rows of width K: m = −inf,
/// l = 0, acc = 0, each a loopFilled (a distinct iter_arg seed).
OnlineSoftmaxState initOnlineSoftmax(OpBuilder &b, Location loc,
                                     OpFoldResult batch, OpFoldResult rows,
                                     OpFoldResult width);

/// Emits the logits [B, N] of key `j` (−inf = masked), written into `scratch`.
using KeyLogits = function_ref<Value(OpBuilder &, Location, Value j,
                                     Value scratch)>;
/// Emits the values [B, K] of key `j`.
using KeyValues = function_ref<Value(OpBuilder &, Location, Value j)>;

/// An scf.for over the keys j in [0, numKeys) that keeps the online-softmax
/// state of every query row: per key, one generic for the row statistics and
/// one for the K-wide accumulator. Nothing of size N x numKeys is created.
/// Each row's step is kernels::onlineSoftmaxKey (MoE/Kernels/OnlineSoftmax.h:
/// the CPU and GPU flash kernels' maths). Masked keys are skipped (their
/// values are never read into acc).
OnlineSoftmaxState streamKeys(OpBuilder &b, Location loc, OpFoldResult batch,
                              OpFoldResult rows, OpFoldResult width,
                              Value numKeys, KeyLogits logitsOfKey,
                              KeyValues valuesOfKey);

/// acc / l per row, and 0 for rows that saw no unmasked key (l = 0):
/// kernels::softmaxNormalize.
Value normalizeRows(OpBuilder &b, Location loc, const OnlineSoftmaxState &s);

//===----------------------------------------------------------------------===//
// Run-time index errors (see include/MoE/Runtime/ErrorReporting.h)
//===----------------------------------------------------------------------===//


/// Emits loops over every element of the integer tensor `indices` (rank 1 or
/// 2) that call `moeReportIndexError(op, position, value, bound)` for each value
/// outside [0, bound); position is the row-major element number. Declares the
/// function in the enclosing module when needed. Fails without a module.
LogicalResult emitIndexCheck(RewriterBase &rewriter, Operation *anchor,
                             Value indices, Value bound, MoEErrorOp op);

//===----------------------------------------------------------------------===//
// Lowering tails shared with MoEToCPU
//===----------------------------------------------------------------------===//

// The cheap tails of some lowerings (O(E·D) or O(E²) work on tensors), shared
// with the fast CPU kernels (CPU/), which compute the expensive statistics
// themselves and then replace `op` through these.

/// W from the cluster sizes `counts` [E] (i32) and the per-cluster sums of
/// the deviations from the cluster mean `deviation` [E, D] (f32): W = 1/(s +
/// eps) with s = deviation / count, clip, mean-1 rescale; replaces `op`.
void finishMadDispersion(PatternRewriter &rw, MadDispersionOp op, Value counts,
                         Value deviation);
/// a_next from `a` [E, E] (f32) and the co-selection counts `c` [E, E] (i32,
/// diagonal included); replaces `op`.
void finishAdjacencyUpdate(PatternRewriter &rw, AdjacencyUpdateOp op, Value a,
                           Value c, OpFoldResult e);
/// w and b from the hypernetwork output `out` [E·(D+1)] (f32); replaces `op`.
void finishHyperRouter(PatternRewriter &rw, HyperRouterOp op, Value out);

} // namespace mlir::moe::linalg_lowering

#endif // MOE_CONVERSION_MOETOLINALG_UTILS_H
