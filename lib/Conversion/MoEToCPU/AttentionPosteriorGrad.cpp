//===- AttentionPosteriorGrad.cpp - moe.attention_posterior_grad -> CPU ---===//
//
// Part of the MoE-MLIR project.
//
// The flash-style backward of Attention-Inform mixing for head_select =
// min_entropy (the maths is in the op description, MoEGradOps.td; the
// all-heads form stays on the portable lowering, as its forward does), at the
// forward's head h* (an operand), in streaming passes that store nothing
// N x Nk besides the result d_scores:
//  1. the forward's head means m of h* (packHeadMeans) and the forward kernel
//     (emitFlashMix with the forward's logit epilogue) recompute p and the row
//     log-sum-exp; e enters with its non-finite entries zeroed (as autograd of
//     the reference, where they get no gradient); then lse' and
//     delta_i = <dp_i, p_i> (gradRowStats);
//  2. query-major (emitFlashGrad, rows i, columns j): G = exp(z - lse'_i),
//     dz = G (<dp_i, e_j> - delta_i), d_u_i = Σ_j dz_ij m_j / σ², and G
//     stored into d_scores[b, h*] (its other heads are 0);
//  3. key-major over that G (keyMajorSums: one item per key tile, no logit
//     recomputed): dz written over G, d_e_j = Σ_i G_ij dp_i, Σ_i dz_ij and
//     Σ_i dz_ij u_i (register blocks of keys x columns). A second tiled pass
//     that recomputed z (D-deep dot, exp) cost a quarter more of the backward
//     at B = 16, N = Nk = 1024, D = 256 (420-440 -> 317-331 ms, Xeon);
//  4. per key dm_j = c (Σ_i dz_ij u_i − (Σ_i dz_ij) m_j) / σ², then
//     d_v[b, h*, j] = dm_j W_h* and d_wo[:, h* block] = Σ_{b,j} dm_j ⊗ v_j
//     (a worker per block of rows of wo, a fixed order over (b, j)).
// An h* outside [0, H) is reported first (the portable lowering's check,
// lowering::emitIndexCheck) and its batch element skipped: the passes read
// head 0 in its place (in bounds) and its rows get lse' = +inf, so that
// every weight G, and with it every gradient of the element, is 0 (the
// portable lowering's result, where no head matches h*).
// Extra memory: packed copies of u, m, e (O(B·(N + Nk)·(D + K))) and
// per-worker tiles ([N, 32] f32 of dz in pass 3). Every sum has one writer:
// deterministic whatever the thread count.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Kernels.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/SegmentedStats.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {

/// Rows summed into one partial before it joins the total (the blocked
/// summation of FlashGrad.cpp: one running f32 sum over thousands of rows
/// loses accuracy against eager's blocked GEMM sums).
constexpr int64_t kFoldRows = 512;
/// Rows ahead whose G the key-major pass prefetches.
constexpr int64_t kPrefetchRows = 16;

/// Runs `body(cols, counts)` over n columns, `chains` chunks of kLanes
/// columns a step: `cols` their first columns, `counts` = n - col the lanes
/// inside (<= 0 past the end: masked to nothing; such a chunk's column is 0,
/// inside the memref).
void forEachChunkGroup(
    CpuKernelBuilder &k, Value n, int64_t chains,
    function_ref<void(ArrayRef<Value> cols, ArrayRef<Value> counts)> body) {
  Value c0 = k.idx(0), step = k.idx(chains * kLanes);
  k.forLoop(c0, k.ceilDiv(n, step), k.idx(1), [&](Value g) {
    SmallVector<Value> cols, counts;
    for (int64_t q = 0; q < chains; ++q) {
      Value col = k.add(k.mul(g, step), k.idx(q * kLanes));
      Value count = k.sub(n, col);
      cols.push_back(
          k.select(k.cmpi(arith::CmpIPredicate::sgt, count, c0), col, c0));
      counts.push_back(count);
    }
    body(cols, counts);
  });
}

