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
//  3. key-major over that G (KeyMajorSums: one item per key tile, no logit
//     recomputed): dz written over G, d_e_j = Σ_i G_ij dp_i, Σ_i dz_ij and
//     Σ_i dz_ij u_i (register blocks of keys x columns). A second tiled pass
//     that recomputed z (D-deep dot, exp) cost a quarter more of the backward
//     at B = 16, N = Nk = 1024, D = 256 (420-440 -> 317-331 ms, Xeon);
//  4. per key dm_j = c (Σ_i dz_ij u_i − (Σ_i dz_ij) m_j) / σ², then
//     d_v[b, h*, j] = dm_j W_h* and d_wo[:, h* block] = Σ_{b,j} dm_j ⊗ v_j
//     (a worker per block of rows of wo, a fixed order over (b, j)).
// An h* outside [0, H) is reported first (the portable lowering's check,
// linalg_lowering::emitIndexCheck) and its batch element skipped: the passes
// read head 0 in its place (in bounds) and its rows get lse' = +inf, so that
// every weight G, and with it every gradient of the element, is 0 (the
// portable lowering's result, where no head matches h*).
// Extra memory: packed copies of u, m, e (O(B·(N + Nk)·(D + K))) and
// per-worker tiles ([N, 32] f32 of dz in pass 3). Every sum has one writer:
// deterministic whatever the thread count.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"
#include "Lowerings.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/SegmentedStats.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
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
    CpuKernelBuilder &kb, Value n, int64_t chains,
    function_ref<void(ArrayRef<Value> cols, ArrayRef<Value> counts)> body) {
  Value c0 = kb.idx(0), step = kb.idx(chains * kLanes);
  kb.forLoop(c0, kb.ceilDiv(n, step), kb.idx(1), [&](Value g) {
    SmallVector<Value> cols, counts;
    for (int64_t q = 0; q < chains; ++q) {
      Value col = kb.add(kb.mul(g, step), kb.idx(q * kLanes));
      Value count = kb.sub(n, col);
      cols.push_back(
          kb.select(kb.cmpi(arith::CmpIPredicate::sgt, count, c0), col, c0));
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
class KeyMajorSums {
public:
  static constexpr int64_t TK = kKeyTile, KV = TK / kLanes;

  KeyMajorSums(CpuKernelBuilder &kb, const KernelOptions &opts,
               const KeyMajorBuffers &x, Value batch, Value rows, Value keys,
               Value model, Value width)
      : kb(kb), opts(opts), x(x), batch(batch), rows(rows), keys(keys),
        model(model), width(width),
        // AVX-512: 4 x 4 accumulators and 4 u chunks of 32 zmm; AVX2 (two
        // ymm a 16-lane vector): 2 x 2 and 2 chunks of 16 ymm.
        sumKeys(opts.vectorBits >= 512 ? 4 : 2), sumChunks(sumKeys) {
    c0 = kb.idx(0);
    c1 = kb.idx(1);
    zeros = kb.constLike(kb.vf32(), 0.0);
    keyTiles = kb.ceilDiv(keys, kb.idx(TK));
    fold = kb.idx(kFoldRows);
    ahead = kb.idx(kPrefetchRows);
    lastRow = kb.sub(rows, c1);
  }

  /// The passes, one worker item per (b, key tile).
  void emit() {
    Value dePartAll = perWorker({kDyn, TK}, {width});
    Value deTotAll = perWorker({kDyn, TK}, {width});
    Value dzAll = perWorker({kDyn, TK}, {rows});
    Value work = kb.mul(kb.mul(kb.mul(batch, rows), keys),
                        kb.add(model, kb.add(width, width)));
    workersIfLarge(kb, opts, kb.mul(batch, keyTiles), work,
                   [&](Value item, Value worker) {
                     Tile t = openTile(item, worker, dePartAll, deTotAll, dzAll);
                     SmallVector<Value> dzSum = dzAndDeOfTile(t);
                     Value tileKeys = storeTileSums(t, dzSum);
                     sumDzTimesU(t, tileKeys);
                   });
  }

private:
  /// One worker item: key tile jt (keys j0..j0 + TK) of batch element bi at
  /// its head h, and the worker's scratch.
  struct Tile {
    Value bi, jt, j0, h;
    Value dePart, deTot, dzBuf;
    /// Key vector v: its first key and the lanes inside [0, keys) (a vector
    /// past the end reads and writes nothing; its index is 0, inside).
    SmallVector<Value> counts, keyAt;
  };

  Value perWorker(ArrayRef<int64_t> shape, ValueRange dyn) {
    return kb.scratch(opts, MemRefType::get(shape, kb.f32()), dyn);
  }

  Tile openTile(Value item, Value worker, Value dePartAll, Value deTotAll,
                Value dzAll) {
    Tile t;
    t.bi = kb.divu(item, keyTiles);
    t.jt = kb.remu(item, keyTiles);
    t.j0 = kb.mul(t.jt, kb.idx(TK));
    t.h = kb.castInt(kb.load(x.head, {t.bi}), kb.b.getIndexType());
    t.dePart = kb.workerSlice(dePartAll, worker);
    t.deTot = kb.workerSlice(deTotAll, worker);
    t.dzBuf = kb.workerSlice(dzAll, worker);
    for (int64_t v = 0; v < KV; ++v) {
      Value j = kb.add(t.j0, kb.idx(v * kLanes));
      t.counts.push_back(kb.sub(keys, j));
      t.keyAt.push_back(kb.select(
          kb.cmpi(arith::CmpIPredicate::sgt, t.counts.back(), c0), j, c0));
    }
    return t;
  }

  /// Zeroes a [width, TK] scratch of d_e columns.
  void zeroDeColumns(Value buf) {
    kb.forLoop(c0, width, c1, [&](Value c) {
      for (int64_t v = 0; v < KV; ++v)
        kb.vstore(zeros, buf, {c, kb.idx(v * kLanes)});
    });
  }

  /// A: over the rows in kFoldRows blocks, dz into d_scores and the dz
  /// scratch, d_e of the tile's keys into t.deTot; returns Σ_i dz_ij (one
  /// vector per key vector).
  SmallVector<Value> dzAndDeOfTile(const Tile &t) {
    zeroDeColumns(t.deTot);
    Value full =
        kb.cmpi(arith::CmpIPredicate::ule, kb.add(t.j0, kb.idx(TK)), keys);
    SmallVector<Value> sumInit(KV, zeros);
    return kb.forLoop(
        c0, rows, fold, sumInit,
        [&](Value i0, ValueRange tot) -> SmallVector<Value> {
          zeroDeColumns(t.dePart);
          Value i1 = kb.mins(kb.add(i0, fold), rows);
          SmallVector<Value> part = kb.forLoop(
              i0, i1, c1, sumInit,
              [&](Value i, ValueRange acc) -> SmallVector<Value> {
                return dzOfRow(t, full, i, acc);
              });
          addDeBlock(t);
          SmallVector<Value> next;
          for (int64_t v = 0; v < KV; ++v)
            next.push_back(kb.fadd(tot[v], part[v]));
          return next;
        });
  }

  /// Row i of A: G of the tile's keys, <dp_i, e_j> with d_e_j += G_ij dp_i
  /// into t.dePart, dz stored; returns `acc` + dz.
  SmallVector<Value> dzOfRow(const Tile &t, Value full, Value i,
                             ValueRange acc) {
    SmallVector<Value> sumInit(KV, zeros);
    // Whole key vectors or the ragged last tile (masked).
    SmallVector<Value> g(KV);
    for (int64_t v = 0; v < KV; ++v) {
      // Rows are Nk·4 bytes apart (a page at Nk = 1024), which no hardware
      // prefetcher follows: the tile of the row kPrefetchRows ahead is
      // fetched now (it is also written).
      Value next = kb.mins(kb.add(i, ahead), lastRow);
      memref::PrefetchOp::create(kb.b, x.dScores,
                                 ValueRange{t.bi, t.h, next, t.keyAt[v]},
                                 /*isWrite=*/true, /*localityHint=*/3,
                                 /*isDataCache=*/true);
      g[v] = kb.vloadMasked(x.dScores, {t.bi, t.h, i, t.keyAt[v]},
                            t.counts[v], 0.0);
    }
    // <dp_i, e_j> for the tile's keys and d_e_j += G_ij dp_i.
    SmallVector<Value> dot = kb.forLoop(
        c0, width, c1, sumInit,
        [&](Value c, ValueRange d) -> SmallVector<Value> {
          Value dpc = kb.splat(kb.loadF(x.dp, {t.bi, i, c}), kLanes);
          SmallVector<Value> next;
          for (int64_t v = 0; v < KV; ++v) {
            Value col = kb.idx(v * kLanes);
            next.push_back(
                kb.fma(dpc, kb.vload(x.eT, {t.bi, t.jt, c, col}), d[v]));
            kb.vstore(kb.fma(dpc, g[v], kb.vload(t.dePart, {c, col})),
                      t.dePart, {c, col});
          }
          return next;
        });
    Value d = kb.splat(kb.load(x.delta, {t.bi, i}), kLanes);
    SmallVector<Value> next;
    for (int64_t v = 0; v < KV; ++v) {
      Value dz = kb.fmul(g[v], kb.fsub(dot[v], d));
      kb.splitFull(full, [&](bool whole) {
        kb.vstorePart(whole, dz, x.dScores, {t.bi, t.h, i, t.keyAt[v]},
                      t.counts[v]);
      });
      // Pass B broadcasts dz into FMAs: a subnormal would cost a microcode
      // assist in each (FlashGrad.cpp).
      dz = kb.flushSubnormal(dz);
      kb.vstore(dz, t.dzBuf, {i, kb.idx(v * kLanes)});
      next.push_back(kb.fadd(acc[v], dz));
    }
    return next;
  }

  /// t.deTot += t.dePart (one kFoldRows block's d_e).
  void addDeBlock(const Tile &t) {
    kb.forLoop(c0, width, c1, [&](Value c) {
      for (int64_t v = 0; v < KV; ++v) {
        Value col = kb.idx(v * kLanes);
        kb.vstore(kb.fadd(kb.vload(t.deTot, {c, col}),
                          kb.vload(t.dePart, {c, col})),
                  t.deTot, {c, col});
      }
    });
  }

  /// Σ_i dz_ij and d_e[b, j, c] = deTot[c, j - j0] for the tile's keys;
  /// returns the count of the tile's keys.
  Value storeTileSums(const Tile &t, ArrayRef<Value> dzSum) {
    for (int64_t v = 0; v < KV; ++v)
      kb.vstoreMasked(dzSum[v], x.dzSum, {t.bi, t.keyAt[v]}, t.counts[v]);
    Value tileKeys = kb.mins(kb.sub(keys, t.j0), kb.idx(TK));
    kb.forLoop(c0, tileKeys, c1, [&](Value l) {
      kb.forLoop(c0, width, c1, [&](Value c) {
        kb.store(kb.load(t.deTot, {c, l}), x.de, {t.bi, kb.add(t.j0, l), c});
      });
    });
    return tileKeys;
  }

  /// B: Σ_i dz_ij u_i from the dz scratch, blocks of sumKeys keys x
  /// sumChunks column chunks.
  void sumDzTimesU(const Tile &t, Value tileKeys) {
    kb.forLoop(c0, kb.ceilDiv(tileKeys, kb.idx(sumKeys)), c1, [&](Value kg) {
      Value l0 = kb.mul(kg, kb.idx(sumKeys));
      // Keys past the end read the tile's last key (in the scratch) and are
      // not stored.
      SmallVector<Value> ls;
      for (int64_t r = 0; r < sumKeys; ++r)
        ls.push_back(kb.mins(kb.add(l0, kb.idx(r)), kb.sub(tileKeys, c1)));
      forEachChunkGroup(kb, model, sumChunks, [&](ArrayRef<Value> cols,
                                                  ArrayRef<Value> colCounts) {
        SmallVector<Value> init(sumKeys * sumChunks, zeros);
        kb.forLoop(c0, rows, fold, [&](Value i0) {
          Value i1 = kb.mins(kb.add(i0, fold), rows);
          SmallVector<Value> acc = kb.forLoop(
              i0, i1, c1, init,
              [&](Value i, ValueRange a) -> SmallVector<Value> {
                SmallVector<Value> uc;
                for (int64_t q = 0; q < sumChunks; ++q)
                  uc.push_back(kb.vloadMasked(x.u, {t.bi, i, cols[q]},
                                              colCounts[q], 0.0));
                SmallVector<Value> next;
                for (int64_t r = 0; r < sumKeys; ++r) {
                  Value w = kb.splat(kb.load(t.dzBuf, {i, ls[r]}), kLanes);
                  for (int64_t q = 0; q < sumChunks; ++q)
                    next.push_back(kb.fma(w, uc[q], a[r * sumChunks + q]));
                }
                return next;
              });
          Value first = kb.cmpi(arith::CmpIPredicate::eq, i0, c0);
          kb.ifThen(first, [&] {
            storeDzU(t, tileKeys, l0, cols, colCounts, acc, true);
          });
          kb.ifThen(kb.notI1(first), [&] {
            storeDzU(t, tileKeys, l0, cols, colCounts, acc, false);
          });
        });
      });
    });
  }

  /// A block's Σ_i dz_ij u_i (`acc`, keys l0.. x the chunks `cols`) into
  /// x.dzU: stored by the first kFoldRows block, added by the others.
  void storeDzU(const Tile &t, Value tileKeys, Value l0, ArrayRef<Value> cols,
                ArrayRef<Value> colCounts, ValueRange acc, bool first) {
    for (int64_t r = 0; r < sumKeys; ++r) {
      Value j = kb.add(t.j0, kb.add(l0, kb.idx(r)));
      kb.ifThen(kb.cmpi(arith::CmpIPredicate::ult, kb.add(l0, kb.idx(r)),
                        tileKeys),
                [&] {
                  for (int64_t q = 0; q < sumChunks; ++q) {
                    Value a = acc[r * sumChunks + q];
                    if (!first)
                      a = kb.fadd(kb.vloadMasked(x.dzU, {t.bi, j, cols[q]},
                                                 colCounts[q], 0.0),
                                  a);
                    kb.vstoreMasked(a, x.dzU, {t.bi, j, cols[q]},
                                    colCounts[q]);
                  }
                });
    }
  }

  CpuKernelBuilder &kb;
  const KernelOptions &opts;
  const KeyMajorBuffers &x;
  Value batch, rows, keys, model, width;
  const int64_t sumKeys, sumChunks;
  Value c0, c1, zeros, keyTiles, fold, ahead, lastRow;
};

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
  Value headOf(CpuKernelBuilder &kb, Value bi) const {
    return kb.castInt(kb.load(head, {bi}), kb.b.getIndexType());
  }
  /// body(col, count) over the kLanes-wide chunks of [0, n).
  void widthLoop(CpuKernelBuilder &kb, Value n,
                 function_ref<void(Value col, Value count)> body) const {
    kb.forLoop(c0, kb.ceilDiv(n, kb.idx(kLanes)), c1, [&](Value c) {
      Value col = kb.mul(c, kb.idx(kLanes));
      body(col, kb.sub(n, col));
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
void emitDmAndDv(CpuKernelBuilder &kb, const KernelOptions &opts,
                 const PosteriorGradShape &s, const ValueGradBuffers &x,
                 Value cOverS2, Value meanWork) {
  Value c0 = s.c0, c1 = s.c1, zeros = s.zeros, keys = s.keys;
  Value dzU = x.dzU, dzSum = x.dzSum, mValues = x.mValues, wo = x.wo, dm = x.dm,
        dv = x.dv;
  workersIfLarge(
      kb, opts, kb.mul(s.batch, keys), meanWork, [&](Value item, Value) {
        Value bi = kb.divu(item, keys), j = kb.remu(item, keys);
        Value h = s.headOf(kb, bi);
        Value r = kb.splat(kb.load(dzSum, {bi, j}), kLanes);
        s.widthLoop(kb, s.model, [&](Value col, Value count) {
          Value a = kb.vloadMasked(dzU, {bi, j, col}, count, 0.0);
          Value mj = kb.vloadMasked(mValues, {bi, j, col}, count, 0.0);
          kb.vstoreMasked(kb.fmul(kb.fsub(a, kb.fmul(r, mj)), cOverS2), dm,
                         {bi, j, col}, count);
        });
        kb.forLoop(c0, s.heads, c1, [&](Value hh) {
          Value chosen = kb.cmpi(arith::CmpIPredicate::eq, hh, h);
          Value col0 = kb.mul(hh, s.headDim);
          forEachChunkGroup(
              kb, s.headDim, kChains,
              [&](ArrayRef<Value> cols, ArrayRef<Value> counts) {
                // d_v[b,h,j,c] = Σ_d dm[b,j,d] wo[d, h·Dh + c] (0 off h*)
                SmallVector<Value> init(kChains, zeros);
                SmallVector<Value> acc = kb.forLoop(
                    c0, kb.select(chosen, s.model, c0), c1, init,
                    [&](Value d, ValueRange a) -> SmallVector<Value> {
                      Value m = kb.splat(kb.load(dm, {bi, j, d}), kLanes);
                      SmallVector<Value> next;
                      for (int64_t q = 0; q < kChains; ++q) {
                        Value at = kb.add(col0, cols[q]);
                        Value w = kb.vloadMasked(wo, {d, at}, counts[q], 0.0);
                        next.push_back(kb.fma(m, w, a[q]));
                      }
                      return next;
                    });
                for (int64_t q = 0; q < kChains; ++q)
                  kb.vstoreMasked(acc[q], dv, {bi, hh, j, cols[q]}, counts[q]);
              });
        });
      });
}

/// Pass 4b: d_wo[d, h*·Dh + c] = Σ_{b,j} dm[b,j,d] v[b,h*,j,c], zero in the
/// columns of the other heads, into `dwo` [D, H·Dh].
void emitDwo(CpuKernelBuilder &kb, const KernelOptions &opts,
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
  Value cols = kb.mul(s.heads, headDim);
  Value woRows = kb.idx(kWoRows);
  workersIfLarge(
      kb, opts, kb.ceilDiv(model, woRows), meanWork, [&](Value item, Value) {
        Value d0 = kb.mul(item, woRows);
        Value n = kb.mins(kb.sub(model, d0), woRows);
        // Rows past the end read the last row and are not stored.
        SmallVector<Value> ds;
        for (int64_t r = 0; r < kWoRows; ++r)
          ds.push_back(kb.add(d0, kb.mins(kb.idx(r), kb.sub(n, c1))));
        kb.forLoop(d0, kb.add(d0, n), c1, [&](Value d) {
          s.widthLoop(kb, cols, [&](Value col, Value count) {
            kb.vstoreMasked(zeros, dwo, {d, col}, count);
          });
        });
        kb.forLoop(c0, batch, c1, [&](Value bi) {
          Value h = s.headOf(kb, bi);
          Value col0 = kb.mul(h, headDim);
          forEachChunkGroup(
              kb, headDim, kWoChains,
              [&](ArrayRef<Value> at, ArrayRef<Value> counts) {
                SmallVector<Value> init;
                for (int64_t r = 0; r < kWoRows; ++r)
                  for (int64_t q = 0; q < kWoChains; ++q)
                    init.push_back(kb.vloadMasked(
                        dwo, {ds[r], kb.add(col0, at[q])}, counts[q], 0.0));
                SmallVector<Value> acc = kb.forLoop(
                    c0, keys, c1, init,
                    [&](Value j, ValueRange a) -> SmallVector<Value> {
                      SmallVector<Value> x;
                      for (int64_t q = 0; q < kWoChains; ++q)
                        x.push_back(kb.vloadMasked(v, {bi, h, j, at[q]},
                                                  counts[q], 0.0));
                      SmallVector<Value> next;
                      for (int64_t r = 0; r < kWoRows; ++r) {
                        Value m = kb.splat(kb.load(dm, {bi, j, ds[r]}), kLanes);
                        for (int64_t q = 0; q < kWoChains; ++q)
                          next.push_back(kb.fma(m, x[q], a[r * kWoChains + q]));
                      }
                      return next;
                    });
                for (int64_t r = 0; r < kWoRows; ++r)
                  kb.ifThen(kb.cmpi(arith::CmpIPredicate::ult, kb.idx(r), n), [&] {
                    for (int64_t q = 0; q < kWoChains; ++q)
                      kb.vstoreMasked(acc[r * kWoChains + q], dwo,
                                     {ds[r], kb.add(col0, at[q])}, counts[q]);
                  });
              });
        });
      });
}

} // namespace

template <>
LogicalResult
CPUKernel<AttentionPosteriorGradOp>::emit(AttentionPosteriorGradOp op,
                                          CpuKernelBuilder &kb,
                                          PatternRewriter &rw) const {
  if (failed(matchMinEntropyHead(op, rw)))
    return failure();
  Value headCount = getValueOrCreateConstantIndexOp(
      rw, op.getLoc(),
      tensor::getMixedSize(rw, op.getLoc(), op.getScores(), 1));
  if (failed(checkIndexOperand(rw, op, op.getHead(), headCount,
                               kMoEErrorAttentionHead)))
    return failure();
  // d_scores, d_u, d_v, d_wo, d_e.
  KernelScope kernel = KernelScope::gradientsOf(
      kb, op, {op.getScores(), op.getU(), op.getV(), op.getWo(), op.getE()},
      {op.getHead(), op.getDp()});
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value scores = kb.buffer(op.getScores()), u = kb.buffer(op.getU());
  Value v = kb.buffer(op.getV()), wo = kb.buffer(op.getWo());
  Value eIn = kb.buffer(op.getE()), headIn = kb.buffer(op.getHead());
  Value dp = kb.buffer(op.getDp());
  Value batch = kb.dim(scores, 0), heads = kb.dim(scores, 1);
  // h*[b] in [0, H) (reported above when not).
  Value headsI32 = kb.castInt(heads, kb.i32());
  auto headInRange = [&](Value bi) {
    return idInRange(kb, kb.load(headIn, {bi}), headsI32);
  };
  // The heads the passes read: 0 for a skipped batch element.
  Value head = kb.alloc(MemRefType::get({kDyn}, kb.i32()), {batch});
  kb.forLoop(c0, batch, c1, [&](Value bi) {
    Value h = kb.load(headIn, {bi});
    Value ok = idInRange(kb, h, headsI32);
    kb.store(kb.select(ok, h, kb.cI32(0)), head, {bi});
  });
  Value rows = kb.dim(scores, 2), keys = kb.dim(scores, 3);
  Value model = kb.dim(u, 2), headDim = kb.dim(v, 3), width = kb.dim(eIn, 2);
  float sigma = op.getSigma().convertToFloat();
  float sigma2 = sigma * sigma;
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  auto rank3 = MemRefType::get({kDyn, kDyn, kDyn}, f32);
  const PosteriorGradShape shape{c0,   c1,    zeros,   batch, heads,
                                 keys, model, headDim, head};
  auto headOf = [&](CpuKernelBuilder &kk, Value bi) {
    return shape.headOf(kk, bi);
  };
  auto widthLoop = [&](Value n,
                       function_ref<void(Value col, Value count)> body) {
    shape.widthLoop(kb, n, body);
  };

  // e with its non-finite entries zeroed (they get no gradient and enter
  // <dp_i, e_j> as 0, as in autograd of the reference).
  Value e = kb.alloc(rank3, {batch, keys, width});
  Value posInfV = kb.constLike(kb.vf32(), std::numeric_limits<float>::infinity());
  // to = from ([B, Nk, K] f32, or e itself) where e is finite, else 0.
  auto zeroWhereENonFinite = [&](Value from, Value to) {
    kb.forLoop(c0, batch, c1, [&](Value bi) {
      kb.forLoop(c0, keys, c1, [&](Value j) {
        widthLoop(width, [&](Value col, Value count) {
          Value x = kb.vloadMasked(eIn, {bi, j, col}, count, 0.0);
          Value finite =
              kb.cmpf(arith::CmpFPredicate::ONE, kb.fabs(x), posInfV);
          Value y =
              from == eIn ? x : kb.vloadMasked(from, {bi, j, col}, count, 0.0);
          kb.vstoreMasked(kb.select(finite, y, zeros), to, {bi, j, col}, count);
        });
      });
    });
  };
  zeroWhereENonFinite(eIn, e);

  // 1. Head means of h*, p and lse recomputed by the forward kernel.
  Value scale = headScaleValue(kb, op.getEffectiveHeadScale(), heads);
  HeadMeans means =
      packHeadMeans(kb, opts, v, wo, head, scale, batch, keys, model, headDim);
  Value keysPad = means.keysPad;
  Value modelPad = roundUp(kb, model, kLanes);
  Value rowsPad = roundUp(kb, rows, kKeyTile);
  auto logits = posteriorLogits(scores, head, means.norm2, keys,
                                op.getSigma().convertToDouble());
  Value p = kb.alloc(rank3, {batch, rows, width});
  Value lse = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rows});
  FlashSpec fwd = flashSpec(kb, u, means.keysT, keysPad, e, p, batch, rows,
                            keys, model, logits);
  fwd.lse = lse;
  fwd.tilesPerBlock = 1; // as the forward's (AttentionPosterior.cpp)
  emitFlashMix(kb, opts, fwd);
  Value widthPad = fwd.widthPad;
  auto [lseRow, delta] =
      gradRowStats(kb, lse, p, dp, batch, rows, width, widthPad, rowsPad);
  // A skipped batch element: lse' = +inf on its rows, so G = 0.
  Value posInf = kb.cF32(std::numeric_limits<float>::infinity());
  kb.forLoop(c0, batch, c1, [&](Value bi) {
    kb.ifThen(kb.notI1(headInRange(bi)), [&] {
      kb.forLoop(c0, rowsPad, c1, [&](Value i) {
        kb.store(posInf, lseRow, {bi, i});
      });
    });
  });

  // m as rows [B, keysPad, modelPad] (zero padding): the values of the
  // query-major pass and the rows of the key-major pass.
  Value mValues = kb.alloc(rank3, {batch, keysPad, modelPad});
  kb.forLoop(c0, batch, c1, [&](Value bi) {
    kb.forLoop(c0, keysPad, c1, [&](Value j) {
      Value jt = kb.divu(j, kb.idx(kKeyTile)), jl = kb.remu(j, kb.idx(kKeyTile));
      kb.forLoop(c0, modelPad, c1, [&](Value d) {
        Value in = kb.cmpi(arith::CmpIPredicate::ult, d, model);
        Value dc = kb.mins(d, kb.sub(model, c1));
        kb.store(kb.select(in, kb.load(means.keysT, {bi, jt, dc, jl}),
                         kb.cF32(0.0)),
                mValues, {bi, j, d});
      });
    });
  });

  // d_scores: zero on every head but h*, whose entries pass 2 writes.
  Value dScores = kernel.out(0);
  kb.workers(opts, kb.mul(kb.mul(batch, heads), rows), [&](Value item, Value) {
    Value i = kb.remu(item, rows), bh = kb.divu(item, rows);
    Value h = kb.remu(bh, heads), bi = kb.divu(bh, heads);
    widthLoop(keys, [&](Value col, Value count) {
      kb.vstoreMasked(zeros, dScores, {bi, h, i, col}, count);
    });
  });

  Value invS2 = kb.constLike(kb.vf32(), 1.0 / sigma2);

  // 2. Query-major: d_u, and G into d_scores.
  Value eT = packKeysT(kb, opts, e, batch, keys, width);
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
  emitFlashGrad(kb, opts, byQuery);

  // 3. Key-major, over the G that pass 2 left in d_scores[b, h*]: no
  //    logit is recomputed (KeyMajorSums).
  Value de = kernel.out(4);
  Value dzU = kb.alloc(rank3, {batch, keys, model});
  Value dzSum = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, keys});
  KeyMajorBuffers keyMajor{dScores, head, eT, dp, delta, u, de, dzU, dzSum};
  KeyMajorSums(kb, opts, keyMajor, batch, rows, keys, model, width).emit();
  // d_e is 0 at a non-finite e entry.
  zeroWhereENonFinite(de, de);

  // 4. dm (c/σ² folded in), d_v and d_wo.
  Value dm = kb.alloc(rank3, {batch, keys, model});
  Value dv = kernel.out(2);
  Value cOverS2 = kb.splat(kb.fdiv(scale, kb.cF32(sigma2)), kLanes);
  Value meanWork = kb.mul(kb.mul(kb.mul(batch, keys), model), headDim);
  emitDmAndDv(kb, opts, shape, {dzU, dzSum, mValues, wo, dm, dv}, cOverS2,
              meanWork);
  emitDwo(kb, opts, shape, dm, v, meanWork, kernel.out(3));

  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
