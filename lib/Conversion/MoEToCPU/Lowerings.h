//===- Lowerings.h - The per-op fast CPU kernel patterns --------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One populate function per op (declared from the lowering table,
// include/MoE/Conversion/Lowerings.td), each defined in the file of the op's
// kernel, and the helpers the kernels share.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_LOWERINGS_H
#define MOE_LIB_CONVERSION_MOETOCPU_LOWERINGS_H

#include "KernelBuilder.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/IndexErrors.h"

namespace mlir {
class RewritePatternSet;
namespace moe::cpu_lowering {
/// True when an operand of `op` has a static zero size: the backward kernels
/// leave such ops to the portable lowering (none needs a special case for
/// them; the torch ops handle them without a kernel).
bool hasStaticZeroSize(Operation *op);

/// The base of the kernel patterns: benefit 2, so that a kernel wins over the
/// portable pattern of the same op when both are in one set. A pattern
/// implements emit() on a kernel builder at the op (with the target's lanes,
/// or kLanes when TargetLanes is false); emit() opens the op's KernelScope.
/// With LeaveZeroSized (the backward kernels), an op with a static zero-sized
/// operand is left to the portable lowering (hasStaticZeroSize).
template <typename OpTy, bool TargetLanes = true, bool LeaveZeroSized = false>
struct KernelPattern : OpRewritePattern<OpTy> {
  KernelPattern(MLIRContext *ctx, KernelOptions opts,
                PatternBenefit benefit = 2)
      : OpRewritePattern<OpTy>(ctx, benefit), opts(opts) {}
  KernelOptions opts;

  virtual LogicalResult emit(OpTy op, CpuKernelBuilder &kb,
                             PatternRewriter &rw) const = 0;

  LogicalResult matchAndRewrite(OpTy op, PatternRewriter &rw) const final {
    if (LeaveZeroSized && hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    ImplicitLocOpBuilder b(op.getLoc(), rw);
    if (!TargetLanes) {
      CpuKernelBuilder kb(b);
      return emit(op, kb, rw);
    }
    CpuKernelBuilder kb(b, opts);
    return emit(op, kb, rw);
  }
};

/// What the lowering table (Lowerings.td) says of the default kernel of an
/// op, CPUKernel<OpTy>: its record's traits, declared with it (a
/// specialization in Lowerings.h.inc; these are the defaults).
template <typename OpTy>
struct CPUKernelTraits {
  static constexpr bool targetLanes = true, leaveZeroSized = false;
};

/// The default kernel of an op: a KernelPattern with the op's traits, whose
/// emit() its file defines (`template <> LogicalResult
/// CPUKernel<XOp>::emit(...) const`); Lowerings.td generates its populate
/// function.
template <typename OpTy>
struct CPUKernel : KernelPattern<OpTy, CPUKernelTraits<OpTy>::targetLanes,
                                 CPUKernelTraits<OpTy>::leaveZeroSized> {
  using KernelPattern<OpTy, CPUKernelTraits<OpTy>::targetLanes,
                      CPUKernelTraits<OpTy>::leaveZeroSized>::KernelPattern;
  LogicalResult emit(OpTy op, CpuKernelBuilder &kb,
                     PatternRewriter &rw) const override;
};

/// For the kernels of ops with an index operand: emits the run-time check of
/// the portable lowering (linalg_lowering::emitIndexCheck), which reports each
/// entry of `indices` outside [0, bound) through moeReportIndexError; the
/// kernels then skip such entries as the portable lowering does. Fails (a match
/// failure of `op`) when there is no enclosing module to declare the report
/// function in.
LogicalResult checkIndexOperand(PatternRewriter &rw, Operation *op,
                                Value indices, Value bound, MoEErrorOp which);
/// The same with the constant bound `bound`.
LogicalResult checkIndexOperand(PatternRewriter &rw, Operation *op,
                                Value indices, int64_t bound, MoEErrorOp which);

/// moe.hyper_router's GEMV (HyperRouter.cpp), shared with its backward:
/// y = m · x + bias ([rows] f32, any float operands; ReLU when `relu`), rows
/// in memory order over row blocks on the workers. Each row's value goes to
/// `store(row, value)` when set (the forward's w and b), else into a new
/// buffer y, which is returned (null with `store`).
Value hyperAffine(CpuKernelBuilder &kb, const KernelOptions &opts, Value m,
                  Value x, Value bias, bool relu,
                  function_ref<void(Value row, Value v)> store = {});
/// Matrices of at most this many elements (1 MiB of f32) run on the calling
/// thread in the hyper_router kernels: as at most
/// CpuKernelBuilder::kInlineItems items.
constexpr int64_t kHyperInlineElements = 1 << 18;
} // namespace moe::cpu_lowering
} // namespace mlir

// populate<Name>Lowering of each op that Lowerings.td lowers with CPUKernel
// (with the traits and emit() of its default kernel), and populateLowerings
// (every one of them).
#include "Lowerings.h.inc"

#endif // MOE_LIB_CONVERSION_MOETOCPU_LOWERINGS_H
