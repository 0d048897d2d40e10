//===- KernelBuilder.h - Building blocks of the fast CPU kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The kernels of convert-moe-to-cpu are written on memrefs with the builders
// below: scalar and vector arithmetic (the same helper works on f32 and on
// vector<Nxf32>), structured loops, vector loads that widen f16/bf16 to f32,
// a polynomial exp that vectorizes (math.exp on vectors becomes one libm call
// per lane), the ordered top-k key, and the worker loop that spreads
// independent items (rows, row tiles, column blocks) over threads.
//
// A kernel reads its operands through `bufferization.to_buffer` (read-only)
// and writes freshly allocated buffers that become tensors again with
// `bufferization.to_tensor restrict writable`, so one-shot bufferization
// sees a plain producer of a new tensor.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_KERNELBUILDER_H
#define MOE_LIB_CONVERSION_MOETOCPU_KERNELBUILDER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::moe::cpu {

/// f32 lanes of the vectors the kernels use (one AVX-512 register; two AVX2
/// registers after legalization elsewhere).
constexpr int64_t kLanes = 16;

/// Options shared by the kernels.
struct KernelOptions {
  /// Workers of the token/row loops: 1 = sequential scf.for; N > 1 = an
  /// scf.parallel over N workers (lowered by the pipeline onto the async
  /// runtime's thread pool).
  int64_t numThreads = 1;
};

class CK {
public:
  explicit CK(ImplicitLocOpBuilder &b) : b(b) {}
  ImplicitLocOpBuilder &b;

  Type f32() { return b.getF32Type(); }
  Type i32() { return b.getI32Type(); }
  Type i64() { return b.getI64Type(); }
  VectorType vf32(int64_t n = kLanes) { return VectorType::get({n}, f32()); }

  // Constants.
  Value idx(int64_t v);
  Value cI32(int64_t v);
  Value cI64(int64_t v);
  Value cF32(double v);
  Value cBool(bool v);
  /// A constant of `type` (scalar or vector of f32/iN): splat of `v`.
  Value constLike(Type type, double v);
  Value negInfLike(Type type);
  /// Broadcast of a scalar to vector<n x T>.
  Value splat(Value scalar, int64_t n);
  /// vector<n x T> holding base + [0, 1, ..., n-1] (T = index, i32 or i64).
  Value iota(Value base, int64_t n);

  // Integer/index arithmetic (scalars or vectors).
  Value add(Value x, Value y);
  Value sub(Value x, Value y);
  Value mul(Value x, Value y);
  Value divu(Value x, Value y);
  Value remu(Value x, Value y);
  Value ceilDiv(Value x, Value y);
  Value mins(Value x, Value y);
  Value maxs(Value x, Value y);
  Value cmpi(arith::CmpIPredicate p, Value x, Value y);
  Value andI(Value x, Value y);
  Value orI(Value x, Value y);
  Value xorI(Value x, Value y);
  Value notI1(Value x);
  Value shl(Value x, Value y);
  Value shrs(Value x, Value y);
  /// index <-> iN (signed) and iN <-> iM.
  Value castInt(Value x, Type to);

  // Float arithmetic (f32 scalars or vectors).
  Value fadd(Value x, Value y);
  Value fsub(Value x, Value y);
  Value fmul(Value x, Value y);
  Value fdiv(Value x, Value y);
  /// a * b + c, fused.
  Value fma(Value a, Value bv, Value c);
  /// NaN-propagating max/min.
  Value fmax(Value x, Value y);
  Value fmin(Value x, Value y);
  Value fabs(Value x);
  Value cmpf(arith::CmpFPredicate p, Value x, Value y);
  Value isNaN(Value x);
  Value select(Value c, Value x, Value y);
  Value sitofp(Value x);
  Value bitcast(Value x, Type to);
  /// exp(x) for f32 or vector<f32>: Cody-Waite range reduction and the
  /// Cephes degree-6 polynomial (about 1 ulp), 2^n applied in two halves so
  /// that subnormal results and overflow to +inf come out right; exp(-inf) =
  /// 0, exp(+inf) = +inf, exp(NaN) = NaN.
  Value exp(Value x);
  /// log(x) (math.log; only used per row, never in the hot loops).
  Value log(Value x);

