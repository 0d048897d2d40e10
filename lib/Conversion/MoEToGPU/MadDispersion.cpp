//===- MadDispersion.cpp - moe.mad_dispersion on the GPU ------------------===//
//
// Part of the MoE-MLIR project.
//
// Deterministic segmented two-pass reduction, no float atomics:
//
//  1. mad_count: a thread per token checks assign[t] (an out-of-range value
//     is skipped and recorded in the device error word) and counts it with an
//     i32 atomic (exact, so deterministic).
//  2. mad_chunk_sums (twice): grid (ceil(D/128), ceil(T/256)); thread q of
//     chunk c walks the chunk's 256 tokens in order and accumulates x[t,q]
//     (pass 1) or |x[t,q] - μ[a,q]| / (x - μ)² (pass 2) into its own column of
//     partial[c, assign[t], :]: every partial has one writer, in token order.
//  3. mad_finish_mean / mad_finish_dispersion: a thread per (k, q) sums the
//     chunk partials in chunk order: μ = Σ/count (0 when empty), then
//     W = 1 / (Σ/count + eps).
//  4. mad_epilogue: one block of 256 threads: the clip against the mean of
//     W over the included entries and the mean-1 rescale (feature columns,
//     expert rows or global), with fixed-order block reductions; clusters
//     with fewer than 2 tokens get W = 1 for empty = identity.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Reductions.h"
#include "Lowerings.h"
#include "MoE/Kernels/IndexErrors.h"
#include "MoE/Kernels/SegmentedStats.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

static constexpr int64_t kChunkTokens = 256;
static constexpr int64_t kEpilogueThreads = 256;

/// Cluster of token t as index, and whether it is in [0, E).
static std::pair<Value, Value> clusterOf(GpuKernelBuilder &kb, Value assign,
                                         Value t, int64_t E) {
  Value a = kb.castInt(kb.load(assign, {t}), kb.i64());
  Value ok = idInRange(kb, a, kb.cI64(E));
  Value safe = kb.select(ok, a, kb.cI64(0));
  return {kb.castInt(safe, kb.index()), ok};
}

