//===- AttentionPosteriorGrad.cpp - attention_posterior_grad on the GPU ---===//
//
// Part of the MoE-MLIR project.
//
// The flash-style backward of Attention-Inform mixing for head_select =
// min_entropy (the maths is in the op description, MoEGradOps.td; the CPU
// kernel, MoEToCPU/AttentionPosteriorGrad.cpp, has the same passes) at the
// forward's head h* (an operand: nothing flows through its choice), on the
// kernels of similarity_inform's backward (FlashGrad.cpp), storing nothing
// N x Nk besides the result d_scores:
//  0. e with its non-finite entries zeroed (they get no gradient and enter
//     <dp_i, e_j> as 0, as in autograd of the reference);
//  1. the forward's head means m of h* and their bias -‖m_j‖²/(2σ²)
//     (launchHeadMeans), then the forward's flash kernel recomputes p and
//     the row log-sum-exp; flash_grad_stats turns lse into lse' and forms
//     delta_i = <dp_i, p_i>;
//  2. d_scores is zeroed, then query-major (launchFlashGrad, rows i): the
//     logit z_ij = <u_i, m_j>/σ² + bias_j + scores[b,h*,i,j], G =
//     exp(z - lse'_i), dz = G (<dp_i, e_j> - delta_i) stored into
//     d_scores[b, h*] and d_u_i = Σ_j dz_ij m_j / σ²;
//  3. key-major (rows j): d_e_j = Σ_i G_ij dp_i, Σ_i dz_ij u_i / σ² and
//     Σ_i dz_ij / σ² (a `ones` accumulator); d_e is then 0 at a non-finite e
//     entry;
//  4. dm_j = c (Σ_i dz_ij u_i - (Σ_i dz_ij) m_j) / σ² in place, then
//     d_v[b,h,j,:] = dm_j W_h* (0 off h*; a thread per (h, c), the rows
//     (b, j) strided over the blocks) and d_wo[d, h·Dh + c] =
//     Σ_{b: h*_b = h} Σ_j dm[b,j,d] v[b,h,j,c] (a thread per entry, (b, j)
//     in order).
// An h* outside [0, H) is checked by the first kernel (its threads b < B, no
// launch of its own) and reported through the error word
// (kMoEErrorAttentionHead); its batch element is skipped: the passes read
// head 0 in its place (in bounds) and flash_grad_stats gives its rows
// lse' = +inf, so that every weight G and gradient of the element is 0 (the
// portable lowering's result, where no head matches).
// Extra memory: e (f32), m, p, dm [B,Nk|N,D|K] and [B,N|Nk] row statistics.
// Every output element has one writer: deterministic, no atomics.
//
// head_select = all is not lowered to the GPU (its forward is not either).
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Lowerings.h"

#include "MoE/Kernels/IndexErrors.h"
#include "MoE/Kernels/SegmentedStats.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

// The ops one call takes are built one a statement where their order would
// otherwise be the C++ compiler's order of evaluating arguments (gcc and
// clang differ): in the order the plain (gcc) build has always emitted them.

/// d0 · d1 · d2 of a 3-D buffer (its dims built from the last).
static Value elementCount3D(GpuKernelBuilder &kb, Value v) {
  Value d2 = kb.dim(v, 2), d1 = kb.dim(v, 1), d0 = kb.dim(v, 0);
  return kb.mul(kb.mul(d0, d1), d2);
}

/// out = e where e is finite, else 0, for the element `flat` of [B,R,K]
/// buffers (`copy`), or out kept where e is finite and zeroed elsewhere.
static void emitFiniteMask(GpuKernelBuilder &kb, Value src, Value dst,
                           bool copy, Value flat) {
  Value R = kb.dim(src, 1), K = kb.dim(src, 2);
  Value c = kb.remu(flat, K), rest = kb.divu(flat, K);
  Value j = kb.remu(rest, R), b = kb.divu(rest, R);
  Value x = kb.loadF(src, {b, j, c});
  Value finite = kb.cmpf(arith::CmpFPredicate::ONE, kb.fabs(x),
                         kb.cF32(std::numeric_limits<double>::infinity()));
  Value kept = copy ? x : kb.load(dst, {b, j, c});
  kb.store(kb.select(finite, kept, kb.cF32(0.0)), dst, {b, j, c});
}

/// A thread per element of d_e ([B,Nk,K] f32): zeroed where e is not finite.
static void launchFiniteMaskOfGrad(HostCode &h, Value e, Value de,
                                   Location loc) {
  GPUKernel kernel(h, "attention_grad_finite_de", {e, de}, {},
                   {kKernelThreads, 1, 1}, loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value src = kernel.arg(0), dst = kernel.arg(1);
    Value total = elementCount3D(kb, src);
    kernel.forItem(total, [&](Value flat) {
      emitFiniteMask(kb, src, dst, /*copy=*/false, flat);
    });
  }
  GpuKernelBuilder &kb = h.kb;
  kernel.launchOver(elementCount3D(kb, e));
}

