//===- AttentionPosterior.cpp - moe.attention_posterior on the GPU --------===//
//
// Part of the MoE-MLIR project.
//
// head_select = min_entropy, in four kernels on one stream:
//
//  1. attention_entropy: grid (ceil(N/16), H, B), a warp per query row (4
//     rows each), one pass over the scores with an online max: Z = Σ exp(s -
//     max) and A = Σ exp(s - max)(s - max) (masked keys skipped: 0 log 0 =
//     0), so the row entropy is log Z - A / Z; rows whose keys are all masked
//     are left out. Each block writes its partial (sum, count) per (b, h) in
//     a fixed warp order: no atomics, deterministic.
//  2. attention_head_select: a thread per sequence sums the partials in
//     order, takes the mean per head and the argmin (lowest head on ties, a
//     NaN mean counts as the minimum) and writes head[b].
//  3. attention_head_means: a block per 8 keys of a sequence b forms
//     m_j = head_scale · v[b,h*,j,:] · wo[:, h*·Dh:(h*+1)·Dh]^T and the bias
//     -‖m_j‖² / (2σ²), reading h* from device memory; wo's slice staged
//     through shared memory once for the block's keys.
//  4. the flash mixing kernel (FlashMix.cpp) with q = u, keys = m,
//     divisor σ², the bias and the scores of head h* added to the logits,
//     and for attention_posterior_topk the top-k in its epilogue.
//     With u, e f16/bf16 of one type, the tensor-core form of that kernel
//     (FlashMma.cpp; the _topk form too), on means that kernel 3 writes in
//     the operand type (1.7x the scalar kernel on the H200, 2026-11-26).
//
// head_select = all is not lowered to the GPU yet (the op reports it).
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"
#include "HostCode.h"
#include "Reductions.h"
#include "Lowerings.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

static constexpr int64_t kEntropyRowsPerBlock = 16;
static constexpr int64_t kEntropyThreads = 128;
// The head means: a block's keys, its threads (a feature each, the features
// taken kMeansThreads at a time) and the head's columns a step. 16 keys a
// block needed 88 registers where ptxas unrolls a static D = 256 (it took 72
// and spilled on sm_80); 8 take 40-64 and read wo twice as often, which at
// 128 bytes a warp load is still a small share of the kernel.
static constexpr int64_t kMeansKeys = 8;
static constexpr int64_t kMeansThreads = 128;
static constexpr int64_t kMeansCols = 32;