  // Reductions of a vector to a scalar.
  Value sum(Value v);
  /// NaN-propagating max.
  Value maxf(Value v);
  Value maxsi(Value v);
  Value anyTrue(Value v);

  // Memory.
  Value dim(Value memref, int64_t d);
  Value load(Value memref, ValueRange indices);
  /// A scalar load widened to f32 (f16/bf16 -> f32).
  Value loadF(Value memref, ValueRange indices);
  void store(Value v, Value memref, ValueRange indices);
  /// vector<n x f32> from a memref whose last dimension is contiguous
  /// (f16/bf16 widened).
  Value vload(Value memref, ValueRange indices, int64_t n = kLanes);
  /// The same with lanes >= `count` (an index) replaced by `pad`; never reads
  /// past `count` lanes.
  Value vloadMasked(Value memref, ValueRange indices, Value count, double pad,
                    int64_t n = kLanes);
  void vstore(Value v, Value memref, ValueRange indices);
  /// Stores the first `count` lanes of `v` only.
  void vstoreMasked(Value v, Value memref, ValueRange indices, Value count);

  // Control flow.
  void forLoop(Value lb, Value ub, Value step,
               function_ref<void(Value iv)> body);
  SmallVector<Value>
  forLoop(Value lb, Value ub, Value step, ValueRange init,
          function_ref<SmallVector<Value>(Value iv, ValueRange args)> body);
  void ifThen(Value cond, function_ref<void()> then);
  SmallVector<Value> ifElse(Value cond, TypeRange types,
                            function_ref<SmallVector<Value>()> then,
                            function_ref<SmallVector<Value>()> otherwise);

  /// Runs `body(item, worker)` for every item in [0, numItems). With
  /// opts.numThreads = N > 1 this is an scf.parallel over min(N, numItems)
  /// workers, worker w taking the items w, w + N, w + 2N, ... (cyclic, so
  /// that triangular (causal) work stays balanced); every item is processed
  /// by exactly one worker, start to end, so results never depend on N.
  /// `worker` (index, < opts.numThreads) selects the worker's slice of
  /// scratch buffers made by `scratch`.
  void workers(const KernelOptions &opts, Value numItems,
               function_ref<void(Value item, Value worker)> body);
  /// A scratch buffer with one `type` slice per worker: [numThreads, ...].
  /// (Heap, freed by the deallocation pipeline: per-worker allocas would
  /// need a memref.alloca_scope around loops, which scf-to-cf cannot lower.)
  Value scratch(const KernelOptions &opts, MemRefType type,
                ValueRange dynamicSizes);
  /// Worker `w`'s slice of a scratch buffer (rank-reducing subview).
  Value workerSlice(Value scratch, Value w);

  // Buffers.
  /// The buffer of an input tensor (read-only, identity layout).
  Value buffer(Value tensor);
  /// A new 64-byte aligned buffer of `type` (dynamic sizes in order).
  Value alloc(MemRefType type, ValueRange dynamicSizes);
  /// The tensor of a buffer the kernel wrote.
  Value tensor(Value buffer);
  /// Dynamic sizes of `shape` as values (for alloc) taken from `sizes`.
  static SmallVector<Value> dynamicSizes(ArrayRef<int64_t> shape,
                                         ArrayRef<Value> sizes);
};

/// Rounds `x` (index) up to a multiple of `m`.
Value roundUp(CK &k, Value x, int64_t m);

/// Monotone i32 key of an f32: -inf < ... < -0 == +0 < ... < +inf < NaN.
/// Works lane-wise on vectors.
Value orderedKey(CK &k, Value f);
/// (key, index) packed into an i64 such that a larger value ranks first in
/// the dialect's top-k order: larger key, then lower index.
Value packCandidate(CK &k, Value key, Value index);
/// The index (i32) of a packed candidate.
Value candidateIndex(CK &k, Value packed);

} // namespace mlir::moe::cpu

#endif // MOE_LIB_CONVERSION_MOETOCPU_KERNELBUILDER_H