/// 4. Clip and normalization of the weights [E, D] (one block).
static void launchMadEpilogue(HostCode &h, MadDispersionOp op, Value weights,
                              Value counts) {
  const int64_t E = op.getNumExperts();
  const float clip = op.getClip().convertToFloat();
  const bool identity = op.getEmpty() == EmptyCluster::identity;
  const DispersionNormalize normalize = op.getNormalize();
  GpuKernelBuilder &kb = h.kb;
  Type f32 = h.b.getF32Type();
  Location loc = op.getLoc();
  const int64_t warps = kEpilogueThreads / kWarp;
  GPUKernel kernel(h, "mad_epilogue", {weights, counts},
                   {workgroupMemRef({warps}, f32)}, {kEpilogueThreads, 1, 1},
                   loc);
  GpuKernelBuilder &kk = kernel.kb;
  Value w = kernel.arg(0), cs = kernel.arg(1);
  Value scratch = kernel.workgroup(0);
  Value tid = kk.threadId();
  Value Dk = kk.dim(w, 1);
  Value step = kk.idx(kEpilogueThreads);
  Value zero = kk.cF32(0.0), one = kk.cF32(1.0);
  Value total = kk.mul(kk.idx(E), Dk);
  auto included = [&](Value e) -> Value {
    if (!identity)
      return kk.cBool(true);
    return kk.cmpi(arith::CmpIPredicate::sge, kk.load(cs, {e}), kk.cI32(2));
  };
  // Mean of W over the included entries of the flat range [0, E*D).
  auto includedMeanAll = [&]() -> Value {
    SmallVector<Value> part = kk.forLoop(
        tid, total, step, {zero, zero},
        [&](Value f, ValueRange acc) -> SmallVector<Value> {
          Value e = kk.divu(f, Dk), q = kk.remu(f, Dk);
          Value inc = included(e);
          return {kk.fadd(acc[0], kk.select(inc, kk.load(w, {e, q}), zero)),
                  kk.fadd(acc[1], kk.select(inc, one, zero))};
        });
    Value s =
        blockReduce(kk, part[0], ReduceKind::Sum, kEpilogueThreads, scratch);
    Value n =
        blockReduce(kk, part[1], ReduceKind::Sum, kEpilogueThreads, scratch);
    return kk.fdiv(s, n);
  };
  if (clip > 0.0f) {
    Value cap = kk.fmul(kk.cF32(clip), includedMeanAll());
    kk.forLoop(tid, total, step, [&](Value f) {
      Value e = kk.divu(f, Dk), q = kk.remu(f, Dk);
      kk.store(kk.fmin(kk.load(w, {e, q}), cap), w, {e, q});
    });
    kk.barrier();
  }
  auto rescale = [&](Value e, Value q, Value scale) {
    Value inc = included(e);
    kk.store(kk.select(inc, kk.fdiv(kk.load(w, {e, q}), scale), one), w,
             {e, q});
  };
  switch (normalize) {
  case DispersionNormalize::feature:
    kk.forLoop(tid, Dk, step, [&](Value q) {
      SmallVector<Value> sn = kk.forLoop(
          kk.idx(0), kk.idx(E), kk.idx(1), {zero, zero},
          [&](Value e, ValueRange acc) -> SmallVector<Value> {
            Value inc = included(e);
            return {kk.fadd(acc[0], kk.select(inc, kk.load(w, {e, q}), zero)),
                    kk.fadd(acc[1], kk.select(inc, one, zero))};
          });
      Value scale = kk.fdiv(sn[0], sn[1]);
      kk.forLoop(kk.idx(0), kk.idx(E), kk.idx(1),
                 [&](Value e) { rescale(e, q, scale); });
    });
    break;
  case DispersionNormalize::expert:
    kk.forLoop(kk.idx(0), kk.idx(E), kk.idx(1), [&](Value e) {
      Value s = kk.forLoop(tid, Dk, step, {zero},
                           [&](Value q, ValueRange acc) -> SmallVector<Value> {
                             return {kk.fadd(acc[0], kk.load(w, {e, q}))};
                           })[0];
      s = blockReduce(kk, s, ReduceKind::Sum, kEpilogueThreads, scratch);
      Value scale = kk.fdiv(s, kk.sitofp(Dk));
      kk.forLoop(tid, Dk, step, [&](Value q) { rescale(e, q, scale); });
    });
    break;
  case DispersionNormalize::global: {
    Value scale = includedMeanAll();
    kk.forLoop(tid, total, step, [&](Value f) {
      rescale(kk.divu(f, Dk), kk.remu(f, Dk), scale);
    });
    break;
  }
  }
  kernel.launch({kb.idx(1), kb.idx(1), kb.idx(1)});
}