/// Kernel 1: partial entropy sums and valid-row counts per (b, h, block)
/// into sums and counts [B, H, blocks]; `grid` = (blocks, H, B).
///
/// A warp takes a row in one pass over its scores: each lane keeps the
/// online state (m, z, a) of its scores, z = Σ e^(s - m) and
/// a = Σ e^(s - m)(s - m) over the unmasked ones, taking 4 scores a step (4
/// coalesced loads, then one rescale to the step's max); a butterfly merges
/// the lanes' states, and the row's entropy is log z - a / z (-Σ q log q with
/// q = e^(s - m) / z). The scores are the op's largest operand (B·H·N·Nk):
/// read once, not once for the max and again for the sums. SASS, sm_90 and
/// sm_80, Nk = 1024: 10.6 instructions a score in the row loop (the two-pass
/// kernel before it: 4.25 in its max loop and 17.25 in its sum loop, where
/// __nv_expf took 8).
static void launchEntropy(HostCode &host, Value scoresBuf, Value sumsBuf,
                          Value countsBuf, std::array<Value, 3> grid,
                          Location loc) {
  const int64_t warps = kEntropyThreads / kWarp;
  constexpr int64_t kPerLane = 4;
  Type f32 = host.b.getF32Type();
  GPUKernel kernel(
      host, "attention_entropy", {scoresBuf, sumsBuf, countsBuf},
      {workgroupMemRef({warps}, f32), workgroupMemRef({warps}, f32)},
      {kEntropyThreads, 1, 1}, loc);
  GpuKernelBuilder &kb = kernel.kb;
  Value scores = kernel.arg(0), sums = kernel.arg(1), counts = kernel.arg(2);
  Value wg[] = {kernel.workgroup(0), kernel.workgroup(1)};
  Value zero = kb.cF32(0.0), one = kb.cF32(1.0);
  Value negInf = kb.cF32(-std::numeric_limits<double>::infinity());
  Value tid = kb.threadId();
  Value warp = kb.divu(tid, kb.idx(kWarp));
  Value lane = kb.remu(tid, kb.idx(kWarp));
  Value chunk = kb.blockId(), h = kb.blockId(gpu::Dimension::y),
        b = kb.blockId(gpu::Dimension::z);
  Value N = kb.dim(scores, 2), Nk = kb.dim(scores, 3);
  const int64_t rowsPerWarp = kEntropyRowsPerBlock / warps;
  // The shift a state moves to: its max, or 0 where every score so far is
  // masked (-inf - -inf would be NaN).
  auto shiftOf = [&](Value m) {
    return kb.select(kb.cmpf(arith::CmpFPredicate::OEQ, m, negInf), zero, m);
  };
  // The weights are powers of 2 on the SFU (one MUFU.EX2 each, where
  // __nv_expf is 8 instructions): e^d = 2^(d log2 e), so a holds its sum in
  // log2 units, Σ e^d (d log2 e). d = s - shift is formed first (exact for
  // the scores near the max, where the weights are large) and then scaled.
  Value log2e = kb.cF32(1.4426950408889634);
  // (z, a) of a state (m, z, a) moved to the shift `to` >= m: both times
  // e^(m - to), a plus z (m - to) log2 e first (0 where z is: m may be
  // -inf).
  auto moved = [&](Value m, Value z, Value a,
                   Value to) -> std::pair<Value, Value> {
    Value diff = kb.fmul(kb.fsub(m, to), log2e);
    Value r = exp2Approx(kernel.b, diff);
    Value za = kb.select(kb.cmpf(arith::CmpFPredicate::OGT, z, zero),
                         kb.fmul(z, diff), zero);
    return {kb.fmul(r, z), kb.fmul(r, kb.fadd(a, za))};
  };
  // (One op a statement here and below where a call takes two: in the order
  // the plain (gcc) build has always emitted them; as arguments of one call
  // the order would be the C++ compiler's, and gcc and clang differ.)
  Value warpFirst = kb.mul(warp, kb.idx(rowsPerWarp));
  Value first =
      kb.add(kb.mul(chunk, kb.idx(kEntropyRowsPerBlock)), warpFirst);
  Value last = kb.minu(N, kb.add(first, kb.idx(rowsPerWarp)));
  SmallVector<Value> partial = kb.forLoop(
      first, last, kb.idx(1), {zero, zero},
      [&](Value i, ValueRange acc) -> SmallVector<Value> {
        SmallVector<Value> st = kb.forLoop(
            kb.idx(0), Nk, kb.idx(kWarp * kPerLane), {negInf, zero, zero},
            [&](Value j0, ValueRange st) -> SmallVector<Value> {
              Value base = kb.add(j0, lane);
              Value c0 = kb.idx(0);
              SmallVector<Value> s;
              for (int64_t k = 0; k < kPerLane; ++k) {
                Value j = kb.add(base, kb.idx(k * kWarp));
                Value ok = kb.lt(j, Nk);
                Value x = kb.loadF(scores, {b, h, i, kb.select(ok, j, c0)});
                s.push_back(kb.select(ok, x, negInf));
              }
              Value top = st[0];
              for (Value x : s)
                top = kb.fmax(top, x);
              Value to = shiftOf(top);
              auto [z, a] = moved(st[0], st[1], st[2], to);
              for (Value x : s) {
                Value d = kb.fmul(kb.fsub(x, to), log2e);
                Value p = exp2Approx(kernel.b, d);
                Value masked = kb.cmpf(arith::CmpFPredicate::OEQ, x, negInf);
                z = kb.fadd(z, p);
                a = kb.select(masked, a, kb.fma(p, d, a));
              }
              return {top, z, a};
            });
        // The lanes' states merged by a butterfly (every lane gets the
        // row's).
        Value m = st[0], z = st[1], a = st[2];
        for (int64_t offset = 1; offset < kWarp; offset *= 2) {
          Value mo = kb.shuffleXor(m, offset);
          Value zo = kb.shuffleXor(z, offset);
          Value ao = kb.shuffleXor(a, offset);
          Value top = kb.fmax(m, mo);
          Value to = shiftOf(top);
          auto [z1, a1] = moved(m, z, a, to);
          auto [z2, a2] = moved(mo, zo, ao, to);
          m = top;
          z = kb.fadd(z1, z2);
          a = kb.fadd(a1, a2);
        }
        // ln z - (Σ p d) / z, the second sum in log2 units.
        Value mean = kb.fmul(kb.fdiv(a, z), kb.cF32(0.6931471805599453));
        Value ent = kb.fsub(kb.log(z), mean);
        Value valid = kb.cmpf(arith::CmpFPredicate::UNE, m, negInf);
        return {kb.fadd(acc[0], kb.select(valid, ent, zero)),
                kb.fadd(acc[1], kb.select(valid, one, zero))};
      });
  kb.ifThen(kb.eq(lane, kb.idx(0)), [&] {
    kb.store(partial[0], wg[0], {warp});
    kb.store(partial[1], wg[1], {warp});
  });
  kb.barrier();
  kb.ifThen(kb.eq(tid, kb.idx(0)), [&] {
    Value s = kb.load(wg[0], {kb.idx(0)}), c = kb.load(wg[1], {kb.idx(0)});
    for (int64_t w = 1; w < warps; ++w) {
      s = kb.fadd(s, kb.load(wg[0], {kb.idx(w)}));
      c = kb.fadd(c, kb.load(wg[1], {kb.idx(w)}));
    }
    kb.store(s, sums, {b, h, chunk});
    kb.store(c, counts, {b, h, chunk});
  });
  kernel.launch(grid);
}