struct KeyMajorBuffers {
  /// [B, H, N, Nk] f32: G_ij = exp(z_ij − lse'_i) at [b, head[b]] on entry,
  /// dz_ij on exit.
  Value dScores;
  Value head;  // i32 [B], in [0, H)
  Value eT;    // e (non-finite entries zeroed) packed by packKeysT
  Value dp;    // [B, N, K] f32
  Value delta; // [B, Npad] f32: <dp_i, p_i>
  Value u;     // [B, N, D], any float
  /// Results: d_e [B, Nk, K], Σ_i dz_ij u_i [B, Nk, D], Σ_i dz_ij [B, Nk].
  Value de, dzU, dzSum;
};

/// The key-indexed sums of the backward from the G of the query-major pass:
/// one parallel item per (b, key tile of kKeyTile keys), two 16-lane vectors
/// of keys.
///  A. Rows i in order: dz = G (<dp_i, e_j> − delta_i) (the dots vectorized
///     over the tile's keys, e's packed tile from L1) back into d_scores,
///     d_e_j += G_ij dp_i and Σ_i dz_ij; dz, subnormals flushed, also into a
///     per-worker [N, kKeyTile] scratch.
///  B. Σ_i dz_ij u_i from that scratch in register blocks of kSumKeys keys x
///     kSumChunks 16-lane column chunks (a u chunk loaded once for the
///     block's keys).
/// Where the two-pass form recomputed each logit (a D-deep dot and an exp
/// per pair) and streamed D + K + 1 accumulator lanes per pair through the
/// tiles, this costs about D / 16 + 2 vector FMAs per 16 pairs. Every sum
/// has one writer and a fixed order (kFoldRows blocks).
void keyMajorSums(CpuKernelBuilder &k, const KernelOptions &opts,
                  const KeyMajorBuffers &x, Value batch, Value rows, Value keys,
                  Value model, Value width) {
  constexpr int64_t TK = kKeyTile, KV = TK / kLanes;
  // AVX-512: 4 x 4 accumulators and 4 u chunks of 32 zmm; AVX2 (two ymm a
  // 16-lane vector): 2 x 2 and 2 chunks of 16 ymm.
  const int64_t kSumKeys = opts.vectorBits >= 512 ? 4 : 2;
  const int64_t kSumChunks = kSumKeys;
  Type f32 = k.f32();
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value zeros = k.constLike(k.vf32(), 0.0);
  Value keyTiles = k.ceilDiv(keys, k.idx(TK));
  Value fold = k.idx(kFoldRows);
  Value ahead = k.idx(kPrefetchRows), lastRow = k.sub(rows, c1);
  auto perWorker = [&](ArrayRef<int64_t> shape, ValueRange dyn) {
    return k.scratch(opts, MemRefType::get(shape, f32), dyn);
  };
  Value dePartAll = perWorker({kDyn, TK}, {width});
  Value deTotAll = perWorker({kDyn, TK}, {width});
  Value dzAll = perWorker({kDyn, TK}, {rows});
  Value work = k.mul(k.mul(k.mul(batch, rows), keys),
                     k.add(model, k.add(width, width)));
  workersIfLarge(k, opts, k.mul(batch, keyTiles), work, [&](Value item,
                                                            Value worker) {
    Value bi = k.divu(item, keyTiles), jt = k.remu(item, keyTiles);
    Value j0 = k.mul(jt, k.idx(TK));
    Value h = k.castInt(k.load(x.head, {bi}), k.b.getIndexType());
    Value dePart = k.workerSlice(dePartAll, worker);
    Value deTot = k.workerSlice(deTotAll, worker);
    Value dzBuf = k.workerSlice(dzAll, worker);
    auto zeroDe = [&](Value buf) {
      k.forLoop(c0, width, c1, [&](Value c) {
        for (int64_t v = 0; v < KV; ++v)
          k.vstore(zeros, buf, {c, k.idx(v * kLanes)});
      });
    };
    // Key vector v: its first key and the lanes inside [0, keys) (a vector
    // past the end reads and writes nothing; its index is 0, inside).
    SmallVector<Value> counts, keyAt;
    for (int64_t v = 0; v < KV; ++v) {
      Value j = k.add(j0, k.idx(v * kLanes));
      counts.push_back(k.sub(keys, j));
      keyAt.push_back(k.select(
          k.cmpi(arith::CmpIPredicate::sgt, counts.back(), c0), j, c0));
    }

    // A. dz, d_e, Σ dz.
    zeroDe(deTot);
    Value full = k.cmpi(arith::CmpIPredicate::ule, k.add(j0, k.idx(TK)), keys);
    SmallVector<Value> sumInit(KV, zeros);
    SmallVector<Value> dzSum = k.forLoop(
        c0, rows, fold, sumInit,
        [&](Value i0, ValueRange tot) -> SmallVector<Value> {
          zeroDe(dePart);
          Value i1 = k.mins(k.add(i0, fold), rows);
          SmallVector<Value> part = k.forLoop(
              i0, i1, c1, sumInit,
              [&](Value i, ValueRange acc) -> SmallVector<Value> {
                // Whole key vectors or the ragged last tile (masked).
                SmallVector<Value> g(KV);
                for (int64_t v = 0; v < KV; ++v) {
                  // Rows are Nk·4 bytes apart (a page at Nk = 1024), which
                  // no hardware prefetcher follows: the tile of the row
                  // kPrefetchRows ahead is fetched now (it is also written).
                  Value next = k.mins(k.add(i, ahead), lastRow);
                  memref::PrefetchOp::create(
                      k.b, x.dScores, ValueRange{bi, h, next, keyAt[v]},
                      /*isWrite=*/true, /*localityHint=*/3,
                      /*isDataCache=*/true);
                  g[v] = k.vloadMasked(x.dScores, {bi, h, i, keyAt[v]},
                                       counts[v], 0.0);
                }
                // <dp_i, e_j> for the tile's keys and d_e_j += G_ij dp_i.
                SmallVector<Value> dot = k.forLoop(
                    c0, width, c1, sumInit,
                    [&](Value c, ValueRange d) -> SmallVector<Value> {
                      Value dpc = k.splat(k.loadF(x.dp, {bi, i, c}), kLanes);
                      SmallVector<Value> next;
                      for (int64_t v = 0; v < KV; ++v) {
                        Value col = k.idx(v * kLanes);
                        next.push_back(
                            k.fma(dpc, k.vload(x.eT, {bi, jt, c, col}), d[v]));
                        k.vstore(k.fma(dpc, g[v], k.vload(dePart, {c, col})),
                                 dePart, {c, col});
                      }
                      return next;
                    });
                Value d = k.splat(k.load(x.delta, {bi, i}), kLanes);
                SmallVector<Value> next;
                for (int64_t v = 0; v < KV; ++v) {
                  Value dz = k.fmul(g[v], k.fsub(dot[v], d));
                  k.splitFull(full, [&](bool whole) {
                    k.vstorePart(whole, dz, x.dScores, {bi, h, i, keyAt[v]},
                                 counts[v]);
                  });
                  // Pass B broadcasts dz into FMAs: a subnormal would cost a
                  // microcode assist in each (FlashGrad.cpp).
                  dz = k.flushSubnormal(dz);
                  k.vstore(dz, dzBuf, {i, k.idx(v * kLanes)});
                  next.push_back(k.fadd(acc[v], dz));
                }
                return next;
              });
          k.forLoop(c0, width, c1, [&](Value c) {
            for (int64_t v = 0; v < KV; ++v) {
              Value col = k.idx(v * kLanes);
              k.vstore(k.fadd(k.vload(deTot, {c, col}),
                              k.vload(dePart, {c, col})),
                       deTot, {c, col});
            }
          });
          SmallVector<Value> next;
          for (int64_t v = 0; v < KV; ++v)
            next.push_back(k.fadd(tot[v], part[v]));
          return next;
        });
    for (int64_t v = 0; v < KV; ++v)
      k.vstoreMasked(dzSum[v], x.dzSum, {bi, keyAt[v]}, counts[v]);
    // d_e[b, j, c] = deTot[c, j - j0] for the tile's keys.
    Value tileKeys = k.mins(k.sub(keys, j0), k.idx(TK));
    k.forLoop(c0, tileKeys, c1, [&](Value l) {
      k.forLoop(c0, width, c1, [&](Value c) {
        k.store(k.load(deTot, {c, l}), x.de, {bi, k.add(j0, l), c});
      });
    });

    // B. Σ_i dz_ij u_i: blocks of kSumKeys keys x kSumChunks column chunks.
    k.forLoop(c0, k.ceilDiv(tileKeys, k.idx(kSumKeys)), c1, [&](Value kg) {
      Value l0 = k.mul(kg, k.idx(kSumKeys));
      // Keys past the end read the tile's last key (in the scratch) and are
      // not stored.
      SmallVector<Value> ls;
      for (int64_t r = 0; r < kSumKeys; ++r)
        ls.push_back(k.mins(k.add(l0, k.idx(r)), k.sub(tileKeys, c1)));
      forEachChunkGroup(k, model, kSumChunks, [&](ArrayRef<Value> cols,
                                                  ArrayRef<Value> colCounts) {
        auto store = [&](ValueRange acc, bool first) {
          for (int64_t r = 0; r < kSumKeys; ++r) {
            Value j = k.add(j0, k.add(l0, k.idx(r)));
            k.ifThen(k.cmpi(arith::CmpIPredicate::ult, k.add(l0, k.idx(r)),
                            tileKeys),
                     [&] {
                       for (int64_t q = 0; q < kSumChunks; ++q) {
                         Value a = acc[r * kSumChunks + q];
                         if (!first)
                           a = k.fadd(k.vloadMasked(x.dzU, {bi, j, cols[q]},
                                                    colCounts[q], 0.0),
                                      a);
                         k.vstoreMasked(a, x.dzU, {bi, j, cols[q]},
                                        colCounts[q]);
                       }
                     });
          }
        };
        SmallVector<Value> init(kSumKeys * kSumChunks, zeros);
        k.forLoop(c0, rows, fold, [&](Value i0) {
          Value i1 = k.mins(k.add(i0, fold), rows);
          SmallVector<Value> acc = k.forLoop(
              i0, i1, c1, init,
              [&](Value i, ValueRange a) -> SmallVector<Value> {
                SmallVector<Value> uc;
                for (int64_t q = 0; q < kSumChunks; ++q)
                  uc.push_back(k.vloadMasked(x.u, {bi, i, cols[q]},
                                             colCounts[q], 0.0));
                SmallVector<Value> next;
                for (int64_t r = 0; r < kSumKeys; ++r) {
                  Value w = k.splat(k.load(dzBuf, {i, ls[r]}), kLanes);
                  for (int64_t q = 0; q < kSumChunks; ++q)
                    next.push_back(
                        k.fma(w, uc[q], a[r * kSumChunks + q]));
                }
                return next;
              });
          Value first = k.cmpi(arith::CmpIPredicate::eq, i0, c0);
          k.ifThen(first, [&] { store(acc, true); });
          k.ifThen(k.notI1(first), [&] { store(acc, false); });
        });
      });
    });
  });
}

