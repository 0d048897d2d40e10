//===- KernelUtils.h - Building blocks of the moe GPU kernels ---*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The kernels of convert-moe-to-gpu are written with the builders below:
// the project's kernel builder (MoE/Kernels) on one thread's scalars, warp
// shuffle reductions, block reductions through workgroup memory, the register
// top-k over the shared order of MoE/Kernels/TopK.h, and the host side of a
// lowering (operand buffers, result allocations, launches on one stream).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELUTILS_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELUTILS_H

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/Kernels/Builder.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/PatternMatch.h"

#include <array>
#include <functional>

namespace mlir::moe::gpu_lowering {

/// Threads of a warp.
constexpr int64_t kWarp = 32;
/// Threads of a block of the kernels whose block size is fixed rather than
/// the pass's block-size option: 4 warps.
constexpr int64_t kKernelThreads = 128;

//===----------------------------------------------------------------------===//
// Scalar and control-flow helpers
//===----------------------------------------------------------------------===//

/// The GPU instance of the kernel builder (MoE/Kernels/Builder.h): one
/// thread's scalars, plus thread/block ids, barriers and warp shuffles.
class GpuKernelBuilder : public kernels::KernelBuilder {
public:
  explicit GpuKernelBuilder(ImplicitLocOpBuilder &b)
      : kernels::KernelBuilder(b) {}

  // GPU ids (index).
  Value threadId(gpu::Dimension d = gpu::Dimension::x);
  Value blockId(gpu::Dimension d = gpu::Dimension::x);
  Value gridDim(gpu::Dimension d = gpu::Dimension::x);
  void barrier();
  /// One butterfly step: the value of lane `lane ^ offset` (i32 or f32).
  Value shuffleXor(Value v, int64_t offset);
  /// Lane `srcLane` (an i32 lane in the warp) of `v`.
  Value shuffleIdx(Value v, Value srcLane);
};

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

enum class ReduceKind { Sum, Max, MaxI64 };

/// Butterfly reduction over aligned groups of `width` lanes (a power of two
/// <= 32): every lane of the group gets the result. f32 Sum/Max
/// (NaN-propagating) are gpu.subgroup_reduce ops (cluster_size = width);
/// i64 signed max (MaxI64) is built here from 32-bit shuffles.
Value subgroupReduce(GpuKernelBuilder &kb, Value v, ReduceKind kind,
                     int64_t width);

/// Lowers the gpu.subgroup_reduce ops of `kernels` to gpu.shuffle butterflies
/// (offsets 1, 2, 4, ...) with upstream's patterns: no upstream pass applies
/// them, and gpu-to-nvvm lowers only i32 reductions (to redux.sync).
LogicalResult lowerSubgroupReductions(gpu::GPUModuleOp kernels);

/// Block reduction (blockDim.x = `threads`, a multiple of 32): warp butterfly,
/// one value per warp through `scratch` (a workgroup memref of at least
/// threads/32 elements of v's type), then every thread combines the warp
/// values in warp order, so the result is deterministic. Contains two
/// barriers; every thread of the block must reach it.
Value blockReduce(GpuKernelBuilder &kb, Value v, ReduceKind kind,
                  int64_t threads, Value scratch);

//===----------------------------------------------------------------------===//
// Top-k keys
//===----------------------------------------------------------------------===//

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

/// The 16 bytes at `address` (an index: a generic address of global memory,
/// 16-byte aligned, read-only in the kernel) as the f32 values of its
/// 16 / sizeof(elt) elements of type `elt` (f32, f16, bf16): one
/// ld.global.nc.v4.b32.
SmallVector<Value> loadGlobal16(GpuKernelBuilder &kb, Value address, Type elt);

//===----------------------------------------------------------------------===//
// Kernels and host code
//===----------------------------------------------------------------------===//

class HostCode;

/// The gpu.module @moe_kernels of a module, created through `b` (a builder of
/// the pattern's rewriter) on first use; the pass marks the module
/// gpu.container_module once it has one.
gpu::GPUModuleOp getOrCreateKernelModule(ModuleOp module, OpBuilder &b);

/// memref<shape x elt, #gpu.address_space<workgroup>>.
MemRefType workgroupMemRef(ArrayRef<int64_t> shape, Type elementType);

/// Host code of one op, built inside a destination-style `moe.kernel`
/// (MoEKernelOp.td): the tensors it reads are the kernel's `ins`, its results
/// are `outs` whose destinations are `bufferization.alloc_tensor`, and the
/// body works on the block arguments, the buffers of both. One-shot
/// bufferization (moe-gpu-bufferize), not this code, turns the outs into
/// device allocations. The body's work runs on one stream (an async token
/// chain from gpu.wait async to a final gpu.wait); temporaries are gpu.alloc
/// on it. Every op goes through the pattern's rewriter (`b` shares its
/// listener): the kernel before `op`, GPU kernels and runtime declarations
/// in its module. The ins and outs are collected as the host code asks for
/// them; the moe.kernel with its results is made by the first tensor() or
/// replace(), after finish().
class HostCode {
public:
  HostCode(RewriterBase &rewriter, Operation *op);
  RewriterBase &rewriter;
  ImplicitLocOpBuilder b;
  ModuleOp module;
  GpuKernelBuilder kb;

