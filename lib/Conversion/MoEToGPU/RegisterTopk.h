//===- RegisterTopk.h - Top-k of a row held in registers -------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// A top-k whose row fits in the registers of a group of lanes selects without
// touching memory, in the shared (value desc, index asc) order of
// MoE/Kernels/TopK.h: emitRegisterTopk runs k rounds of a group-wide max
// (butterfly shuffles or redux.sync) over the whole row, emitListTopk
// (topk-rounds=list) over each lane's best few candidates kept sorted.
// topk_renorm, the fused similarity kernels (FlashMix, FlashMma) and
// moe.route's lanes kernel end in one of them.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_REGISTERTOPK_H
#define MOE_LIB_CONVERSION_MOETOGPU_REGISTERTOPK_H

#include "GpuKernelBuilder.h"
#include "MoE/Kernels/TopK.h"

namespace mlir::moe::gpu_lowering {

// The order (orderedKey, packCandidate, ...), TopkSpec and topkWeight are the
// shared ones of MoE/Kernels/TopK.h.
using kernels::TopkSpec;

/// How the rounds of a register top-k find the next element: `Butterfly`, a
/// butterfly max of packed 64-bit (key, index) candidates below the previous
/// winner; `Redux` (sm_80+), 32-bit keys carried as loop state, a group max
/// (redux.sync max), the lowest index holding it (redux.sync min) and a
/// knock-out of that entry (INT32_MIN, below every key) in its lane.
enum class TopkRounds { Butterfly, Redux };

/// The row layout of a register top-k (emitRegisterTopk): register m of lane
/// l of a group of `width` holds element (m / run) * width * run + l * run +
/// m % run.
struct RegisterRow {
  int64_t width, run;
  /// The element index of register m given laneBase() of the lane.
  Value index(GpuKernelBuilder &kb, int64_t m, Value laneBase) const {
    return kb.add(kb.cI32(offset(m)), laneBase);
  }
  /// lane * run (i32), built once: the lane's part of every index.
  Value laneBase(GpuKernelBuilder &kb, Value laneI32) const {
    return run == 1 ? laneI32 : kb.mul(laneI32, kb.cI32(run));
  }
  /// Whether register m of some lane holds padding (an index >= count): its
  /// last lane's index.
  bool mayPad(int64_t m, int64_t count) const {
    return offset(m) + (width - 1) * run >= count;
  }
  int64_t offset(int64_t m) const { return m / run * width * run + m % run; }
};

/// Top-k of one row held in registers by a group of `width` lanes (a power of
/// two <= 32, aligned in the warp): lane `lane` holds `vals[m]`, the element of
/// index (m / run) * width * run + lane * run + m % run, i.e. runs of `run`
/// adjacent elements, the group's runs side by side (run = 1: m*width + lane,
/// the warp kernels; run = 2, width = 4: one row of mma.sync's C fragments,
/// where lane t of a quad holds columns 8n + 2t and 8n + 2t + 1). Elements of
/// index >= numElements are padding. Every lane of the group must execute it
/// (shuffles); stores happen only when `active`. The k rounds select, by a
/// butterfly max on packed candidates below the previous winner, the next
/// (value desc, index asc) element; round r's raw value and index are stored
/// by lane r % width, which rescales its own entries in the epilogue (no
/// cross-lane memory traffic). `denseMax`/`denseSum` (logits without
/// renormalization) are the row's max and sum of exp(x - max); pass null
/// otherwise.
void emitRegisterTopk(GpuKernelBuilder &kb, ArrayRef<Value> vals, Value lane,
                      int64_t width, int64_t numElements, const TopkSpec &spec,
                      Value weights, Value indices, Value row, Value active,
                      Value denseMax, Value denseSum,
                      TopkRounds rounds = TopkRounds::Butterfly,
                      int64_t run = 1);

/// The top-k of topk-rounds=list on one row held by a group of `width` lanes
/// (a power of two <= 32, aligned in the warp; every lane of the warp must
/// execute it: shuffles, redux and a warp vote). Lane `lane` holds the
/// ordered keys `keys[m]` (emptyListKey for padding) of the elements of index
/// positions[m] + `laneBase` (positions increasing with m). Each lane keeps
/// its best `listLength` candidates in registers (a TopList); a round takes
/// the group's best head (max key, then the lowest index holding it:
/// redux.sync when `width` is 32, else butterflies of 32-bit shuffles) and the
/// winning lane pops its head. A lane whose list runs out while it still has
/// elements leaves the round loop with the whole warp and refills it from its
/// keys (the elements ranking after its last pick). Pick r is kept by lane
/// r % width, which turns it into a weight after the rounds and stores it with
/// its index (stores only when `active`). `denseMax`/`denseSum` as for
/// emitRegisterTopk. With `epilogue`, the caller forms the weights instead
/// (moe.route: the picks' scores, not their choice values): it gets the
/// lane's picks (ListPicks) and stores them itself; `weights`, `indices` and
/// the weight fields of `spec` (all but k) are then unused.
struct ListPicks {
  /// Slot s: pick lane + s * width, its key and index (i32), and whether it
  /// exists (< k).
  SmallVector<Value> keys, indices, valid;
};
void emitListTopk(GpuKernelBuilder &kb, ArrayRef<Value> keys,
                  ArrayRef<int64_t> positions, Value laneBase, Value lane,
                  int64_t width, int64_t listLength, const TopkSpec &spec,
                  Value weights, Value indices, Value row, Value active,
                  Value denseMax, Value denseSum,
                  function_ref<void(const ListPicks &)> epilogue = nullptr);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_REGISTERTOPK_H