/// kChains chunks a step for the sums that run over a long index: one
/// accumulator a chunk would wait on the FMA latency each step; four
/// independent ones do not, and each element's sum keeps its order.
constexpr int64_t kChains = 4;

/// What the passes of the attention_posterior_grad kernel share: the index
/// constants 0 and 1, a zero vector, the sizes and the heads h*[b] it reads
/// (i32 [B]; 0 for a skipped batch element).
struct PosteriorGradShape {
  Value c0, c1, zeros;
  Value batch, heads, keys, model, headDim;
  Value head;

  /// h*[b] as an index.
  Value headOf(CpuKernelBuilder &k, Value bi) const {
    return k.castInt(k.load(head, {bi}), k.b.getIndexType());
  }
  /// body(col, count) over the kLanes-wide chunks of [0, n).
  void widthLoop(CpuKernelBuilder &k, Value n,
                 function_ref<void(Value col, Value count)> body) const {
    k.forLoop(c0, k.ceilDiv(n, k.idx(kLanes)), c1, [&](Value c) {
      Value col = k.mul(c, k.idx(kLanes));
      body(col, k.sub(n, col));
    });
  }
};

/// The buffers of pass 4a (emitDmAndDv).
struct ValueGradBuffers {
  Value dzU, dzSum, mValues, wo;
  /// Written: dm [B, Nk, D] and d_v [B, H, Nk, Dh].
  Value dm, dv;
};

