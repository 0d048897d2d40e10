//===- KernelUtils.h - Building blocks of the moe GPU kernels ---*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The kernels of convert-moe-to-gpu are written with the builders below:
// scalar arithmetic on an ImplicitLocOpBuilder, structured control flow,
// butterfly (xor) shuffle reductions, block reductions through workgroup
// memory, the ordered float key used by every top-k, and the host side of a
// lowering (operand buffers, result allocations, launches on one stream).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELUTILS_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELUTILS_H

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/PatternMatch.h"

#include <array>
#include <functional>

namespace mlir::moe::gpu_lowering {

/// Threads of a warp.
constexpr int64_t kWarp = 32;

//===----------------------------------------------------------------------===//
// Scalar and control-flow helpers
//===----------------------------------------------------------------------===//

/// Arithmetic, memory and control flow on an ImplicitLocOpBuilder. Integer
/// helpers work on index and iN alike; float helpers on f32.
class KB {
public:
  explicit KB(ImplicitLocOpBuilder &b) : b(b) {}
  ImplicitLocOpBuilder &b;

  Type f32() { return b.getF32Type(); }
  Type i32() { return b.getI32Type(); }
  Type i64() { return b.getI64Type(); }
  Type index() { return b.getIndexType(); }

  Value cIdx(int64_t v);
  Value cI32(int64_t v);
  Value cI64(int64_t v);
  Value cF32(double v);
  Value cTrue();

  // Integers (index or iN).
  Value add(Value x, Value y);
  Value sub(Value x, Value y);
  Value mul(Value x, Value y);
  Value divu(Value x, Value y);
  Value remu(Value x, Value y);
  Value ceilDiv(Value x, Value y);
  Value minu(Value x, Value y);
  Value maxs(Value x, Value y);
  Value mins(Value x, Value y);
  Value cmp(arith::CmpIPredicate p, Value x, Value y);
  Value lt(Value x, Value y) { return cmp(arith::CmpIPredicate::slt, x, y); }
  Value eq(Value x, Value y) { return cmp(arith::CmpIPredicate::eq, x, y); }
  Value andI(Value x, Value y);
  Value orI(Value x, Value y);
  Value xorI(Value x, Value y);
  Value shl(Value x, Value y);
  Value shrs(Value x, Value y);
  Value shru(Value x, Value y);
  Value notI1(Value x);
  /// index <-> iN casts (signed).
  Value cast(Value x, Type to);
  Value extu(Value x, Type to);
  Value trunc(Value x, Type to);

  // f32.
  Value fadd(Value x, Value y);
  Value fsub(Value x, Value y);
  Value fmul(Value x, Value y);
  Value fdiv(Value x, Value y);
  /// NaN-propagating max/min (torch.max semantics).
  Value fmax(Value x, Value y);
  Value fmin(Value x, Value y);
  Value exp(Value x);
  Value log(Value x);
  Value fabs(Value x);
  Value cmpf(arith::CmpFPredicate p, Value x, Value y);
  Value sitofp(Value x);
  Value bitcast(Value x, Type to);

  Value select(Value c, Value x, Value y);

  /// Loads one element; f16/bf16 are extended to f32.
  Value loadF(Value memref, ValueRange indices);
  /// Loads one element as is.
  Value load(Value memref, ValueRange indices);
  void store(Value v, Value memref, ValueRange indices);
  Value dim(Value memref, int64_t d);

  /// scf.for without results.
  void forLoop(Value lb, Value ub, Value step,
               function_ref<void(Value iv)> body);
  /// scf.for with loop-carried values; `body` returns the next values.
  SmallVector<Value>
  forLoop(Value lb, Value ub, Value step, ValueRange init,
          function_ref<SmallVector<Value>(Value iv, ValueRange args)> body);
  /// scf.if without results.
  void ifThen(Value cond, function_ref<void()> then);
  /// scf.if with results.
  SmallVector<Value> ifElse(Value cond, TypeRange types,
                            function_ref<SmallVector<Value>()> then,
                            function_ref<SmallVector<Value>()> otherwise);

