//===- SimilarityInformGrad.cpp - moe.similarity_inform_grad on the GPU ---===//
//
// Part of the MoE-MLIR project.
//
// The flash-style backward of Similarity-Inform mixing (the maths is in the
// op description, MoEGradOps.td; the CPU kernel, MoEToCPU/
// SimilarityInformGrad.cpp, has the same passes), none of which stores
// anything N x N:
//  0. with ws, q = u · ws (the forward's projection kernel);
//  1. p and the row log-sum-exp lse saved by the forward (saved(p, lse)), or
//     recomputed by the forward's flash kernel; flash_grad_stats turns lse
//     into lse' (+inf for a row without keys, so that all its S are 0) and
//     forms delta_i = <dp_i, p_i>;
//  2. query-major (launchFlashGrad, rows i): dq_i = Σ_j dX_ij u_j, written
//     into du itself without ws;
//  3. key-major (rows j): de_j = Σ_i S_ij dp_i and dk_j = Σ_i dX_ij q_i,
//     added to du (dq already there) without ws;
//  4. with ws: du += dq · ws^T (the projection kernel, transposed and
//     accumulating) and dws = Σ_{b,i} u_i^T dq_i (a thread per entry, the
//     rows in a fixed order).
// Extra memory: p [B,N,K], lse and delta [B,N], with ws q and dq [B,N,D].
// Every output row has one writer: deterministic, no atomics.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Lowerings.h"

#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

/// dws[d, c] = Σ_{b,i} u[b,i,d] · dq[b,i,c]: a thread per column c (blocks
/// along x), the rows d strided over the blocks along y; the sum runs over
/// (b, i) in order.
static void launchWeightGrad(HostCode &h, Value u, Value dq, Value dws,
                             Location loc) {
  const int64_t threads = 128;
  GPUKernel kernel(h, "similarity_grad_dws", {u, dq, dws}, {}, {threads, 1, 1},
                   loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value uu = kernel.arg(0), g = kernel.arg(1), out = kernel.arg(2);
    Value D = kb.dim(uu, 2);
    Value col = kernel.globalId();
    kernel.forRowsOfColumn(kb.lt(col, D), D, [&](Value d) {
      Value c0 = kb.idx(0), c1 = kb.idx(1);
      Value s = kb.forLoop(
          c0, kb.dim(uu, 0), c1, {kb.cF32(0.0)},
          [&](Value b, ValueRange acc) -> SmallVector<Value> {
            return kb.forLoop(
                c0, kb.dim(uu, 1), c1, acc,
                [&](Value i, ValueRange a) -> SmallVector<Value> {
                  // (dq loaded first: the order the plain build has always
                  // emitted; as two arguments of one call it would be the
                  // C++ compiler's.)
                  Value dq = kb.load(g, {b, i, col});
                  return {kb.fadd(a[0], kb.fmul(kb.loadF(uu, {b, i, d}), dq))};
                });
          })[0];
      kb.store(s, out, {d, col});
    });
  }
  GpuKernelBuilder &kb = h.kb;
  Value D = kb.dim(u, 2);
  kernel.launchColumns(D, D);
}