/// Pass 4a: dm[b,j,:] = (Σ_i dz_ij u_i - (Σ_i dz_ij) m_j) · c/σ² (`cOverS2`,
/// splat) and d_v[b,h,j,c] = Σ_d dm[b,j,d] wo[d, h·Dh + c] (0 off h*), a
/// worker item per (b, key) when the work (`meanWork`) is large.
void emitDmAndDv(CpuKernelBuilder &k, const KernelOptions &opts,
                 const PosteriorGradShape &s, const ValueGradBuffers &x,
                 Value cOverS2, Value meanWork) {
  Value c0 = s.c0, c1 = s.c1, zeros = s.zeros, keys = s.keys;
  Value dzU = x.dzU, dzSum = x.dzSum, mValues = x.mValues, wo = x.wo, dm = x.dm,
        dv = x.dv;
  workersIfLarge(
      k, opts, k.mul(s.batch, keys), meanWork, [&](Value item, Value) {
        Value bi = k.divu(item, keys), j = k.remu(item, keys);
        Value h = s.headOf(k, bi);
        Value r = k.splat(k.load(dzSum, {bi, j}), kLanes);
        s.widthLoop(k, s.model, [&](Value col, Value count) {
          Value a = k.vloadMasked(dzU, {bi, j, col}, count, 0.0);
          Value mj = k.vloadMasked(mValues, {bi, j, col}, count, 0.0);
          k.vstoreMasked(k.fmul(k.fsub(a, k.fmul(r, mj)), cOverS2), dm,
                         {bi, j, col}, count);
        });
        k.forLoop(c0, s.heads, c1, [&](Value hh) {
          Value chosen = k.cmpi(arith::CmpIPredicate::eq, hh, h);
          Value col0 = k.mul(hh, s.headDim);
          forEachChunkGroup(
              k, s.headDim, kChains,
              [&](ArrayRef<Value> cols, ArrayRef<Value> counts) {
                // d_v[b,h,j,c] = Σ_d dm[b,j,d] wo[d, h·Dh + c] (0 off h*)
                SmallVector<Value> init(kChains, zeros);
                SmallVector<Value> acc = k.forLoop(
                    c0, k.select(chosen, s.model, c0), c1, init,
                    [&](Value d, ValueRange a) -> SmallVector<Value> {
                      Value m = k.splat(k.load(dm, {bi, j, d}), kLanes);
                      SmallVector<Value> next;
                      for (int64_t q = 0; q < kChains; ++q) {
                        Value at = k.add(col0, cols[q]);
                        Value w = k.vloadMasked(wo, {d, at}, counts[q], 0.0);
                        next.push_back(k.fma(m, w, a[q]));
                      }
                      return next;
                    });
                for (int64_t q = 0; q < kChains; ++q)
                  k.vstoreMasked(acc[q], dv, {bi, hh, j, cols[q]}, counts[q]);
              });
        });
      });
}