  /// The buffer of a tensor operand (identity layout; read only): an in of
  /// the kernel.
  Value buffer(Value tensor);
  /// A temporary device allocation (gpu.alloc on the stream) of `type` with
  /// dynamic sizes; it must be released, or be a result (replace() then
  /// copies it into an out: use allocLike for results).
  Value alloc(MemRefType type, ValueRange dynamicSizes);
  /// The buffer of a result shaped like a tensor, dynamic sizes given: an
  /// out of the kernel. The sizes may be computed in the host code from the
  /// dims of buffer()s and outs (they are recomputed outside the kernel).
  Value allocLike(RankedTensorType type, ValueRange dynamicSizes);
  /// Fills a 32-bit buffer (f32 or i32) with a constant bit pattern.
  void fill32(Value buffer, Value value);
  /// Frees a temporary allocation once the stream reaches this point.
  void release(Value buffer);
  /// The device address of the runtime's error word (moeGpuErrorWord()).
  Value errorWord();
  /// Waits for the stream; with `checkErrors`, then calls moeGpuCheckErrors().
  void finish(bool checkErrors = false);
  /// The tensor of a result buffer (after finish()): the kernel's result of
  /// an out; any other buffer is first copied into a new out on the stream.
  /// The first call makes the moe.kernel; `b` then continues after it.
  Value tensor(Value buffer, RankedTensorType type);
  /// Replaces the results of `op` by the tensors of `buffers` (one each).
  void replace(Operation *op, ValueRange buffers);
  /// Replaces the results of several ops, in order, by the tensors of
  /// `buffers` (an op lowered together with its consumers).
  void replace(ArrayRef<Operation *> ops, ValueRange buffers);

private:
  friend class GPUKernel;
  /// Launches `kernel` on `args` on the stream (GPUKernel::launch).
  /// `dynamicSharedBytes` (an i32, or null: none) is the block's dynamic
  /// shared memory (gpu.dynamic_shared_memory in the kernel).
  void launch(gpu::GPUFuncOp kernel, std::array<Value, 3> grid,
              std::array<int64_t, 3> block, ValueRange args,
              Value dynamicSharedBytes = Value());
  /// The out whose buffer is `buffer`; one holding a copy of it if `buffer`
  /// is not an out.
  BlockArgument outFor(Value buffer, RankedTensorType type);
  /// The kernel's result of `out` as a `type` (making the kernel first).
  Value resultOf(BlockArgument out, RankedTensorType type);
  /// `v` (an index computed in the body) recomputed before the kernel.
  Value hoist(Value v);
  /// Makes the moe.kernel from the body built so far.
  void makeKernelOp();

