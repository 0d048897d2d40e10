//===- Builder.h - The target-neutral kernel builder ------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The one builder under every kernel of the project (as Triton's backends
// share one LLVM-building helper): arith, math, memref and scf on an
// ImplicitLocOpBuilder. Every helper accepts a scalar or a vector of it (a
// CPU kernel computes on vector lanes, a GPU kernel on one thread's scalars),
// so an algorithm written over `KernelBuilder &` (lib/Kernels: the top-k
// ordering key and weights) is instantiated by both conversions. Targets derive
// from it: cpu_lowering::CpuKernelBuilder (vectors, reductions, the worker
// loop) and gpu_lowering::GpuKernelBuilder (thread ids, shuffles, barriers);
// `exp` is the one target hook (a polynomial on CPU vectors, math.exp ->
// __nv_expf on the GPU).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_BUILDER_H
#define MOE_KERNELS_BUILDER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

namespace mlir::moe::kernels {

class KernelBuilder {
public:
  explicit KernelBuilder(ImplicitLocOpBuilder &b) : b(b) {}
  virtual ~KernelBuilder() = default;
  ImplicitLocOpBuilder &b;

  Type f32() { return b.getF32Type(); }
  Type i32() { return b.getI32Type(); }
  Type i64() { return b.getI64Type(); }
  Type index() { return b.getIndexType(); }
  /// `elt`, or a vector of it shaped like `like` when `like` is a vector.
  static Type shapedLike(Type like, Type elt);

  // Constants.
  Value idx(int64_t v);
  Value cI32(int64_t v);
  Value cI64(int64_t v);
  Value cF32(double v);
  Value cBool(bool v);
  /// A constant of `type` (scalar or vector of f32/iN/index): splat of `v`.
  Value constLike(Type type, double v);
  Value negInfLike(Type type);
  /// `scalar` as is when `like` is a scalar type, else broadcast to the
  /// vector type `like`'s shape (an operand already of that type is returned
  /// as is).
  Value broadcastLike(Value scalar, Type like);

  // Two-operand arithmetic (scalars or vectors), one arith op each: integer
  // and index (add .. shru: unsigned divu/remu/ceilDiv/minu/shru, signed
  // mins/maxs/shrs), f32 (fadd .. fmin; fmax/fmin NaN-propagating, torch.max
  // semantics).
#define MOE_KERNEL_BINARY_OPS(X)                                               \
  X(add, AddIOp) X(sub, SubIOp) X(mul, MulIOp) X(divu, DivUIOp)                \
  X(remu, RemUIOp) X(ceilDiv, CeilDivUIOp) X(mins, MinSIOp) X(maxs, MaxSIOp)   \
  X(minu, MinUIOp) X(andI, AndIOp) X(orI, OrIOp) X(xorI, XOrIOp)               \
  X(shl, ShLIOp) X(shrs, ShRSIOp) X(shru, ShRUIOp) X(fadd, AddFOp)             \
  X(fsub, SubFOp) X(fmul, MulFOp) X(fdiv, DivFOp) X(fmax, MaximumFOp)          \
  X(fmin, MinimumFOp)
#define MOE_KERNEL_BINARY_OP(name, Op)                                         \
  Value name(Value x, Value y) { return arith::Op::create(b, x, y); }
  MOE_KERNEL_BINARY_OPS(MOE_KERNEL_BINARY_OP)
#undef MOE_KERNEL_BINARY_OP

  // Integer/index comparisons and casts (scalars or vectors).
  Value cmpi(arith::CmpIPredicate p, Value x, Value y);
  Value lt(Value x, Value y) { return cmpi(arith::CmpIPredicate::slt, x, y); }
  Value eq(Value x, Value y) { return cmpi(arith::CmpIPredicate::eq, x, y); }
  Value notI1(Value x);
  /// index <-> iN and iN <-> iM, signed.
  Value castInt(Value x, Type to);
  /// The integer `x` (a scalar or a vector) as an element of `memref`'s
  /// element type: an index result may be written as i64 (moe.topk_renorm,
  /// moe.route) where the kernels compute i32 (sign-extended; none where the
  /// types agree, so an i32 result's code is unchanged).
  Value asElementOf(Value x, Value memref);
  Value extu(Value x, Type to);
  Value trunc(Value x, Type to);

  // Float (f32 scalars or vectors).
  Value fabs(Value x);
  Value cmpf(arith::CmpFPredicate p, Value x, Value y);
  Value isNaN(Value x);
  /// a * b + c with one rounding (vector.fma on vectors, math.fma on
  /// scalars: both become llvm.fma, an FMA instruction on every target).
  Value fma(Value a, Value bv, Value c);
  Value select(Value c, Value x, Value y);
  /// num / den, and 0 where den == 0 (a renormalization over a selection of
  /// zeros or none: no NaN). num and den have one type.
  Value divOrZero(Value num, Value den);
  /// Signed integer (index, iN, or vectors of them) to f32.
  Value sitofp(Value x);
  Value bitcast(Value x, Type to);
  /// exp(x): the target's hook (default math.exp).
  virtual Value exp(Value x);
  /// exp(d) as a softmax weight (d = x - max or x - lse <= 0): the target's
  /// hook, exp(d) by default. A target whose arithmetic slows down on
  /// subnormal operands may return 0 where exp(d) is subnormal: such a weight
  /// changes no sum it enters, next to the row's largest weight, 1.
  virtual Value softmaxWeight(Value d) { return exp(d); }
  Value log(Value x);

  // Memory.
  Value dim(Value memref, int64_t d);
  /// Loads one element as is.
  Value load(Value memref, ValueRange indices);
  /// Loads one element widened to f32 (f16/bf16 -> f32).
  Value loadF(Value memref, ValueRange indices);
  void store(Value v, Value memref, ValueRange indices);

  // Structured control flow.
  void forLoop(Value lb, Value ub, Value step,
               function_ref<void(Value iv)> body);
  /// scf.for with loop-carried values; `body` returns the next values.
  SmallVector<Value>
  forLoop(Value lb, Value ub, Value step, ValueRange init,
          function_ref<SmallVector<Value>(Value iv, ValueRange args)> body);
  void ifThen(Value cond, function_ref<void()> then);
  void ifThenElse(Value cond, function_ref<void()> then,
                  function_ref<void()> otherwise);
  SmallVector<Value> ifElse(Value cond, TypeRange types,
                            function_ref<SmallVector<Value>()> then,
                            function_ref<SmallVector<Value>()> otherwise);
};

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_BUILDER_H