/// Kernel 2: h*[b] = argmin_h mean entropy (a thread per sequence, of
/// `sequences`).
static void launchHeadSelect(HostCode &h, Value sumsBuf, Value countsBuf,
                             Value headBuf, Value sequences, Location loc) {
  GPUKernel kernel(h, "attention_head_select", {sumsBuf, countsBuf, headBuf},
                   {}, {kWarp, 1, 1}, loc);
  GpuKernelBuilder &kb = kernel.kb;
  Value sums = kernel.arg(0), counts = kernel.arg(1), head = kernel.arg(2);
  Value B = kb.dim(sums, 0), H = kb.dim(sums, 1), C = kb.dim(sums, 2);
  Value zero = kb.cF32(0.0);
  kernel.forItem(B, [&](Value b) {
    SmallVector<Value> best = kb.forLoop(
        kb.idx(0), H, kb.idx(1), {zero, kb.idx(0)},
        [&](Value h, ValueRange acc) -> SmallVector<Value> {
          SmallVector<Value> sc =
              kb.forLoop(kb.idx(0), C, kb.idx(1), {zero, zero},
                        [&](Value c, ValueRange a) -> SmallVector<Value> {
                          return {kb.fadd(a[0], kb.load(sums, {b, h, c})),
                                  kb.fadd(a[1], kb.load(counts, {b, h, c}))};
                        });
          Value mean = kb.divOrZero(sc[0], sc[1]);
          Value isFirst = kb.eq(h, kb.idx(0));
          Value bestNan = kb.cmpf(arith::CmpFPredicate::UNO, acc[0], acc[0]);
          Value meanNan = kb.cmpf(arith::CmpFPredicate::UNO, mean, mean);
          Value less = kb.cmpf(arith::CmpFPredicate::OLT, mean, acc[0]);
          Value better = kb.orI(meanNan, less);
          Value take = kb.orI(isFirst, kb.andI(kb.notI1(bestNan), better));
          return {kb.select(take, mean, acc[0]), kb.select(take, h, acc[1])};
        });
    kb.store(kb.castInt(best[1], kb.i32()), head, {b});
  });
  kernel.launchOver(sequences);
}

