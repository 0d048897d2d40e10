//===- RowKernels.h - Layouts of the kernels over rows ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The set-up shared by the GPU kernels that walk the rows of a [T, E]
// operand (RouterStats.cpp, RouterZLoss.cpp, RouteGrad.cpp,
// TopkRenormGrad.cpp):
//
//  * a result shaped like the rows operand;
//  * a warp per row (rows independent: the gradients), the whole lowering of
//    such an op but its per-row body (lowerWarpRowKernel);
//  * a thread per row (the top-k picks' gradients): the same for those
//    (lowerPickGradKernel);
//  * row blocks for the deterministic reductions without atomics: a block of
//    4 warps owns the kBalanceRowsPerBlock rows of one row block (the CPU
//    kernels' blocks, MoE/Kernels/Balance.h) and leaves that block's
//    partials; a second kernel sums the partials in block order
//    (sumInOrder). The sums are then the CPU kernel's additions in the CPU
//    kernel's order: the same bits on every launch, whatever the schedule.
//
// Every value here is built one statement at a time: the order of the ops
// must not depend on the compiler's order of evaluating call arguments
// (gcc and clang differ; the plain and ASan builds must emit the same IR).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_ROWKERNELS_H
#define MOE_LIB_CONVERSION_MOETOGPU_ROWKERNELS_H

#include "HostCode.h"

namespace mlir::moe::gpu_lowering {

/// The buffer of a result of `type` shaped like the operand buffer `like`
/// (its dynamic sizes are `like`'s dims at the same positions): an out of
/// `h`'s kernel.
Value allocResultLike(HostCode &h, RankedTensorType type, Value like);

/// A warp per row in a kernel of `blockSize` threads a block (a multiple of
/// 32): blockSize / 32 rows per block.
struct WarpRow {
  /// Builds the thread's lane and its warp's row in kernel `g`.
  WarpRow(GpuKernelBuilder &g, int64_t blockSize);
  /// The blocks that give each of `rows` rows a warp (host code).
  static Value blocks(GpuKernelBuilder &kb, Value rows, int64_t blockSize);

  Value lane;
  /// The warp's row; past the last row in the spare warps of the last block.
  Value row;
};

/// The kernel of lowerWarpRowKernel as its body sees it.
struct WarpRowKernel {
  GpuKernelBuilder &g;
  GPUKernel &kernel;
  /// The thread's lane and its warp's row (< rows).
  WarpRow w;
  /// The kernel's rows operand [T, E] (argument 0), the result (the last
  /// argument), T and E.
  Value x, out, rows, numExperts;
};

/// Lowers `op`, whose one result `result` is shaped like its rows operand
/// `logits` [T, E] and computed with a warp per row (the rows are
/// independent: the gradients of the logits): the buffers of `logits` and of
/// `inputs` (in order; a null one, an absent optional operand, is left out),
/// then the result's, allocated like the logits; kernel `name` on
/// {logits, inputs..., result} with `blockSize`-thread blocks, in which
/// body(k) runs on each warp that has a row, launched over the rows; `op`
/// replaced with the result. The ops come in one order for every such op
/// (host: the buffers, the result; kernel: the lane and row, then T, then E).
void lowerWarpRowKernel(RewriterBase &rewriter, Operation *op, Value result,
                        Value logits, ValueRange inputs, StringRef name,
                        int64_t blockSize,
                        function_ref<void(WarpRowKernel &k)> body);

/// The kernel of lowerPickGradKernel as its body sees it: the forward's
/// scores [T, E], its picks and the gradient of their weights [T, k], and the
/// result [T, E], each a kernel argument viewed as 2-D.
struct PickGradKernel {
  GpuKernelBuilder &g;
  GPUKernel &kernel;
  Value x, indices, dw, out;
};

/// Lowers the backward of a top-k pick (route_grad, topk_renorm_grad): its
/// operands `operands` (the adaptor's: the forward's scores [T, E], its
/// indices and dw [T, k]), its one result shaped like the scores and computed
/// with a thread per row. The buffers of the scores, of the result (allocated
/// like them), of the indices and of dw, each viewed as 2-D (viewAs2D);
/// kernel `name` of kKernelThreads-thread blocks on them, built by body(k)
/// and launched over the rows (launchOver); `op` replaced with the result.
void lowerPickGradKernel(RewriterBase &rewriter, Operation *op,
                         ValueRange operands, StringRef name,
                         function_ref<void(PickGradKernel &k)> body);

/// The buffer of `result`, a reduction over the rows of `x` [T, E]: [E] (its
/// dynamic size E from `x`) or a scalar.
Value allocReduced(HostCode &h, Value result, Value x);

/// Threads of a row-block kernel: 4 warps share the kBalanceRowsPerBlock
/// rows of a block.
inline constexpr int64_t kRowBlockThreads = 128;

/// The row block of the running block of a row-block kernel (launched with
/// rowBlockCount() blocks of kRowBlockThreads threads) over the rows of `x`.
struct RowBlock {
  /// Builds the thread's place and the block's rows in kernel `g`.
  RowBlock(GpuKernelBuilder &g, Value x);
  /// body(r) for the block's rows first + r, r in [0, count), a warp per row:
  /// warp w takes r = w, w + 4, ... The loop is uniform per warp (the whole
  /// warp enters the shuffles of `body` or none of it does).
  void forEachRowOfWarp(function_ref<void(Value r)> body);

  GpuKernelBuilder &g;
  Value tid, warp, lane;
  /// T, the rows of `x`.
  Value rows;
  /// The block's index: the index of its partial.
  Value block;
  /// The block's first row and its row count (kBalanceRowsPerBlock, fewer
  /// only in the last block).
  Value first, count;
};

/// The row blocks of `rows` rows: the grid of a row-block kernel and the
/// length of its partials (host code).
Value rowBlockCount(GpuKernelBuilder &kb, Value rows);

/// Sums of the series terms[j](i), i = 0, 1, ..., n - 1, each from 0.0, all
/// in one loop: sum j = ((0 + terms[j](0)) + terms[j](1)) + ... The order of
/// the additions is fixed (no tree, no atomics): what makes the balance
/// kernels' sums reproducible.
SmallVector<Value> sumInOrder(GpuKernelBuilder &g, Value n,
                              ArrayRef<function_ref<Value(Value i)>> terms);
/// The same for one series.
Value sumInOrder(GpuKernelBuilder &g, Value n,
                 function_ref<Value(Value i)> term);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_ROWKERNELS_H