/// The first kernel: out ([B,Nk,K] f32) = e where finite, else 0, a thread
/// per element; and the check of h* on threads b < B (at least B threads):
/// safe[b] = head[b] and skip[b] = 0 when it lies in [0, `heads`), else
/// safe[b] = 0 (in bounds for the passes), skip[b] = 1 and the error is
/// recorded in `word`.
static void launchFiniteEAndHeadCheck(HostCode &h, Value e, Value out,
                                      Value head, Value heads, Value safe,
                                      Value skip, Value word, Location loc) {
  GPUKernel kernel(h, "attention_grad_finite_e",
                   {e, out, head, heads, safe, skip, word}, {},
                   {kKernelThreads, 1, 1}, loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value src = kernel.arg(0), dst = kernel.arg(1), hs = kernel.arg(2),
          H = kernel.arg(3), hsSafe = kernel.arg(4), skipped = kernel.arg(5),
          w = kernel.arg(6);
    Value B = kb.dim(src, 0);
    Value K = kb.dim(src, 2), R = kb.dim(src, 1);
    Value total = kb.mul(kb.mul(B, R), K);
    Value flat = kernel.globalId();
    kb.ifThen(kb.lt(flat, total),
              [&] { emitFiniteMask(kb, src, dst, /*copy=*/true, flat); });
    kb.ifThen(kb.lt(flat, B), [&] {
      Value hv = kb.load(hs, {flat});
      Value ok = idInRange(kb, hv, kb.castInt(H, hv.getType()));
      kb.store(kb.select(ok, hv, kb.cI32(0)), hsSafe, {flat});
      kb.store(kb.select(ok, kb.cI32(0), kb.cI32(1)), skipped, {flat});
      kb.ifThen(kb.notI1(ok), [&] {
        Value bound = kb.castInt(H, kb.i64());
        Value value = kb.castInt(hv, kb.i64());
        Value position = kb.castInt(flat, kb.i64());
        emitRecordIndexError(kb, w, kMoEErrorAttentionHead, position, value,
                             bound);
      });
    });
  }
  GpuKernelBuilder &kb = h.kb;
  Value B = kb.dim(e, 0);
  Value K = kb.dim(e, 2), Nk = kb.dim(e, 1);
  kernel.launchOver(kb.maxs(B, kb.mul(kb.mul(B, Nk), K)));
}

/// dm[b,j,d] = c · (dm[b,j,d] - rowSum[b,j,0] · m[b,j,d]) in place (a thread
/// per element); c = `headScale`, or H (dim 1 of v).
static void launchMeanGrad(HostCode &h, Value dm, Value rowSum, Value means,
                           Value v, std::optional<double> headScale,
                           Location loc) {
  GPUKernel kernel(h, "attention_grad_dm", {dm, rowSum, means, v}, {},
                   {kKernelThreads, 1, 1}, loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value g = kernel.arg(0), r = kernel.arg(1), m = kernel.arg(2),
          vv = kernel.arg(3);
    Value Nk = kb.dim(g, 1), D = kb.dim(g, 2);
    Value total = kb.mul(kb.mul(kb.dim(g, 0), Nk), D);
    Value scale = headScale ? kb.cF32(*headScale) : kb.sitofp(kb.dim(vv, 1));
    kernel.forItem(total, [&](Value flat) {
      Value d = kb.remu(flat, D), rest = kb.divu(flat, D);
      Value j = kb.remu(rest, Nk), b = kb.divu(rest, Nk);
      Value mj = kb.load(m, {b, j, d});
      Value rm = kb.fmul(kb.load(r, {b, j, kb.idx(0)}), mj);
      Value x = kb.fsub(kb.load(g, {b, j, d}), rm);
      kb.store(kb.fmul(scale, x), g, {b, j, d});
    });
  }
  GpuKernelBuilder &kb = h.kb;
  kernel.launchOver(elementCount3D(kb, dm));
}