/// Pass 4b: d_wo[d, h*·Dh + c] = Σ_{b,j} dm[b,j,d] v[b,h*,j,c], zero in the
/// columns of the other heads, into `dwo` [D, H·Dh].
void emitDwo(CpuKernelBuilder &k, const KernelOptions &opts,
             const PosteriorGradShape &s, Value dm, Value v, Value meanWork,
             Value dwo) {
  Value c0 = s.c0, c1 = s.c1, zeros = s.zeros, batch = s.batch, keys = s.keys,
        model = s.model, headDim = s.headDim;
  // d_wo[d, h*·Dh + c] = Σ_{b,j} dm[b,j,d] v[b,h*,j,c]: an item is
  // kWoRows rows d, so that each v chunk read (v[b, h*] is 4 MB at the
  // prefill size, streamed from L3 per item) serves kWoRows rows; one row an
  // item read all of v again per row (~5% of the backward).
  const int64_t kWoRows = opts.vectorBits >= 512 ? 6 : 2;
  const int64_t kWoChains = opts.vectorBits >= 512 ? kChains : 2;
  Value cols = k.mul(s.heads, headDim);
  Value woRows = k.idx(kWoRows);
  workersIfLarge(
      k, opts, k.ceilDiv(model, woRows), meanWork, [&](Value item, Value) {
        Value d0 = k.mul(item, woRows);
        Value n = k.mins(k.sub(model, d0), woRows);
        // Rows past the end read the last row and are not stored.
        SmallVector<Value> ds;
        for (int64_t r = 0; r < kWoRows; ++r)
          ds.push_back(k.add(d0, k.mins(k.idx(r), k.sub(n, c1))));
        k.forLoop(d0, k.add(d0, n), c1, [&](Value d) {
          s.widthLoop(k, cols, [&](Value col, Value count) {
            k.vstoreMasked(zeros, dwo, {d, col}, count);
          });
        });
        k.forLoop(c0, batch, c1, [&](Value bi) {
          Value h = s.headOf(k, bi);
          Value col0 = k.mul(h, headDim);
          forEachChunkGroup(
              k, headDim, kWoChains,
              [&](ArrayRef<Value> at, ArrayRef<Value> counts) {
                SmallVector<Value> init;
                for (int64_t r = 0; r < kWoRows; ++r)
                  for (int64_t q = 0; q < kWoChains; ++q)
                    init.push_back(k.vloadMasked(
                        dwo, {ds[r], k.add(col0, at[q])}, counts[q], 0.0));
                SmallVector<Value> acc = k.forLoop(
                    c0, keys, c1, init,
                    [&](Value j, ValueRange a) -> SmallVector<Value> {
                      SmallVector<Value> x;
                      for (int64_t q = 0; q < kWoChains; ++q)
                        x.push_back(k.vloadMasked(v, {bi, h, j, at[q]},
                                                  counts[q], 0.0));
                      SmallVector<Value> next;
                      for (int64_t r = 0; r < kWoRows; ++r) {
                        Value m = k.splat(k.load(dm, {bi, j, ds[r]}), kLanes);
                        for (int64_t q = 0; q < kWoChains; ++q)
                          next.push_back(k.fma(m, x[q], a[r * kWoChains + q]));
                      }
                      return next;
                    });
                for (int64_t r = 0; r < kWoRows; ++r)
                  k.ifThen(k.cmpi(arith::CmpIPredicate::ult, k.idx(r), n), [&] {
                    for (int64_t q = 0; q < kWoChains; ++q)
                      k.vstoreMasked(acc[r * kWoChains + q], dwo,
                                     {ds[r], k.add(col0, at[q])}, counts[q]);
                  });
              });
        });
      });
}