  Value token;
  /// The op the body is built in until makeKernelOp(): a moe.kernel without
  /// operands whose block arguments are added as ins and outs come.
  Operation *body;
  /// The kernel once made.
  Operation *kernel = nullptr;
  /// The ins (tensors) and outs (alloc_tensor results), in block argument
  /// order.
  SmallVector<Value> ins, outs;
  /// The closing gpu.wait of finish().
  Operation *closingWait = nullptr;
  /// Values of the body recomputed before the kernel (hoist()).
  IRMapping hoisted;
};

/// One kernel of an op's host code, defined and launched in one place: a new
/// gpu.func `<name>_<n>` in @moe_kernels of `h`'s module (built through `h`'s
/// rewriter) whose arguments take the types of `operands`, with the
/// workgroup buffers `workgroupTypes` and the known block size `blockSize`.
/// `b` (and `k` on it) builds the body, from its start (a gpu.return is
/// already there); launch() runs the kernel on `operands` on `h`'s stream.
/// The body and the host code are separate blocks: either may come first.
class GPUKernel {
public:
  GPUKernel(HostCode &h, StringRef name, ValueRange operands,
            TypeRange workgroupTypes, std::array<int64_t, 3> blockSize,
            Location loc);
  GPUKernel(const GPUKernel &) = delete;
  GPUKernel &operator=(const GPUKernel &) = delete;

  /// The builder of the body and the kernel builder on it.
  ImplicitLocOpBuilder b;
  GpuKernelBuilder kb;
  gpu::GPUFuncOp func;

  /// Argument `i`: operand `i` on the device.
  Value arg(unsigned i);
  /// Workgroup buffer `i`.
  Value workgroup(unsigned i);
  /// The thread's index in a 1-D grid: blockIdx.x · blockDim.x + threadIdx.x.
  Value globalId();
  /// A thread per item of [0, `count`) (launchOver): body(item) with the
  /// thread's item, globalId(), on the threads that have one.
  void forItem(Value count, function_ref<void(Value item)> body);

  /// A thread per column (globalId(), blocks along x), the rows strided over
  /// the blocks along y (gridDim.y is capped at 65535, kMaxGridDim of
  /// Limits.h; the row count is not): when `inRange` (the column exists),
  /// body(row) for the rows of [0, rows) that fall to this block. Launch with
  /// launchColumns.
  void forRowsOfColumn(Value inRange, Value rows,
                       function_ref<void(Value row)> body);

  /// Launches the kernel on its operands over `grid` blocks, with
  /// `dynamicSharedBytes` of dynamic shared memory (null: none).
  void launch(std::array<Value, 3> grid, Value dynamicSharedBytes = Value());
  /// Launches it over ceil(`count` / blockDim.x) blocks along x: a thread per
  /// item (globalId()), the last block's extra threads idle.
  void launchOver(Value count);
  /// Launches a forRowsOfColumn kernel: ceil(`cols` / blockDim.x) blocks
  /// along x, min(`rows`, 65535) along y.
  void launchColumns(Value cols, Value rows);

private:
  HostCode &host;
  SmallVector<Value> operands;
  std::array<int64_t, 3> blockSize;
};

/// Records, from a kernel, that element `position` of the index operand of op
/// `opCode` (MoE/Kernels/IndexErrors.h) holds `value`, outside [0, bound): the
/// first error wins the flag (cmpxchg) and writes the details. `word` is the
/// i64 device address from HostCode::errorWord().
void emitRecordIndexError(GpuKernelBuilder &kb, Value word, int64_t opCode,
                          Value position, Value value, Value bound);

/// Dynamic sizes of `type` taken from the dims of `like` at the same
/// positions (both of the same rank).
SmallVector<Value> dynamicSizesFrom(GpuKernelBuilder &kb, RankedTensorType type,
                                    Value like);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELUTILS_H