/// d_v[b,h,j,c] = Σ_d dm[b,j,d] · wo[d, h·Dh + c] for h = h*[b], else 0: a
/// thread per column h·Dh + c (blocks along x), the B·Nk rows (b, j) strided
/// over the blocks along y.
static void launchValueGrad(HostCode &h, Value dm, Value wo, Value head,
                            Value dv, Location loc) {
  GPUKernel kernel(h, "attention_grad_dv", {dm, wo, head, dv}, {},
                   {kKernelThreads, 1, 1}, loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value g = kernel.arg(0), w = kernel.arg(1), hs = kernel.arg(2),
          out = kernel.arg(3);
    Value H = kb.dim(out, 1), Nk = kb.dim(out, 2), Dh = kb.dim(out, 3);
    Value D = kb.dim(g, 2);
    Value col = kernel.globalId();
    Value hh = kb.divu(col, Dh), c = kb.remu(col, Dh);
    Value rows = kb.mul(kb.dim(out, 0), Nk);
    kernel.forRowsOfColumn(kb.lt(col, kb.mul(H, Dh)), rows, [&](Value flatRow) {
      Value b = kb.divu(flatRow, Nk), j = kb.remu(flatRow, Nk);
      Value chosen = kb.eq(hh, kb.castInt(kb.load(hs, {b}), kb.index()));
      // Off h*, the loop is empty: 0.
      Value s = kb.forLoop(
          kb.idx(0), kb.select(chosen, D, kb.idx(0)), kb.idx(1), {kb.cF32(0.0)},
          [&](Value d, ValueRange acc) -> SmallVector<Value> {
            Value wd = kb.loadF(w, {d, col});
            return {kb.fadd(acc[0], kb.fmul(kb.load(g, {b, j, d}), wd))};
          })[0];
      kb.store(s, out, {b, hh, j, c});
    });
  }
  GpuKernelBuilder &kb = h.kb;
  Value Dh = kb.dim(dv, 3), H = kb.dim(dv, 1);
  Value cols = kb.mul(H, Dh);
  Value Nk = kb.dim(dv, 2), B = kb.dim(dv, 0);
  kernel.launchColumns(cols, kb.mul(B, Nk));
}

/// d_wo[d, h·Dh + c] = Σ_b [h*[b] = h] Σ_j dm[b,j,d] · v[b,h,j,c]: a thread
/// per column (blocks along x), the rows d strided over the blocks along y;
/// the sum runs over (b, j) in order.
static void launchWeightGrad(HostCode &h, Value dm, Value v, Value head,
                             Value dwo, Location loc) {
  GPUKernel kernel(h, "attention_grad_dwo", {dm, v, head, dwo}, {},
                   {kKernelThreads, 1, 1}, loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value g = kernel.arg(0), vv = kernel.arg(1), hs = kernel.arg(2),
          out = kernel.arg(3);
    Value H = kb.dim(vv, 1), Nk = kb.dim(vv, 2), Dh = kb.dim(vv, 3);
    Value D = kb.dim(out, 0);
    Value col = kernel.globalId();
    Value hh = kb.divu(col, Dh), c = kb.remu(col, Dh);
    Value c0 = kb.idx(0), c1 = kb.idx(1);
    kernel.forRowsOfColumn(kb.lt(col, kb.mul(H, Dh)), D, [&](Value d) {
      Value s = kb.forLoop(
          c0, kb.dim(vv, 0), c1, {kb.cF32(0.0)},
          [&](Value b, ValueRange acc) -> SmallVector<Value> {
            Value chosen = kb.eq(hh, kb.castInt(kb.load(hs, {b}), kb.index()));
            return kb.forLoop(
                c0, kb.select(chosen, Nk, c0), c1, acc,
                [&](Value j, ValueRange a) -> SmallVector<Value> {
                  Value vj = kb.loadF(vv, {b, hh, j, c});
                  return {kb.fadd(a[0], kb.fmul(kb.load(g, {b, j, d}), vj))};
                });
          })[0];
      kb.store(s, out, {d, col});
    });
  }
  GpuKernelBuilder &kb = h.kb;
  Value cols = kb.dim(dwo, 1);
  kernel.launchColumns(cols, kb.dim(dwo, 0));
}

