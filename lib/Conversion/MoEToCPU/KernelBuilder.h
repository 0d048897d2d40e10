//===- KernelBuilder.h - Building blocks of the fast CPU kernels -*- C++
//-*-===//
//
// Part of the MoE-MLIR project.
//
// The kernels of convert-moe-to-cpu are written on memrefs with
// CpuKernelBuilder, the CPU instance of the project's one kernel builder
// (MoE/Kernels/Builder.h: the scalar-or-vector arithmetic, loads/stores and
// structured loops every target shares) plus what is CPU-only: vector loads
// that widen f16/bf16 to f32, a polynomial exp that vectorizes (math.exp on
// vectors becomes one libm call per lane), vector reductions, and the worker
// loop that spreads independent items (rows, row tiles, column blocks) over
// threads. Algorithms shared with the GPU kernels (the top-k order and weights)
// live in MoE/Kernels.
//
// A kernel is built inside a `moe.kernel` (KernelScope): the op's tensor
// operands it reads are the kernel's ins, its results are outs with
// `tensor.empty` destinations, and the body works on the block arguments, the
// buffers of both. One-shot bufferization, not the kernel, then decides where
// those buffers come from (an out may be written in place into the caller's
// buffer). Scratch memory of the kernel itself is memref.alloc.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_KERNELBUILDER_H
#define MOE_LIB_CONVERSION_MOETOCPU_KERNELBUILDER_H

#include "MoE/Kernels/Builder.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/PatternMatch.h"

#include <algorithm>

namespace mlir::moe::cpu_lowering {

/// f32 lanes of the vectors the kernels use by default (one AVX-512
/// register). A builder made from KernelOptions uses the target's width
/// instead (KernelOptions::lanes: 8 for AVX2); kernels that are not
/// target-aware yet keep this one (two AVX2 registers after legalization).
constexpr int64_t kLanes = 16;
/// A dynamic size in the memref types the kernels build.
constexpr int64_t kDyn = ShapedType::kDynamic;

/// Options shared by the kernels.
struct KernelOptions {
  /// Workers of the token/row loops: 1 = sequential scf.for; N > 1 = an
  /// scf.parallel over N workers (lowered by the pipeline onto the async
  /// runtime's thread pool).
  int64_t numThreads = 1;
  /// Width of the target's vector registers in bits: 512 (AVX-512, the
  /// default) or 256 (AVX2); 128 is accepted (SSE, NEON) and uses 4 lanes.
  int64_t vectorBits = 512;
  /// f32 lanes of one register of the target.
  int64_t lanes() const { return std::max<int64_t>(vectorBits / 32, 4); }
};

/// The CPU instance of the kernel builder: kernels compute on vector lanes
/// (vector<16xf32>, vector<8xi64>) over memrefs, and spread independent items
/// over workers.
class CpuKernelBuilder : public kernels::KernelBuilder {
public:
  /// A builder with kLanes lanes.
  explicit CpuKernelBuilder(ImplicitLocOpBuilder &b)
      : kernels::KernelBuilder(b) {}
  /// A builder with the lanes of the target of `opts` (8 on AVX2, 16 on
  /// AVX-512).
  CpuKernelBuilder(ImplicitLocOpBuilder &b, const KernelOptions &opts)
      : kernels::KernelBuilder(b), lanes_(opts.lanes()) {}

  /// f32 lanes of this builder's vectors: the default `n` of vf32, vload and
  /// vloadMasked (n = 0).
  int64_t lanes() const { return lanes_; }
  /// Lanes of the packed (key, index) i64 candidates of the top-k kernels
  /// (MoE/Kernels/TopK.h): half as many as f32, one register of them. The
  /// candidate buffers a kernel lays out and bestCandidateBelow's chunks are
  /// both this size.
  int64_t candidateLanes() const { return lanes_ / 2; }

  VectorType vf32(int64_t n = 0) {
    return VectorType::get({n ? n : lanes_}, f32());
  }