struct AttentionPosteriorGradKernel
    : KernelPattern<AttentionPosteriorGradOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(AttentionPosteriorGradOp op, CpuKernelBuilder &k,
                     PatternRewriter &rw) const override {
    if (op.getHeadSelect() != HeadSelect::min_entropy)
      return rw.notifyMatchFailure(op, "head_select = all: portable lowering");
    if (hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    Value headCount = getValueOrCreateConstantIndexOp(
        rw, op.getLoc(),
        tensor::getMixedSize(rw, op.getLoc(), op.getScores(), 1));
    if (failed(checkIndexOperand(rw, op, op.getHead(), headCount,
                                 lowering::IndexErrorOp::AttentionHead)))
      return failure();
    // d_scores, d_u, d_v, d_wo, d_e.
    KernelScope kernel = KernelScope::gradientsOf(
        k, op, {op.getScores(), op.getU(), op.getV(), op.getWo(), op.getE()},
        {op.getHead(), op.getDp()});
    Type f32 = k.f32();
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value scores = k.buffer(op.getScores()), u = k.buffer(op.getU());
    Value v = k.buffer(op.getV()), wo = k.buffer(op.getWo());
    Value eIn = k.buffer(op.getE()), headIn = k.buffer(op.getHead());
    Value dp = k.buffer(op.getDp());
    Value batch = k.dim(scores, 0), heads = k.dim(scores, 1);
    // h*[b] in [0, H) (reported above when not).
    Value headsI32 = k.castInt(heads, k.i32());
    auto headInRange = [&](Value bi) {
      return idInRange(k, k.load(headIn, {bi}), headsI32);
    };
    // The heads the passes read: 0 for a skipped batch element.
    Value head = k.alloc(MemRefType::get({kDyn}, k.i32()), {batch});
    k.forLoop(c0, batch, c1, [&](Value bi) {
      Value h = k.load(headIn, {bi});
      Value ok = idInRange(k, h, headsI32);
      k.store(k.select(ok, h, k.cI32(0)), head, {bi});
    });
    Value rows = k.dim(scores, 2), keys = k.dim(scores, 3);
    Value model = k.dim(u, 2), headDim = k.dim(v, 3), width = k.dim(eIn, 2);
    float sigma = op.getSigma().convertToFloat();
    float sigma2 = sigma * sigma;
    Value zeros = k.constLike(k.vf32(), 0.0);
    auto rank3 = MemRefType::get({kDyn, kDyn, kDyn}, f32);
    const PosteriorGradShape shape{c0,   c1,    zeros,   batch, heads,
                                   keys, model, headDim, head};
    auto headOf = [&](CpuKernelBuilder &kk, Value bi) {
      return shape.headOf(kk, bi);
    };
    auto widthLoop = [&](Value n,
                         function_ref<void(Value col, Value count)> body) {
      shape.widthLoop(k, n, body);
    };

    // e with its non-finite entries zeroed (they get no gradient and enter
    // <dp_i, e_j> as 0, as in autograd of the reference).
    Value e = k.alloc(rank3, {batch, keys, width});
    Value posInfV = k.constLike(k.vf32(), std::numeric_limits<float>::infinity());
    // to = from ([B, Nk, K] f32, or e itself) where e is finite, else 0.
    auto zeroWhereENonFinite = [&](Value from, Value to) {
      k.forLoop(c0, batch, c1, [&](Value bi) {
        k.forLoop(c0, keys, c1, [&](Value j) {
          widthLoop(width, [&](Value col, Value count) {
            Value x = k.vloadMasked(eIn, {bi, j, col}, count, 0.0);
            Value finite =
                k.cmpf(arith::CmpFPredicate::ONE, k.fabs(x), posInfV);
            Value y =
                from == eIn ? x : k.vloadMasked(from, {bi, j, col}, count, 0.0);
            k.vstoreMasked(k.select(finite, y, zeros), to, {bi, j, col}, count);
          });
        });
      });
    };
    zeroWhereENonFinite(eIn, e);

    // 1. Head means of h*, p and lse recomputed by the forward kernel.
    Value scale = headScaleValue(k, op.getEffectiveHeadScale(), heads);
    HeadMeans means =
        packHeadMeans(k, opts, v, wo, head, scale, batch, keys, model, headDim);
    Value keysPad = means.keysPad;
    Value modelPad = roundUp(k, model, kLanes);
    Value rowsPad = roundUp(k, rows, kKeyTile);
    auto logits = posteriorLogits(scores, head, means.norm2, keys, sigma2);
    Value p = k.alloc(rank3, {batch, rows, width});
    Value lse = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rows});
    FlashSpec fwd = flashSpec(k, u, means.keysT, keysPad, e, p, batch, rows,
                              keys, model, logits);
    fwd.lse = lse;
    fwd.tilesPerBlock = 1; // as the forward's (AttentionPosterior.cpp)
    emitFlashMix(k, opts, fwd);
    Value widthPad = fwd.widthPad;
    auto [lseRow, delta] =
        gradRowStats(k, lse, p, dp, batch, rows, width, widthPad, rowsPad);
    // A skipped batch element: lse' = +inf on its rows, so G = 0.
    Value posInf = k.cF32(std::numeric_limits<float>::infinity());
    k.forLoop(c0, batch, c1, [&](Value bi) {
      k.ifThen(k.notI1(headInRange(bi)), [&] {
        k.forLoop(c0, rowsPad, c1, [&](Value i) {
          k.store(posInf, lseRow, {bi, i});
        });
      });
    });

    // m as rows [B, keysPad, modelPad] (zero padding): the values of the
    // query-major pass and the rows of the key-major pass.
    Value mValues = k.alloc(rank3, {batch, keysPad, modelPad});
    k.forLoop(c0, batch, c1, [&](Value bi) {
      k.forLoop(c0, keysPad, c1, [&](Value j) {
        Value jt = k.divu(j, k.idx(kKeyTile)), jl = k.remu(j, k.idx(kKeyTile));
        k.forLoop(c0, modelPad, c1, [&](Value d) {
          Value in = k.cmpi(arith::CmpIPredicate::ult, d, model);
          Value dc = k.mins(d, k.sub(model, c1));
          k.store(k.select(in, k.load(means.keysT, {bi, jt, dc, jl}),
                           k.cF32(0.0)),
                  mValues, {bi, j, d});
        });
      });
    });

    // d_scores: zero on every head but h*, whose entries pass 2 writes.
    Value dScores = kernel.out(0);
    k.workers(opts, k.mul(k.mul(batch, heads), rows), [&](Value item, Value) {
      Value i = k.remu(item, rows), bh = k.divu(item, rows);
      Value h = k.remu(bh, heads), bi = k.divu(bh, heads);
      widthLoop(keys, [&](Value col, Value count) {
        k.vstoreMasked(zeros, dScores, {bi, h, i, col}, count);
      });
    });

    Value invS2 = k.constLike(k.vf32(), 1.0 / sigma2);

    // 2. Query-major: d_u, and G into d_scores.
    Value eT = packKeysT(k, opts, e, batch, keys, width);
    Value du = kernel.out(1);
    FlashGradSpec byQuery({u, means.keysT, model}, {dp, eT, width}, batch, rows,
                          keys);
    byQuery.weights = [&](CpuKernelBuilder &kk, Value sDot, Value gDot, Value,
                          Value bi, Value i,
                          Value j0) -> std::pair<Value, Value> {
      SoftmaxGrad sg =
          queryRowGrad(kk, logits, lseRow, delta, sDot, gDot, bi, i, j0);
      Value g = sg.prob, dz = sg.dlogit;
      // G for pass 3, which turns it into dz. Rows past the end repeat the
      // last row: the same values again.
      kk.vstoreMasked(g, dScores, {bi, headOf(kk, bi), i, j0},
                      kk.sub(keys, j0));
      return {g, kk.fmul(dz, invS2)};
    };
    byQuery.accumulators.push_back({mValues, du, model, modelPad, true});
    emitFlashGrad(k, opts, byQuery);

    // 3. Key-major, over the G that pass 2 left in d_scores[b, h*]: no
    //    logit is recomputed (keyMajorSums).
    Value de = kernel.out(4);
    Value dzU = k.alloc(rank3, {batch, keys, model});
    Value dzSum = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, keys});
    keyMajorSums(k, opts, {dScores, head, eT, dp, delta, u, de, dzU, dzSum},
                 batch, rows, keys, model, width);
    // d_e is 0 at a non-finite e entry.
    zeroWhereENonFinite(de, de);

    // 4. dm (c/σ² folded in), d_v and d_wo.
    Value dm = k.alloc(rank3, {batch, keys, model});
    Value dv = kernel.out(2);
    Value cOverS2 = k.splat(k.fdiv(scale, k.cF32(sigma2)), kLanes);
    Value meanWork = k.mul(k.mul(k.mul(batch, keys), model), headDim);
    emitDmAndDv(k, opts, shape, {dzU, dzSum, mValues, wo, dm, dv}, cOverS2,
                meanWork);
    emitDwo(k, opts, shape, dm, v, meanWork, kernel.out(3));

    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateAttentionPosteriorGradKernel, AttentionPosteriorGradKernel)

} // namespace mlir::moe::cpu
