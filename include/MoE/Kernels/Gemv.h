//===- Gemv.h - The hypernetwork's matrix-vector products, once -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// moe.hyper_router (MoEOps.td) is h = relu(w1 · emb + b1), out = w2 · h + b2
// with out [E·(D+1)] read as E rows [w_e | b_e]; moe.hyper_router_grad
// (MoEGradOps.td) runs it backwards. Both are matrix-vector products over
// rows of memory, memory-bound on w2. Their maths is written here once and
// instantiated by the CPU kernels (lib/Conversion/MoEToCPU/HyperRouter*.cpp:
// a row's chunk is one vector of the target's lanes, rows spread over
// workers) and the GPU kernels (lib/Conversion/MoEToGPU/HyperRouter*.cpp: a
// row's chunk is one element per lane of a warp).
//
// Forward, one row r of m [R, C] against x [C] (gemvRowDot; gemvRowsDot
// runs several rows in one pass, each in this order):
//   the row is cut into chunks of `span` consecutive columns, C / span whole
//   ones and a ragged tail of C mod span (possibly empty); whole chunk j adds
//   m[r, chunk] · x[chunk] into accumulator j mod 4 of its holder while four
//   whole chunks remain, the rest of the whole chunks and the tail into
//   accumulator 0 (fused multiply-adds, in column order within each
//   accumulator); the holder's share is (a0 + a1) + (a2 + a3), and the row is
//   the target's sum of the shares over the chunk's span (`reduce`), plus
//   bias[r], then max(., 0) for the hidden layer (NaN-propagating).
// Four accumulators cover the FMA latency and keep four loads of the row in
// flight; the order is fixed by the shape, so a row's bits never depend on
// the thread count. (The targets' spans differ, 16 or 8 f32 lanes on the CPU,
// 32 threads on the GPU, so their bits differ from each other.)
//
// Backward, through y = m · x (the layer of rows [r0, r1) of one block):
//   dm[r, c] = dy[r] · x[c] (one rounding), and the block's partial of
//   dx = m^T · dy accumulates p[c] = fma(dy[r], m[r, c], p[c]) over its rows
//   in row order (layerGradStep); dx[c] sums the blocks' partials in an order
//   fixed by the shape (block order on the CPU; on the GPU lane l of a warp
//   sums blocks l, l + 32, ... in order, then a butterfly), never by timing
//   (no atomics). How the rows are cut into blocks is the target's (a few
//   per worker on the CPU, 64 rows a thread block on the GPU). Through the
//   ReLU, reluGrad.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_GEMV_H
#define MOE_KERNELS_GEMV_H

#include "MoE/Kernels/Builder.h"

namespace mlir::moe::kernels {

/// How a target holds the chunks of a row: what one holder (a CPU vector, a
/// GPU thread) loads of a chunk and how the holders' shares are summed.
struct GemvLayout {
  /// Columns of one chunk.
  int64_t span = 1;
  /// The type of one holder's share of a chunk (f32 or a vector of it).
  Type share;
  /// The holder's share of the chunk of `memref` that starts at `indices`
  /// (its last index is the chunk's first column), widened to f32. `count`
  /// null: a whole chunk; else the columns of the tail chunk that exist (an
  /// index < span), the others read as 0 and never loaded.
  function_ref<Value(Value memref, ValueRange indices, Value count)> load;
  /// The row's f32 from this holder's share: the sum over the holders of the
  /// chunk (a vector reduction; a butterfly over the warp's lanes).
  function_ref<Value(Value share)> reduce;
};

/// Σ_c m[r, c] · x[c] for the row `row` of m ([R, C], any float) and x ([C],
/// any float) with the order above; `cols` is C.
Value gemvRowDot(KernelBuilder &kb, const GemvLayout &layout, Value m, Value row,
                 Value x, Value cols);
/// The dots of several rows in one pass over the chunks: each row with its own
/// accumulators and the order above (its bits are gemvRowDot's), each chunk
/// of x loaded once for all of them. A target whose loop over one row leaves
/// memory bandwidth unused (AVX2: HyperRouter.cpp) reads two rows a step.
SmallVector<Value> gemvRowsDot(KernelBuilder &kb, const GemvLayout &layout,
                               Value m, ArrayRef<Value> rows, Value x,
                               Value cols);

/// The affine layer's output from a row's dot: dot + bias, then
/// max(., 0) when `relu` (NaN-propagating, as torch.relu).
Value gemvEpilogue(KernelBuilder &kb, Value dot, Value bias, bool relu);

/// Rows of y = relu?(m · x + bias): gemvRowsDot then gemvEpilogue with
/// bias[row] (any float), one value per row of `rows`.
SmallVector<Value> gemvRows(KernelBuilder &kb, const GemvLayout &layout, Value m,
                            ArrayRef<Value> rows, Value x, Value cols,
                            Value biasVec, bool relu);

/// Where row `row` of out [E·(D+1)] goes in the op's results: expert
/// row / (D+1), column row mod (D+1), the bias b[e] when that column is D.
struct HyperSlot {
  Value expert, column, isBias;
};
HyperSlot hyperSlot(KernelBuilder &kb, Value row, Value depth);

/// One entry w = m[r, c] of the backward of a layer: the gradient of the
/// entry, g · x (`g` = dy[r]; null when `x` is null: the caller writes no
/// d_m), and the block's partial of m^T · dy after that entry,
/// fma(g, w, partial). Scalars or vectors alike.
struct LayerGradStep {
  Value dm, partial;
};
LayerGradStep layerGradStep(KernelBuilder &kb, Value g, Value w, Value x,
                            Value partial);

/// Through the ReLU: dh where h > 0 or h is NaN (PyTorch's
/// threshold_backward passes a NaN), else 0 (0 at h = 0, as PyTorch).
Value reluGrad(KernelBuilder &kb, Value h, Value dh);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_GEMV_H