template <>
LogicalResult GPULowering<SimilarityInformGradOp>::lower(
    SimilarityInformGradOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  Value uT = adaptor.getU(), eT = adaptor.getE(), wsT = adaptor.getWs(),
        maskT = adaptor.getKeyMask(), dpT = adaptor.getDp();
  FailureOr<int64_t> K = flashExpertCount(op, eT);
  if (failed(K))
    return failure();
  Location loc = op.getLoc();
  // Every pass recomputes the forward's logit.
  FlashLogitSpec logit = similarityInformLogit(
      op.getTau().convertToDouble(), op.getCausal(), static_cast<bool>(maskT));

  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Type f32 = b.getF32Type();
  Value u = h.buffer(uT), e = h.buffer(eT), dp = h.buffer(dpT);
  Value ws = wsT ? h.buffer(wsT) : Value();
  Value mask = maskT ? h.buffer(maskT) : Value();
  ArrayRef<int64_t> uShape = cast<MemRefType>(u.getType()).getShape();
  SmallVector<Value> bnd = dynamicSizesFrom(
      kb, cast<RankedTensorType>(uT.getType()), u); // [B, N, D]'s dynamic dims
  SmallVector<Value> bn;                           // [B, N]'s
  for (int64_t d = 0; d < 2; ++d)
    if (ShapedType::isDynamic(uShape[d]))
      bn.push_back(kb.dim(u, d));
  auto rowsType = MemRefType::get({uShape[0], uShape[1]}, f32);
  auto featType = MemRefType::get(uShape, f32);
  auto widthType = MemRefType::get({uShape[0], uShape[1], *K}, f32);

  // Results: du [B,N,D], de [B,N,K] (dynamic dims from u), dws [D,D].
  auto duType = cast<RankedTensorType>(op.getDu().getType());
  auto deType = cast<RankedTensorType>(op.getDe().getType());
  Value du = h.allocLike(duType, dynamicSizesFrom(kb, duType, u));
  Value de = h.allocLike(deType, dynamicSizesFrom(kb, deType, u));
  Value dws;
  if (ws) {
    auto dwsType = cast<RankedTensorType>(op.getDws().getType());
    SmallVector<Value> sizes;
    for (int64_t d = 0; d < 2; ++d)
      if (dwsType.isDynamicDim(d))
        sizes.push_back(kb.dim(u, 2));
    dws = h.allocLike(dwsType, sizes);
  }

  // Tensor cores (flash-mma-grad) for f16/bf16 u and e without ws: the
  // passes of FlashMmaGrad.cpp, and the recomputed forward on the forward's
  // tensor-core kernel.
  auto elementOf = [](Value v) {
    return cast<MemRefType>(v.getType()).getElementType();
  };
  const bool mmaGrad =
      options.flashMmaGrad && !ws &&
      flashGradMmaApplies(logit, elementOf(u), elementOf(e), uShape[2], *K);

  // The passes take dp rounded to the operand type, its rows padded to a
  // multiple of 8 (16-byte vectors), written by the stats kernel, whose
  // delta is of it too.
  Value dpRounded;
  if (mmaGrad)
    dpRounded =
        h.alloc(MemRefType::get({uShape[0], uShape[1],
                                 static_cast<int64_t>(llvm::alignTo(*K, 8))},
                                elementOf(u)),
                bn);

  // 0-1. q, then p and lse by the forward kernel, then lse' and delta.
  Value q = u;
  if (ws) {
    q = h.alloc(featType, bnd);
    launchRowProjection(h, "similarity_project", u, ws, q,
                        /*transposed=*/false, /*accumulate=*/false, loc);
  }
  Value lse = h.alloc(rowsType, bn);
  Value delta = h.alloc(rowsType, bn);
  if (adaptor.getP()) {
    // Saved by the forward (similarity_inform_fwd): no forward pass; lse'
    // goes to a buffer of its own (the saved lse is an input).
    // p's buffer first (the kernel's ins in the order the plain build has
    // always made them; as two arguments, the C++ compiler's order).
    Value savedP = h.buffer(adaptor.getP());
    Value savedLse = h.buffer(adaptor.getLse());
    launchFlashGradStats(h, savedLse, savedP, dp, delta, loc, lse,
                         /*skip=*/{}, dpRounded);
  } else {
    Value p = h.alloc(widthType, bn);
    FlashMixSpec fwd{logit};
    fwd.numExperts = *K;
    fwd.withLse = true;
    fwd.balanceCausal = options.flashCausalBalance;
    SmallVector<Value> fwdArgs = {q, u, e};
    if (mask)
      fwdArgs.push_back(mask);
    fwdArgs.append({p, lse});
    std::optional<FlashMmaTile> tile;
    if (mmaGrad)
      tile = flashMmaTile(fwd, elementOf(q), elementOf(u), elementOf(e),
                          uShape[2], options);
    // f32 operands: the recomputed forward on tensor cores by 3xTF32
    // (flash-mma-tf32) where it applies.
    std::optional<FlashTf32Tile> tf32;
    if (!tile)
      tf32 = flashTf32Tile(fwd, elementOf(q), elementOf(u), elementOf(e),
                           uShape[2], options);
    launchFlashMixKernel(h, "similarity_inform_grad_mix", fwd, tile, tf32, q,
                         fwdArgs, loc);
    launchFlashGradStats(h, lse, p, dp, delta, loc, /*lseOut=*/{},
                         /*skip=*/{}, dpRounded);
    h.release(p);
  }

  if (mmaGrad) {
    // 2-3. dq into du by query, then de and dk (added to du) by key.
    SmallVector<Value> args = {u, e, dpRounded, lse, delta};
    if (mask)
      args.push_back(mask);
    SmallVector<Value> byQuery(args), byKey(args);
    byQuery.push_back(du);
    byKey.append({de, du});
    FlashGradSpec spec{logit};
    spec.balanceCausal = options.flashCausalBalance;
    launchFlashGradMma(h, "similarity_inform_grad_dq_mma", spec, byQuery, loc);
    spec.keyMajor = true;
    launchFlashGradMma(h, "similarity_inform_grad_dk_mma", spec, byKey, loc);
    h.release(lse);
    h.release(delta);
    h.release(dpRounded);
    h.finish();
    h.replace(op, {du, de});
    return success();
  }

  auto gradArgs = [&](Value sRows, Value sCols, Value gRows, Value gCols) {
    SmallVector<Value> args = {sRows, sCols, gRows, gCols, lse, delta};
    if (mask)
      args.push_back(mask);
    return args;
  };
  FlashGradSpec spec{logit};
  spec.balanceCausal = options.flashCausalBalance;

  // 2. Query-major: dq (into du without ws).
  Value dq = ws ? h.alloc(featType, bnd) : du;
  FlashGradSpec byQuery = spec;
  byQuery.accumulators = {{/*byDx=*/true, /*addToOut=*/false}};
  SmallVector<Value> args = gradArgs(q, u, dp, e);
  args.append({u, dq});
  launchFlashGrad(h, "similarity_inform_grad_dq", byQuery, args, loc);

  // 3. Key-major: de and dk (added to dq in du without ws).
  FlashGradSpec byKey = spec;
  byKey.keyMajor = true;
  byKey.accumulators = {{/*byDx=*/false, /*addToOut=*/false},
                        {/*byDx=*/true, /*addToOut=*/!ws}};
  args = gradArgs(u, q, e, dp);
  args.append({dp, de, q, du});
  launchFlashGrad(h, "similarity_inform_grad_dk", byKey, args, loc);
  h.release(lse);
  h.release(delta);

  // 4. du += dq · ws^T and dws = Σ u^T dq.
  if (ws) {
    launchRowProjection(h, "similarity_grad_project", dq, ws, du,
                        /*transposed=*/true, /*accumulate=*/true, loc);
    launchWeightGrad(h, u, dq, dws, loc);
    h.release(dq);
    h.release(q);
  }
  h.finish();
  SmallVector<Value> results = {du, de};
  if (dws)
    results.push_back(dws);
  h.replace(op, results);
  return success();
}