/// Kernel 3: head means m[b,j,:] and bias[b,j] = -‖m_j‖² / (2σ²).
///
/// A block takes kMeansKeys keys of one sequence and every output feature d,
/// kMeansThreads at a time (a thread a feature), over the head's Dh columns
/// kMeansCols at a time. Each step stages wo[d0 .., colBase + c0 ..]
/// transposed into shared memory (a warp reads one row's 32 consecutive
/// columns: one coalesced load) and the keys' v columns beside it, then a
/// thread takes its feature's column of wo once a column for all the block's
/// keys (8 FMAs a shared load of wo, the keys' values in 2 16-byte shared
/// loads). Then the wo slice is read from L2 once per kMeansKeys keys, in
/// whole lines; a block a key with a thread a feature (before) read it once a
/// key, each load of a warp touching 32 lines (a row of wo each): one L1
/// wavefront a thread and column, the kernel's whole cost at B = 16, Nk =
/// 1024, D = 256, Dh = 64 (~268M wavefronts, about 1.1 ms on an H100's 132
/// multiprocessors).
///
/// A feature's dot product adds its columns in order (c = 0 .. Dh - 1, one
/// FMA each); the bias's sum of squares adds, per warp, its steps' butterflies
/// over the lanes in order, then the warps in warp order: deterministic.
void mlir::moe::gpu_lowering::launchHeadMeans(HostCode &host, Value vBuf,
                                              Value woBuf, Value headBuf,
                                              Value meansBuf, Value biasBuf,
                                              std::optional<double> headScale,
                                              double sigma, Location loc) {
  constexpr int64_t warps = kMeansThreads / kWarp;
  constexpr int64_t keysPerWarp = kMeansKeys / warps;
  static_assert(kMeansCols == kWarp, "a warp stages one row's columns");
  static_assert(kMeansKeys % (2 * warps) == 0 && kMeansKeys % 4 == 0);
  Type f32 = host.b.getF32Type();
  GPUKernel kernel(
      host, "attention_head_means", {vBuf, woBuf, headBuf, meansBuf, biasBuf},
      {// wo's chunk transposed, [c][d] (a row pads the stores' banks apart)
       workgroupMemRef({kMeansCols, kMeansThreads + 1}, f32),
       // the keys' v columns, [c][key]: a column's keys in 16-byte loads
       workgroupMemRef({kMeansCols, kMeansKeys}, f32),
       // the warps' partial sums of squares, [warp][key]
       workgroupMemRef({warps, kMeansKeys}, f32)},
      {kMeansThreads, 1, 1}, loc);
  // The keys' columns are read 16 bytes at a time.
  alignWorkgroupBuffers(kernel.func);
  GpuKernelBuilder &kb = kernel.kb;
  ImplicitLocOpBuilder &b = kernel.b;
  Value v = kernel.arg(0), wo = kernel.arg(1), head = kernel.arg(2),
        m = kernel.arg(3), bias = kernel.arg(4);
  Value woT = kernel.workgroup(0), vT = kernel.workgroup(1),
        partial = kernel.workgroup(2);
  Value tid = kb.threadId();
  Value lane = kb.remu(tid, kb.idx(kWarp));
  Value warp = kb.divu(tid, kb.idx(kWarp));
  Value j0 = kb.mul(kb.blockId(), kb.idx(kMeansKeys));
  Value bi = kb.blockId(gpu::Dimension::y);
  Value h = kb.castInt(kb.load(head, {bi}), kb.index());
  Value Nk = kb.dim(v, 2), Dh = kb.dim(v, 3), D = kb.dim(wo, 0);
  Value scale = headScale ? kb.cF32(*headScale) : kb.sitofp(kb.dim(v, 1));
  Value colBase = kb.mul(h, Dh);
  Value zero = kb.cF32(0.0), c0i = kb.idx(0);
  Type meanElt = cast<MemRefType>(m.getType()).getElementType();
  auto vec4 = VectorType::get({4}, f32);

  // The warps' partial sums of squares start at 0 (before any warp adds).
  kb.ifThen(kb.lt(tid, kb.idx(warps * kMeansKeys)), [&] {
    Value w = kb.divu(tid, kb.idx(kMeansKeys));
    Value jj = kb.remu(tid, kb.idx(kMeansKeys));
    kb.store(zero, partial, {w, jj});
  });
  kb.barrier();
  kb.forLoop(
      c0i, D, kb.idx(kMeansThreads), [&](Value d0) {
        SmallVector<Value> acc0(kMeansKeys, zero);
        SmallVector<Value> acc = kb.forLoop(
            c0i, Dh, kb.idx(kMeansCols), acc0,
            [&](Value c0, ValueRange accIn) -> SmallVector<Value> {
              // The previous step's reads of the buffers are done.
              kb.barrier();
              Value col = kb.add(c0, lane);
              Value colOk = kb.lt(col, Dh);
              // wo rows d0 + r, r = warp + 4 i, and the keys' columns, key
              // warp + 4 i; lane = column. In two rounds, each issuing its
              // 17 loads before its first store (a round trip to L2 a
              // round, not one a row, and fewer values live than all 34 at
              // once). A bound's loads read element 0 and store zeros.
              Value woCol = kb.add(colBase, col);
              constexpr int64_t rounds = 2;
              constexpr int64_t rowsPerRound = kMeansThreads / warps / rounds;
              constexpr int64_t keysPerRound = keysPerWarp / rounds;
              // A load in flight: its value, whether it was in bounds, and
              // where it goes (shared row `lane`, column r of `buf`).
              struct Staged {
                Value x, ok, buf, r;
              };
              for (int64_t round = 0; round < rounds; ++round) {
                SmallVector<Staged> staged;
                // The round's rows of wo's chunk (r: feature d0 + r), then
                // its keys (r: key j0 + r).
                for (int64_t i = 0; i < rowsPerRound + keysPerRound; ++i) {
                  bool isKey = i >= rowsPerRound;
                  int64_t per = isKey ? keysPerRound : rowsPerRound;
                  int64_t n = isKey ? i - rowsPerRound : i;
                  Value r = kb.add(warp, kb.idx(warps * (round * per + n)));
                  Value item = kb.add(isKey ? j0 : d0, r);
                  Value ok = kb.andI(kb.lt(item, isKey ? Nk : D), colOk);
                  Value x =
                      isKey ? kb.loadF(v, {bi, h, kb.select(ok, item, c0i),
                                           kb.select(ok, col, c0i)})
                            : kb.loadF(wo, {kb.select(ok, item, c0i),
                                            kb.select(ok, woCol, c0i)});
                  staged.push_back({x, ok, isKey ? vT : woT, r});
                }
                for (const Staged &l : staged)
                  kb.store(kb.select(l.ok, l.x, zero), l.buf, {lane, l.r});
              }
              kb.barrier();
              // Past Dh the staged columns are zeros: the whole chunk is
              // added (0 · 0), so the loop has a constant trip count.
              return kb.forLoop(
                  c0i, kb.idx(kMeansCols), kb.idx(1), accIn,
                  [&](Value c, ValueRange a) -> SmallVector<Value> {
                    Value w = kb.load(woT, {c, tid});
                    SmallVector<Value> next;
                    for (int64_t q = 0; q < kMeansKeys / 4; ++q) {
                      Value x4 = vector::LoadOp::create(
                          b, vec4, vT, ValueRange{c, kb.idx(4 * q)},
                          /*nontemporal=*/false, llvm::MaybeAlign(16));
                      for (int64_t t = 0; t < 4; ++t) {
                        Value x = vector::ExtractOp::create(b, x4, t);
                        next.push_back(kb.fma(x, w, a[4 * q + t]));
                      }
                    }
                    return next;
                  });
            });
        Value d = kb.add(d0, tid);
        Value dOk = kb.lt(d, D);
        for (int64_t jj = 0; jj < kMeansKeys; ++jj) {
          Value mean = kb.fmul(scale, acc[jj]);
          Value key = kb.add(j0, kb.idx(jj));
          // The tensor-core kernel's keys: the f32 mean rounded once here
          // (the bias below stays f32).
          kb.ifThen(kb.andI(dOk, kb.lt(key, Nk)), [&] {
            kb.store(meanElt.isF32()
                         ? mean
                         : arith::TruncFOp::create(b, meanElt, mean),
                     m, {bi, key, d});
          });
          // The key's sum of squares over the warp's features of this
          // step (a butterfly), added to the warp's partial by its lane 0.
          // Per step rather than carried over the steps in 16 registers a
          // thread: with them ptxas spilled at D = 512 on sm_80.
          Value sq = subgroupReduce(
              kb, kb.select(dOk, kb.fmul(mean, mean), zero), ReduceKind::Sum,
              kWarp);
          kb.ifThen(kb.eq(lane, c0i), [&] {
            Value at = kb.idx(jj);
            Value was = kb.load(partial, {warp, at});
            kb.store(kb.fadd(was, sq), partial, {warp, at});
          });
        }
      });
  // The keys' sums over the warps, in order, by the thread of the key.
  kb.barrier();
  Value key = kb.add(j0, tid);
  kb.ifThen(kb.andI(kb.lt(tid, kb.idx(kMeansKeys)), kb.lt(key, Nk)), [&] {
    Value total = kb.load(partial, {c0i, tid});
    for (int64_t w = 1; w < warps; ++w)
      total = kb.fadd(total, kb.load(partial, {kb.idx(w), tid}));
    kb.store(kb.fdiv(total, kb.cF32(-2.0 * sigma * sigma)), bias, {bi, key});
  });
  GpuKernelBuilder &hk = host.kb;
  kernel.launch({hk.ceilDiv(hk.dim(vBuf, 2), hk.idx(kMeansKeys)),
                 hk.dim(vBuf, 0), hk.idx(1)});
}