  // GPU ids (index).
  Value threadId(gpu::Dimension d = gpu::Dimension::x);
  Value blockId(gpu::Dimension d = gpu::Dimension::x);
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
/// (NaN-propagating) or i64 signed max (MaxI64).
Value subgroupReduce(KB &k, Value v, ReduceKind kind, int64_t width);

/// Block reduction (blockDim.x = `threads`, a multiple of 32): warp butterfly,
/// one value per warp through `scratch` (a workgroup memref of at least
/// threads/32 elements of v's type), then every thread combines the warp
/// values in warp order, so the result is deterministic. Contains two
/// barriers; every thread of the block must reach it.
Value blockReduce(KB &k, Value v, ReduceKind kind, int64_t threads,
                  Value scratch);

//===----------------------------------------------------------------------===//
// Top-k keys
//===----------------------------------------------------------------------===//

/// Monotone i32 key of an f32: -inf < ... < -0 == +0 < ... < +inf < NaN
/// (every NaN maps to INT32_MAX, above every number).
Value orderedKey(KB &k, Value f);
/// The f32 of a key (a NaN for INT32_MAX).
Value keyToFloat(KB &k, Value key);
/// (key, index) packed so that a larger i64 is the better candidate: a larger
/// key, then a *smaller* index (lowest-index ties).
Value packCandidate(KB &k, Value key, Value index /*i32*/);
Value candidateKey(KB &k, Value packed);
Value candidateIndex(KB &k, Value packed);
/// The packed value below every candidate ("none").
Value noCandidate(KB &k);

/// How the k selected values become weights (moe.topk_renorm's mode and
/// renormalize attributes).
struct TopkSpec {
  int64_t k = 1;
  bool logits = true;
  bool renormalize = true;
};

/// Top-k of one row held in registers by a group of `width` lanes (a power of
/// two <= 32, aligned in the warp): lane `lane` holds `vals[m]`, the element of
/// index m*width + lane (elements of index >= numElements are padding). Every
/// lane of the group must execute it (shuffles); stores happen only when
/// `active`. The k rounds select, by a butterfly max on packed candidates
/// below the previous winner, the next (value desc, index asc) element; round
/// r's raw value and index are stored by lane r % width, which rescales its
/// own entries in the epilogue (no cross-lane memory traffic).
/// `denseMax`/`denseSum` (logits without renormalization) are the row's max
/// and sum of exp(x - max); pass null otherwise.
void emitRegisterTopk(KB &k, ArrayRef<Value> vals, Value lane, int64_t width,
                      int64_t numElements, const TopkSpec &spec,
                      Value weights, Value indices, Value row, Value active,
                      Value denseMax, Value denseSum);

/// Weight epilogue shared by every top-k: the weight of selected value `v`
/// given the first (largest) selected value `v0`, the running sum of the
/// selection (`selSum`: Σ exp(v - v0) for logits, Σ v for probs) and, for
/// logits without renormalization, the dense row max and sum.
Value topkWeight(KB &k, const TopkSpec &spec, Value v, Value v0, Value selSum,
                 Value denseMax, Value denseSum);

//===----------------------------------------------------------------------===//
// Kernels and host code
//===----------------------------------------------------------------------===//

/// The gpu.module @moe_kernels of a module (created on first use; the module
/// gets gpu.container_module).
gpu::GPUModuleOp getOrCreateKernelModule(ModuleOp module);

/// A new kernel `<base>_<n>` in @moe_kernels with the given argument types,
/// workgroup buffers and known block size; the builder is left at the start
/// of its body (a gpu.return is already there).
gpu::GPUFuncOp createKernel(ModuleOp module, StringRef base,
                            TypeRange argTypes, TypeRange workgroupTypes,
                            std::array<int64_t, 3> blockSize,
                            ImplicitLocOpBuilder &kb);

/// memref<shape x elt, #gpu.address_space<workgroup>>.
MemRefType workgroupMemRef(ArrayRef<int64_t> shape, Type elementType);

/// Host code of one op: operand buffers, result allocations and launches in
/// one stream (an async token chain from gpu.wait async to a final gpu.wait).
class HostCode {
public:
  HostCode(ImplicitLocOpBuilder &b, ModuleOp module);
  ImplicitLocOpBuilder &b;
  ModuleOp module;
  KB k;

  /// The buffer of a tensor operand (identity layout; read only).
  Value buffer(Value tensor);
  /// A device allocation (gpu.alloc) of `type` with dynamic sizes.
  Value alloc(MemRefType type, ValueRange dynamicSizes);
  /// A device allocation shaped like a tensor result, dynamic sizes given.
  Value allocLike(RankedTensorType type, ValueRange dynamicSizes);
  /// Fills a 32-bit buffer (f32 or i32) with a constant bit pattern.
  void fill32(Value buffer, Value value);
  void launch(gpu::GPUFuncOp kernel, std::array<Value, 3> grid,
              std::array<int64_t, 3> block, ValueRange args);
  /// Frees a temporary allocation once the stream reaches this point.
  void release(Value buffer);
  /// The device address of the runtime's error word (moeGpuErrorWord()).
  Value errorWord();
  /// Waits for the stream; with `checkErrors`, then calls moeGpuCheckErrors().
  void finish(bool checkErrors = false);
  /// The tensor of a result buffer.
  Value tensor(Value buffer, RankedTensorType type);

private:
  Value token;
};

/// Records, from a kernel, that element `position` of the index operand of op
/// `opCode` (ErrorReporting.h) holds `value`, outside [0, bound): the first
/// error wins the flag (cmpxchg) and writes the details. `word` is the i64
/// device address from HostCode::errorWord().
void emitRecordIndexError(KB &k, Value word, int64_t opCode, Value position,
                          Value value, Value bound);

/// Dynamic sizes of `type` taken from the dims of `like` at the same
/// positions (both of the same rank).
SmallVector<Value> dynamicSizesFrom(KB &k, RankedTensorType type, Value like);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELUTILS_H