  /// Broadcast of a scalar to vector<n x T>.
  Value splat(Value scalar, int64_t n);
  /// vector<n x T> holding base + [0, 1, ..., n-1] (T = index, i32 or i64).
  Value iota(Value base, int64_t n);
  /// vector.shuffle of two vectors of one type (mask indexes their
  /// concatenation).
  Value shuffle(Value a, Value c, ArrayRef<int64_t> mask);
  /// The concatenation of `parts` (vectors of one type, a power-of-two
  /// count): pairwise shuffles, which are free once the wide vector is
  /// legalized into the parts' registers.
  Value concat(ArrayRef<Value> parts);
  /// exp(x) for f32 or vector<f32>: Cody-Waite range reduction and the
  /// Cephes degree-6 polynomial (about 1 ulp), 2^n applied in two halves so
  /// that subnormal results and overflow to +inf come out right; exp(-inf) =
  /// 0, exp(+inf) = +inf, exp(NaN) = NaN.
  ///
  /// Kept rather than math.exp + upstream's polynomial approximation (which
  /// moe-approximate-vector-math would apply to vector exps): a sweep of
  /// every 64th f32 in [-110, 100] (35M inputs, vector<16xf32>, both lowered
  /// the same way, against f64 exp rounded to f32) gave upstream at most 5
  /// ulp (x in [88.63, 88.72], where it clamps 2^n to 2^127) against 1 here,
  /// and 33362 of the 34073 inputs with a subnormal result (x in [-103.97,
  /// -87.34]) flushed to 0, none here; NaN, +-inf and the clamps agree.
  /// (Upstream rounds better elsewhere, 0.8% of the inputs off by 1 ulp
  /// against 2.4% here, and took 1.38 against 1.47 ns per element, single
  /// thread, median of 7 interleaved runs on a loaded AMD EPYC, spread
  /// 1.0-1.7 and 1.3-2.5.)
  Value exp(Value x) override;
  /// exp(d), 0 where d < -87, i.e. where exp(d) would be below the smallest
  /// normal f32 (exp(-87.34)): a subnormal operand costs the x86 FMA units a
  /// microcode assist per instruction, and peaky logits (a spread of more
  /// than 87 within a row, e.g. u_i . u_j of unnormalised router inputs,
  /// whose diagonal dominates) made the similarity mix 1.5x slower through
  /// them (its backward 1.25x). NaN passes.
  Value softmaxWeight(Value d) override;
  /// x, 0 where |x| is below the smallest normal f32 (FLT_MIN).
  Value flushSubnormal(Value x);

  // Reductions of a vector to a scalar.
  Value sum(Value v);
  /// NaN-propagating max.
  Value maxf(Value v);
  Value maxsi(Value v);
  Value anyTrue(Value v);

  // Memory.
  /// vector<n x f32> from a memref whose last dimension is contiguous
  /// (f16/bf16 widened).
  Value vload(Value memref, ValueRange indices, int64_t n = 0);
  /// The same with lanes >= `count` (an index) replaced by `pad`; never reads
  /// past `count` lanes.
  Value vloadMasked(Value memref, ValueRange indices, Value count, double pad,
                    int64_t n = 0);
  void vstore(Value v, Value memref, ValueRange indices);
  /// Stores the first `count` lanes of `v` only.
  void vstoreMasked(Value v, Value memref, ValueRange indices, Value count);
  /// vload or vloadMasked, as `full` says: for code emitted twice, once for
  /// whole vectors (plain loads and stores) and once for the ragged tail.
  /// Masked stores are microcoded on AVX2 machines (VMASKMOVPS: 12-40 cycles
  /// on AMD Zen 2/3) and a later load of the same address cannot take its
  /// value from the store buffer, so a read-modify-write loop over masked
  /// vectors runs ~10x slower there than over plain ones.
  Value vloadPart(bool full, Value memref, ValueRange indices, Value count,
                  double pad, int64_t n = 0);
  void vstorePart(bool full, Value v, Value memref, ValueRange indices,
                  Value count);
  /// Emits `body(true)` under `full` (an i1) and `body(false)` otherwise.
  void splitFull(Value full, function_ref<void(bool)> body);

  /// Runs `body(item, worker)` for every item in [0, numItems). With
  /// opts.numThreads = N > 1 this is an scf.parallel over min(N, numItems)
  /// workers, worker w taking the items w, w + N, w + 2N, ... (cyclic, so
  /// that triangular (causal) work stays balanced); every item is processed
  /// by exactly one worker, start to end, so results never depend on N.
  /// `worker` (index, < opts.numThreads) selects the worker's slice of
  /// scratch buffers made by `scratch`.
  /// At most kInlineItems items (decode sizes) run on the calling thread:
  /// waking the pool costs more than the work. A kernel whose items are few
  /// but large (mad_dispersion's column blocks span every token) passes its
  /// own test instead: `runInline` (i1), true where the work is small.
  void workers(const KernelOptions &opts, Value numItems,
               function_ref<void(Value item, Value worker)> body,
               Value runInline = {});
  static constexpr int64_t kInlineItems = 4;
  /// Runs `body(r)` for every row r in [0, numRows), the rows dealt to the
  /// workers in blocks of `rowsPerItem` (workers' items).
  void workerRows(const KernelOptions &opts, Value numRows,
                  int64_t rowsPerItem, function_ref<void(Value row)> body);
  /// A scratch buffer with one `type` slice per worker: [numThreads, ...].
  /// (Heap, freed by the deallocation pipeline: per-worker allocas would
  /// need a memref.alloca_scope around loops, which scf-to-cf cannot lower.)
  Value scratch(const KernelOptions &opts, MemRefType type,
                ValueRange dynamicSizes);
  /// Worker `w`'s slice of a scratch buffer (rank-reducing subview).
  Value workerSlice(Value scratch, Value w);