/// attention_posterior or its fused top-k form (the same operands, one result
/// more).
template <typename OpTy>
static LogicalResult
lowerAttentionPosterior(OpTy op, typename OpTy::Adaptor adaptor,
                        ConversionPatternRewriter &rewriter,
                        const ConvertMoEToGPUOptions &options) {
  auto fused = dyn_cast<AttentionPosteriorTopkOp>(op.getOperation());
  auto plain = dyn_cast<AttentionPosteriorOp>(op.getOperation());
  HeadSelect select = op.getHeadSelect();
  if (select != HeadSelect::min_entropy)
    return op->emitOpError(
        "GPU lowering supports head_select = min_entropy only (use the "
        "portable lowering for head_select = all)");
  Value scoresT = adaptor.getScores(), uT = adaptor.getU(), vT = adaptor.getV(),
        woT = adaptor.getWo(), eT = adaptor.getE();
  FailureOr<int64_t> K = flashExpertCount(op, eT);
  if (failed(K))
    return failure();
  double sigma = op.getSigma().convertToDouble();
  std::optional<double> headScale;
  if (fused) {
    if (auto attr = fused.getHeadScaleAttr())
      headScale = attr.getValueAsDouble();
    else if (int64_t H =
                 cast<RankedTensorType>(scoresT.getType()).getShape()[1];
             !ShapedType::isDynamic(H))
      headScale = static_cast<double>(H);
  } else {
    headScale = plain.getEffectiveHeadScale();
  }

  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Type f32 = b.getF32Type();
  Value scores = h.buffer(scoresT), u = h.buffer(uT), v = h.buffer(vT),
        wo = h.buffer(woT), e = h.buffer(eT);
  Value B = kb.dim(scores, 0), H = kb.dim(scores, 1), N = kb.dim(scores, 2),
        Nk = kb.dim(scores, 3), D = kb.dim(wo, 0);

  // Results: p (or weights, indices) and head.
  SmallVector<Value> results;
  for (Value result : op->getResults()) {
    auto type = cast<RankedTensorType>(result.getType());
    results.push_back(h.allocLike(type, dynamicSizesFrom(kb, type, u)));
  }
  Value head = results.back();

  // 1-2: entropy partials and the head.
  Value chunks = kb.ceilDiv(N, kb.idx(kEntropyRowsPerBlock));
  auto partialType = MemRefType::get(
      {ShapedType::kDynamic, ShapedType::kDynamic, ShapedType::kDynamic}, f32);
  Value sums = h.alloc(partialType, {B, H, chunks});
  Value counts = h.alloc(partialType, {B, H, chunks});
  launchEntropy(h, scores, sums, counts, {chunks, H, B}, op->getLoc());
  launchHeadSelect(h, sums, counts, head, B, op->getLoc());
  h.release(sums);
  h.release(counts);

  // The posterior mixing's spec; with u, e f16/bf16 of one type, on tensor
  // cores.
  FlashMixSpec spec{attentionPosteriorLogit(sigma)};
  spec.numExperts = *K;
  if (fused) {
    spec.topk = kernels::topkSpecOf(fused);
  }
  auto elementOf = [](Value v) {
    return cast<MemRefType>(v.getType()).getElementType();
  };
  std::optional<FlashMmaTile> mma =
      flashMmaTile(spec, elementOf(u), /*keyElt=*/elementOf(u), elementOf(e),
                   cast<MemRefType>(u.getType()).getShape()[2], options);

  // 3: head means and their bias. The tensor-core kernel takes the means in
  // the operand type, which this kernel writes (rounding each f32 mean once)
  // instead of f32: converting them while staging instead would read 4 bytes
  // and convert each mean once per block of 64 query rows (ceil(N / 64)
  // times a sequence) rather than once, and would take the keys off the
  // 16-byte vector and cp.async staging paths (they copy the operand type as
  // it is). The f32 means have no other reader: the bias is computed here
  // from the f32 values.
  // (The tensor-core kernel's keys with their static feature count, as its
  // q's: the staging's row stride is then a constant.)
  auto meansType =
      mma ? MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic,
                             cast<MemRefType>(u.getType()).getShape()[2]},
                            elementOf(u))
          : MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic,
                             ShapedType::kDynamic},
                            f32);
  auto biasType =
      MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic}, f32);
  Value means =
      mma ? h.alloc(meansType, {B, Nk}) : h.alloc(meansType, {B, Nk, D});
  Value bias = h.alloc(biasType, {B, Nk});
  launchHeadMeans(h, v, wo, head, means, bias, headScale, sigma, op->getLoc());

  // 4: the posterior mixing.
  SmallVector<Value> args = {u, means, e, bias, scores, head};
  args.append(results.begin(), results.end() - 1);
  launchFlashMixKernel(
      h, fused ? "attention_posterior_topk" : "attention_posterior", spec, mma,
      /*tf32=*/std::nullopt, u, args, op->getLoc());
  h.release(means);
  h.release(bias);
  h.finish();
  h.replace(op, results);
  return success();
}

template <>
LogicalResult GPULowering<AttentionPosteriorOp>::lower(
    AttentionPosteriorOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  return lowerAttentionPosterior(op, adaptor, rewriter, options);
}

template <>
LogicalResult GPULowering<AttentionPosteriorTopkOp>::lower(
    AttentionPosteriorTopkOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  return lowerAttentionPosterior(op, adaptor, rewriter, options);
}