template <>
LogicalResult
GPULowering<MadDispersionOp>::lower(MadDispersionOp op, OpAdaptor adaptor,
                                    ConversionPatternRewriter &rewriter) const {
  const int64_t E = op.getNumExperts();
  const float eps = op.getEps().convertToFloat();
  const bool variance = op.getMeasure() == DispersionMeasure::variance;
  Location loc = op.getLoc();

  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Type f32 = b.getF32Type();
  Value x = h.buffer(adaptor.getTokens());
  Value assign = h.buffer(adaptor.getAssign());
  auto weightsType = cast<RankedTensorType>(op.getWeights().getType());
  auto countsType = cast<RankedTensorType>(op.getCounts().getType());
  Value T = kb.dim(x, 0), D = kb.dim(x, 1);
  SmallVector<Value> wSizes;
  if (weightsType.isDynamicDim(1))
    wSizes.push_back(D);
  Value weights = h.allocLike(weightsType, wSizes);
  Value counts = h.allocLike(countsType, {});
  h.fill32(counts, kb.cI32(0));
  Value word = h.errorWord();
  Value chunks = kb.ceilDiv(T, kb.idx(kChunkTokens));
  auto dyn = ShapedType::kDynamic;
  Value partial = h.alloc(MemRefType::get({dyn, E, dyn}, f32), {chunks, D});
  Value means = h.alloc(MemRefType::get({E, dyn}, f32), {D});

  // 1. Counts and range checks.
  {
    GPUKernel kernel(h, "mad_count", {assign, counts, word}, {},
                     {kKernelThreads, 1, 1}, loc);
    GpuKernelBuilder &kk = kernel.kb;
    Value as = kernel.arg(0), cs = kernel.arg(1), w = kernel.arg(2);
    kernel.forItem(kk.dim(as, 0), [&](Value t) {
      auto [a, ok] = clusterOf(kk, as, t, E);
      kk.ifThen(ok, [&] {
        memref::AtomicRMWOp::create(kernel.b, arith::AtomicRMWKind::addi,
                                    kk.cI32(1), cs, ValueRange{a});
      });
      kk.ifThen(kk.notI1(ok), [&] {
        emitRecordIndexError(
            kk, w, kMoEErrorMadDispersionAssign, kk.castInt(t, kk.i64()),
            kk.castInt(kk.load(as, {t}), kk.i64()), kk.cI64(E));
      });
    });
    kernel.launchOver(T);
  }

  // 2-3. The two passes.
  auto chunkSums = [&](bool deviation) {
    GPUKernel kernel(h, deviation ? "mad_chunk_deviations" : "mad_chunk_sums",
                     {x, assign, means, partial}, {}, {kKernelThreads, 1, 1},
                     loc);
    GpuKernelBuilder &kk = kernel.kb;
    Value xs = kernel.arg(0), as = kernel.arg(1), mu = kernel.arg(2),
          part = kernel.arg(3);
    Value q = kernel.globalId();
    Value c = kk.blockId(gpu::Dimension::y);
    Value Tk = kk.dim(xs, 0), Dk = kk.dim(xs, 1);
    kk.ifThen(kk.lt(q, Dk), [&] {
      kk.forLoop(kk.idx(0), kk.idx(E), kk.idx(1), [&](Value e) {
        kk.store(kk.cF32(0.0), part, {c, e, q});
      });
      Value t0 = kk.mul(c, kk.idx(kChunkTokens));
      Value t1 = kk.minu(Tk, kk.add(t0, kk.idx(kChunkTokens)));
      kk.forLoop(t0, t1, kk.idx(1), [&](Value t) {
        auto [a, ok] = clusterOf(kk, as, t, E);
        kk.ifThen(ok, [&] {
          Value v = kk.loadF(xs, {t, q});
          if (deviation) {
            v = dispersionTerm(kk, v, kk.load(mu, {a, q}), variance);
          }
          kk.store(kk.fadd(kk.load(part, {c, a, q}), v), part, {c, a, q});
        });
      });
    });
    kernel.launch({kb.ceilDiv(D, kb.idx(kKernelThreads)), chunks, kb.idx(1)});
  };
  auto finish = [&](bool dispersion) {
    GPUKernel kernel(h,
                     dispersion ? "mad_finish_dispersion" : "mad_finish_mean",
                     {partial, counts, dispersion ? weights : means}, {},
                     {kKernelThreads, 1, 1}, loc);
    GpuKernelBuilder &kk = kernel.kb;
    Value part = kernel.arg(0), cs = kernel.arg(1), o = kernel.arg(2);
    Value Dk = kk.dim(part, 2), C = kk.dim(part, 0);
    Value flat = kernel.globalId();
    kk.ifThen(kk.lt(flat, kk.mul(kk.idx(E), Dk)), [&] {
      Value e = kk.divu(flat, Dk), q = kk.remu(flat, Dk);
      Value s = kk.forLoop(kk.idx(0), C, kk.idx(1), {kk.cF32(0.0)},
                           [&](Value c, ValueRange acc) -> SmallVector<Value> {
                             return {kk.fadd(acc[0], kk.load(part, {c, e, q}))};
                           })[0];
      Value mean = segmentMean(kk, s, kk.load(cs, {e}));
      if (dispersion)
        mean = dispersionWeight(kk, mean, eps);
      kk.store(mean, o, {e, q});
    });
    kernel.launchOver(kb.mul(kb.idx(E), D));
  };
  chunkSums(false);
  finish(false);
  chunkSums(true);
  finish(true);

  launchMadEpilogue(h, op, weights, counts);

  h.release(partial);
  h.release(means);
  h.finish(/*checkErrors=*/true);
  h.replace(op, {weights, counts});
  return success();
}
