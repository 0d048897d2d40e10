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

/// What a top-k of one row produces: pick r, in the shared (value desc,
/// index asc) order, is stored at [row, r] of `weights` (f32: its weight, as
/// `spec` forms it) and `indices` (i32). Only the lanes of an `active` row
/// store; the others still take part in the shuffles.
struct TopkOutputs {
  /// k and how a pick's value becomes its weight (MoE/Kernels/TopK.h).
  const TopkSpec &spec;
  Value weights, indices, row, active;
  /// Logits without renormalization (spec.logits && !spec.renormalize): the
  /// row's max and sum of exp(x - max), the dense softmax's denominator; null
  /// otherwise.
  Value denseMax = {}, denseSum = {};
};

/// A register top-k (emitRegisterTopk): the row a group of lanes holds and
/// what to produce from it.
struct RegisterTopkParams {
  // The row: lane `lane` (index) of a group of `width` lanes (a power of two
  // <= 32, aligned in the warp) holds `vals` (f32) in the RegisterRow layout
  // of (width, run). Elements of index >= numElements are padding.
  ArrayRef<Value> vals;
  Value lane;
  int64_t width;
  int64_t run = 1;
  int64_t numElements;
  /// How the rounds find the next element.
  TopkRounds rounds = TopkRounds::Butterfly;
  // What to produce.
  TopkOutputs out;
};

/// Top-k of one row held in registers by a group of `p.width` lanes: lane
/// `lane` holds `vals[m]`, the element of index (m / run) * width * run +
/// lane * run + m % run, i.e. runs of `run` adjacent elements, the group's
/// runs side by side (run = 1: m*width + lane, the warp kernels; run = 2,
/// width = 4: one row of mma.sync's C fragments, where lane t of a quad holds
/// columns 8n + 2t and 8n + 2t + 1). Every lane of the group must execute it
/// (shuffles). The k rounds select, by a butterfly max on packed candidates
/// below the previous winner (or redux.sync, TopkRounds), the next (value
/// desc, index asc) element; round r's raw value and index are stored by lane
/// r % width, which rescales its own entries in the epilogue (no cross-lane
/// memory traffic).
void emitRegisterTopk(GpuKernelBuilder &kb, const RegisterTopkParams &p);

struct ListPicks {
  /// Slot s: pick lane + s * width, its key and index (i32), and whether it
  /// exists (< k).
  SmallVector<Value> keys, indices, valid;
};

/// A top-k of topk-rounds=list (emitListTopk): the row a group of lanes holds
/// and what to produce from it.
struct ListTopkParams {
  // The row: lane `lane` (index) of a group of `width` lanes (a power of two
  // <= 32, aligned in the warp) holds the ordered keys `keys[m]`
  // (emptyListKey for padding) of the elements of index positions[m] +
  // `laneBase` (i32; positions increasing with m).
  ArrayRef<Value> keys;
  ArrayRef<int64_t> positions;
  Value laneBase;
  Value lane;
  int64_t width;
  /// Candidates each lane keeps sorted in registers.
  int64_t listLength;
  // What to produce.
  TopkOutputs out;
  /// When set, the caller forms the weights instead (moe.route: the picks'
  /// scores, not their choice values): it gets the lane's picks and stores
  /// them itself; out's weights, indices and the weight fields of its spec
  /// (all but k) are then unused.
  function_ref<void(const ListPicks &)> epilogue = nullptr;
};

/// The top-k of topk-rounds=list on one row held by a group of `p.width`
/// lanes (every lane of the warp must execute it: shuffles, redux and a warp
/// vote). Each lane keeps its best `listLength` candidates in registers (a
/// TopList); a round takes the group's best head (max key, then the lowest
/// index holding it: redux.sync when `width` is 32, else butterflies of 32-bit
/// shuffles) and the winning lane pops its head. A lane whose list runs out
/// while it still has elements leaves the round loop with the whole warp and
/// refills it from its keys (the elements ranking after its last pick). Pick r
/// is kept by lane r % width, which turns it into a weight after the rounds
/// and stores it with its index (or hands it to `epilogue`).
void emitListTopk(GpuKernelBuilder &kb, const ListTopkParams &p);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_REGISTERTOPK_H