  // Buffers.
  /// The buffer of `tensor`, an input of the kernel being built (KernelScope):
  /// its block argument (identity layout; read-only).
  Value buffer(Value tensor);
  /// A new 64-byte aligned buffer of `type` (dynamic sizes in order).
  Value alloc(MemRefType type, ValueRange dynamicSizes);
  /// Dynamic sizes of `shape` as values (for alloc) taken from `sizes`.
  static SmallVector<Value> dynamicSizes(ArrayRef<int64_t> shape,
                                         ArrayRef<Value> sizes);
  /// The sizes of a ranked tensor or memref, one index value per dimension
  /// (constants for the static ones).
  SmallVector<Value> sizes(Value shaped);

private:
  friend class KernelScope;
  int64_t lanes_ = kLanes;
  /// The inputs of the kernel being built and their buffers.
  const IRMapping *inputs_ = nullptr;
};

/// The moe.kernel (MoEKernelOp.td) a pattern builds its kernel in. Opening
/// one creates `moe.kernel ins(inputs) outs(tensor.empty ...)` at the
/// builder's insertion point and moves the builder into the body, where
/// CpuKernelBuilder::buffer gives the inputs' buffers and out() the results';
/// replace() leaves the body and replaces the op by the kernel's results.
class KernelScope {
public:
  /// A result: its tensor type and its sizes (index values made before the
  /// scope, one per dimension; static dimensions are not read).
  struct Out {
    Type type;
    SmallVector<Value> sizes;
  };
  /// `inputs`: the tensors the kernel reads (null ones are left out).
  KernelScope(CpuKernelBuilder &kb, ArrayRef<Value> inputs, ArrayRef<Out> outs);
  /// Outs shaped like the results of `op` with the sizes `sizes` (one list
  /// per result).
  static SmallVector<Out> outsOf(Operation *op,
                                 ArrayRef<SmallVector<Value>> sizes);
  /// The kernel of a backward op whose result i is the gradient of
  /// params[i] (shaped like it): it reads `params`, then `others` (the
  /// cotangents and the other operands).
  static KernelScope gradientsOf(CpuKernelBuilder &kb, Operation *op,
                                 ArrayRef<Value> params,
                                 ArrayRef<Value> others);
  // Opened once: the builder has been moved into the body.
  KernelScope(const KernelScope &) = delete;
  KernelScope &operator=(const KernelScope &) = delete;
  /// The buffer of out `i` inside the body, and all of them.
  Value out(unsigned i) const;
  ValueRange outs() const;
  /// Leaves the body (the builder continues after the moe.kernel) and
  /// returns the kernel's results.
  ValueRange finish();
  /// finish() and replace the results of `op` by the kernel's, in order.
  void replace(RewriterBase &rw, Operation *op);

private:
  CpuKernelBuilder &kb;
  Operation *kernel;
  IRMapping inputs;
  OpBuilder::InsertPoint after;
};

/// One round of the top-k kernels: the largest packed i64 candidate
/// (MoE/Kernels/TopK.h: bestBelow) of the vector<candidateLanes() x i64> chunks
/// [c0, c1) of `cand` that ranks strictly below `prev` (i64), among the lanes
/// `laneMask(base)` (an i1 vector of candidateLanes() for the chunk at element
/// `base`; null: all lanes); noCandidate when there is none. `cand` is laid out
/// in chunks of k.candidateLanes().
Value bestCandidateBelow(CpuKernelBuilder &kb, Value cand, Value c0, Value c1,
                         Value prev,
                         function_ref<Value(Value base)> laneMask = nullptr);

/// Rounds `x` (index) up to a multiple of `m`.
Value roundUp(CpuKernelBuilder &kb, Value x, int64_t m);

/// memref [d0, ..., d{n-2}, X] -> [d0 * ... * d{n-2}, X] (no-op for rank 2).
Value collapseRows(CpuKernelBuilder &kb, Value buffer);

} // namespace mlir::moe::cpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOCPU_KERNELBUILDER_H