template <>
LogicalResult GPULowering<AttentionPosteriorGradOp>::lower(
    AttentionPosteriorGradOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  if (op.getHeadSelect() != HeadSelect::min_entropy)
    return op->emitOpError(
        "GPU lowering supports head_select = min_entropy only (use the "
        "portable lowering for head_select = all)");
  Value scoresT = adaptor.getScores(), uT = adaptor.getU(), vT = adaptor.getV(),
        woT = adaptor.getWo(), eT = adaptor.getE(), headT = adaptor.getHead(),
        dpT = adaptor.getDp();
  FailureOr<int64_t> K = flashExpertCount(op, eT);
  if (failed(K))
    return failure();
  Location loc = op.getLoc();
  double sigma = op.getSigma().convertToDouble();
  std::optional<double> headScale = op.getEffectiveHeadScale();

  HostCode h(rewriter, op);
  GpuKernelBuilder &kb = h.kb;
  Type f32 = h.b.getF32Type();
  Value scores = h.buffer(scoresT), u = h.buffer(uT), v = h.buffer(vT),
        wo = h.buffer(woT), eIn = h.buffer(eT), headIn = h.buffer(headT),
        dp = h.buffer(dpT);
  // An f32 temporary of the given sizes, each the dim d of a buffer (static
  // where that is) or, without a buffer, the constant d.
  auto temp = [&](ArrayRef<std::pair<Value, int64_t>> dims) {
    SmallVector<int64_t> shape;
    SmallVector<Value> sizes;
    for (auto [buffer, d] : dims) {
      int64_t size =
          buffer ? cast<MemRefType>(buffer.getType()).getDimSize(d) : d;
      shape.push_back(size);
      if (ShapedType::isDynamic(size))
        sizes.push_back(kb.dim(buffer, d));
    }
    return h.alloc(MemRefType::get(shape, f32), sizes);
  };

  // Results, each shaped like its operand: d_scores, d_u, d_v, d_wo, d_e.
  SmallVector<Value> results, operands = {scores, u, v, wo, eIn};
  for (auto [result, like] : llvm::zip(op->getResults(), operands)) {
    auto type = cast<RankedTensorType>(result.getType());
    results.push_back(h.allocLike(type, dynamicSizesFrom(kb, type, like)));
  }
  Value dScores = results[0], du = results[1], dv = results[2],
        dwo = results[3], de = results[4];

  // 0-1. e zeroed where non-finite; m and its bias; p and lse by the forward
  // kernel; lse' and delta.
  Value e = temp({{eIn, 0}, {eIn, 1}, {eIn, 2}});
  // The heads the passes read (h*, or 0 for a skipped batch element) and
  // the skip flags, [B] i32.
  auto headType = cast<MemRefType>(headIn.getType());
  SmallVector<Value> headSizes;
  if (headType.isDynamicDim(0))
    headSizes.push_back(kb.dim(headIn, 0));
  Value head = h.alloc(headType, headSizes);
  Value skip = h.alloc(headType, headSizes);
  // (Operands named first: argument evaluation order differs between
  // compilers.)
  Value word = h.errorWord();
  Value heads = kb.dim(scores, 1);
  launchFiniteEAndHeadCheck(h, eIn, e, headIn, heads, head, skip, word, loc);
  Value means = temp({{v, 0}, {v, 2}, {wo, 0}});
  Value bias = temp({{v, 0}, {v, 2}});
  launchHeadMeans(h, v, wo, head, means, bias, headScale, sigma, loc);
  Value p = temp({{u, 0}, {u, 1}, {eIn, 2}});
  Value lse = temp({{u, 0}, {u, 1}});
  Value delta = temp({{u, 0}, {u, 1}});
  // Every pass recomputes the forward's logit.
  FlashLogitSpec logit = attentionPosteriorLogit(sigma);
  FlashMixSpec fwd{logit};
  fwd.numExperts = *K;
  fwd.withLse = true;
  launchFlashMix(h, "attention_posterior_grad_mix", fwd, u,
                 {u, means, e, bias, scores, head, p, lse}, loc);
  launchFlashGradStats(h, lse, p, dp, delta, loc, /*lseOut=*/{}, skip);
  h.release(p);
  h.release(skip);

  FlashGradSpec spec{logit};

  // 2. Query-major: dz into d_scores (zero off h*), d_u = Σ_j dz m_j / σ².
  h.fill32(dScores, kb.cF32(0.0));
  FlashGradSpec byQuery = spec;
  byQuery.storeDz = true;
  byQuery.accumulators = {{/*byDx=*/true, /*addToOut=*/false}};
  launchFlashGrad(
      h, "attention_posterior_grad_dq", byQuery,
      {u, means, dp, e, lse, delta, bias, scores, head, dScores, means, du},
      loc);

  // 3. Key-major: d_e = Σ_i G dp_i, Σ_i dz u_i / σ², Σ_i dz / σ².
  Value dm = temp({{v, 0}, {v, 2}, {u, 2}});
  Value dzSum = temp({{v, 0}, {v, 2}, {Value(), 1}});
  FlashGradSpec byKey = spec;
  byKey.keyMajor = true;
  byKey.accumulators = {{/*byDx=*/false, /*addToOut=*/false},
                        {/*byDx=*/true, /*addToOut=*/false},
                        {/*byDx=*/true, /*addToOut=*/false, /*ones=*/true}};
  launchFlashGrad(
      h, "attention_posterior_grad_dk", byKey,
      {means, u, e, dp, lse, delta, bias, scores, head, dp, de, u, dm, dzSum},
      loc);
  h.release(lse);
  h.release(delta);
  h.release(bias);
  h.release(e);
  launchFiniteMaskOfGrad(h, eIn, de, loc);

  // 4. dm, then d_v and d_wo.
  launchMeanGrad(h, dm, dzSum, means, v, headScale, loc);
  h.release(dzSum);
  h.release(means);
  launchValueGrad(h, dm, wo, head, dv, loc);
  launchWeightGrad(h, dm, v, head, dwo, loc);
  h.release(dm);
  h.release(head);
  h.finish();
  h.replace(op, results);
  return success();
}
