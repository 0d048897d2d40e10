//===- FlashMmaGrad.cpp - similarity_inform's backward on tensor cores ----===//
//
// Part of the MoE-MLIR project.
//
// The tensor-core form of similarity_inform_grad's two flash passes
// (flash-mma-grad; the scalar form: FlashGrad.cpp), FlashAttention-2's
// backward on mma.sync m16n8k16 with f32 sums, for f16/bf16 u and e without
// ws (q = u). With x_ij = <u_i, u_j> / tau, S = exp(x - lse'_i),
// G_ij = <dp_i, e_j> and delta_i = <dp_i, p_i> (launchFlashGradStats):
//
//   query-major (rows i):  dq_i = Σ_j S_ij (G_ij - delta_i) u_j / tau
//   key-major (rows j):    de_j = Σ_i S_ij dp_i,
//                          du_j += Σ_i S_ij (G_ij - delta_i) u_i / tau
//
// One kernel body for both: a block of 4 warps owns 64 rows, a warp 16 (one
// MMA row tile). A thread holds its rows' operands as A fragments for the
// whole kernel: X = u (the logits' rows) and Y (the cotangent dots' rows: dp
// rounded to the operand type by query, e by key), with each row's term of
// the exponent. Column tiles of 64 or 32 (keys by query, queries by key) stream
// through shared memory: u's rows [cols x D] and Y's partner Z (e by query, dp
// rounded by key), with each column's term; the next tile's 16-byte vectors
// are loaded into registers while the current one is computed. The stats
// kernel rounds dp once, into rows padded to a multiple of 8 (16-byte
// vectors). A tile:
//
//   S = X Uᵀ and G = Y Zᵀ on mma.sync (the B operands by ldmatrix);
//   P = 2^(S log2(e)/tau - lse'_i log2(e)) (one FFMA and one EX2 a score:
//   the column's part of the exponent, -lse' of a query or -inf for an
//   excluded key, is where S's accumulators start, the row's is the FFMA's
//   addend), dX = P (G - delta) (one FMUL: G's accumulators start at
//   -delta);
//   acc_X += dX U (ldmatrix.trans of the same tile: the C fragments become
//   A fragments in registers, as the forward's P), and by key acc_P += P Z.
//
// Each output row has one writer (no atomics): deterministic, as the scalar
// passes. Under causal the query-major pass stops at its last row's tile
// and the key-major pass starts at its first row's. P and dX enter the
// second products rounded to the operand type; G and delta are both of dp
// rounded so (FlashAttention-2 keeps dO in bf16 too), or dX = S (G - delta)
// would not cancel where p_i is close to e_j (a row dominated by one key:
// 46% off float64 at D = 128 with delta of the f32 dp, 0.2% with it); the
// dots, the sums and the exponents are f32. Masked keys and rows past N are
// zeros in the staged tiles and in the key-major rows (so a NaN in a masked
// key's e stays out of every gradient: its u is a query's too, and there
// enters); as in the forward tensor-core kernel, a non-finite value of a key
// that causal masking hides from some rows of a diagonal tile reaches them
// (0 · inf).
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"
#include "HostCode.h"
#include "Lowerings.h"
#include "MmaFragments.h"
#include "TileStaging.h"

#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

namespace {
constexpr double kLog2E = 1.4426950408889634;

int64_t padTo16(int64_t n) { return llvm::alignTo(n, 16); }

/// Columns a tile: 64 where the padded features and experts take at most 96
/// (D = 64, K = 16: 165 registers, 3 blocks a multiprocessor, 15-17.6
/// instructions a score against 21-22.4 with 32: the staging, barriers and
/// address arithmetic of a tile spread over twice the scores), else 32 (two
/// products' 64 accumulators a thread beside the row operands and sums of
/// D = 128, K = 64 spill on sm_90).
int64_t columnsFor(int64_t Dp, int64_t Kp) {
  return Dp + Kp <= 96 ? 64 : Dp <= 128 ? 32 : 16;
}

/// Past 128 padded features the column tiles are copied by cp.async, two
/// buffers a pass, the next tile's copies in flight while one is computed:
/// the registers that carry the next tile's vectors otherwise (below 128) are
/// not there (with them D = 256, K = 16 spilled 12-24 bytes on sm_90).
bool asyncStagingFor(int64_t Dp) { return Dp > 128; }

/// The feature splits of acc_X (dq by query, du by key; the grid's z): past
/// 128 padded features its accumulators (4 registers an 8-feature block: 128
/// at D = 256) beside the row operands (64) pass ptxas's 255, so each block
/// accumulates 128 of them, its logits and weights computed in full (the
/// tile's MMAs about 1.6 times the unsplit ones at D = 256, K = 64).
int64_t featureSplitsFor(int64_t Dp) { return llvm::divideCeil(Dp, 128); }
} // namespace

bool mlir::moe::gpu_lowering::flashGradMmaApplies(const FlashLogitSpec &spec,
                                                  Type uElt, Type eElt,
                                                  int64_t depth,
                                                  int64_t experts) {
  return !spec.hasBias && !spec.hasAddScores &&
         (uElt.isF16() || uElt.isBF16()) && uElt == eElt &&
         !ShapedType::isDynamic(depth) && depth >= 1 &&
         depth <= kFlashGradMmaMaxDepth && experts >= 1 &&
         experts <= kFlashGradMmaMaxExperts;
}

namespace {
/// The body (see the file comment) as a recipe: the thread's rows and their
/// A fragments, then per column tile the staging, the columns' terms, the
/// two products S' and G', the weights P and dX, and the accumulation, then
/// the rows' sums. Arguments: u, e, the rounded dp, lse', delta, [key mask],
/// then dq by query, de and du by key.
class FlashGradMmaRecipe {
public:
  FlashGradMmaRecipe(GPUKernel &k, const FlashLogitSpec &spec, bool byKey,
                     int64_t Dp, int64_t Kp, int64_t cols, Type elt,
                     int64_t splits)
      : k(k), spec(spec), byKey(byKey), Dp(Dp), Kp(Kp), cols(cols),
        nbs(cols / 8), splits(splits), outWidth(Dp / splits), wx(outWidth / 8),
        wz(Kp / 8), async(asyncStagingFor(Dp)), kb(k.kb),
        b(k.b), m{k.b, k.kb, elt} {}
  void emit(FlashBlockOrder order) {
    placeRows(order);
    X = rowFragments(u, Dp, D);
    Y = rowFragments(byKey ? e : dp, Kp, K);
    bindRowTerms();
    prepareStaging();
    assert(outWidth * splits == Dp && outWidth % 8 == 0 &&
           "whole 8-feature blocks a split");
    split = splits > 1 ? kb.blockId(gpu::Dimension::z) : c0;
    outLo = kb.mul(split, kb.idx(outWidth));
    SmallVector<Value> init(4 * (wx + (byKey ? wz : 0)), zero);
    nAcc = init.size();
    if (async) {
      kb.ifThen(kb.lt(first, last), [&] { copyTile(first); });
      NVVM::CpAsyncCommitGroupOp::create(b);
    } else {
      init.append(fetchTile(first));
    }
    scale = kb.cF32(kLog2E / spec.scaleDiv);
    SmallVector<Value> acc =
        kb.forLoop(first, last, kb.idx(cols), init,
                   [&](Value col0, ValueRange carried) -> SmallVector<Value> {
                     return columnTile(col0, carried);
                   });

    // The rows' sums: acc_X / tau into dq (by query) or added to du (by key),
    // acc_P into de (by the first split: every split sums it alike).
    invTau = kb.cF32(1.0 / spec.scaleDiv);
    if (byKey) {
      kb.ifThen(kb.eq(split, c0), [&] {
        writeRows(acc, 4 * wx, wz, K, out0, /*scaled=*/false, /*add=*/false,
                  c0);
      });
      writeRows(acc, 0, wx, D, out1, /*scaled=*/true, /*add=*/true, outLo);
    } else {
      writeRows(acc, 0, wx, D, out0, /*scaled=*/true, /*add=*/false, outLo);
    }
  }

private:
  using Fragments = SmallVector<SmallVector<Value>>;

  void placeRows(FlashBlockOrder order) {
    unsigned a = 0;
    u = k.arg(a++);
    e = k.arg(a++);
    dp = k.arg(a++);
    lse = k.arg(a++);
    delta = k.arg(a++);
    mask = spec.hasKeyMask ? k.arg(a++) : Value();
    out0 = k.arg(a++);
    out1 = byKey ? k.arg(a++) : Value();
    xs = k.workgroup(0), zs = k.workgroup(1), terms = k.workgroup(2);
    c0 = kb.idx(0), c1 = kb.idx(1), c2 = kb.idx(2);
    FlashBlockPlace place = flashBlockPlace(kb, order);
    bi = place.batchOf(kb);
    N = kb.dim(u, 1), D = kb.dim(u, 2), K = kb.dim(e, 2);
    tid = kb.threadId();
    Value warp = kb.divu(tid, kb.idx(kWarp));
    Value lane = kb.remu(tid, kb.idx(kWarp));
    g = kb.divu(lane, kb.idx(4)), tig = kb.remu(lane, kb.idx(4));
    cCoords.emplace(kb, cLayout.map.mode(0).shape(), ArrayRef<Value>{tig, g});
    ldRow = kb.remu(lane, kb.idx(8)), ldSel = kb.divu(lane, kb.idx(8));
    rowBase = kb.mul(place.tileOf(kb), kb.idx(kMmaRows));
    zero = kb.cF32(0.0);
    negInf = kb.negInfLike(kb.f32());
    log2e = kb.cF32(kLog2E);
    zeroE = m.zeroElt();

    // The thread's rows: rowBase + 16 warp + g + 8 r.
    for (int64_t r = 0; r < 2; ++r) {
      Value row = kb.add(
          rowBase, kb.add(kb.mul(warp, kb.idx(16)), kb.add(g, kb.idx(8 * r))));
      rows.push_back(row);
      rowIn.push_back(kb.lt(row, N));
      rowAt.push_back(kb.select(rowIn.back(), row, c0));
    }
    // By key, a masked key's rows are zeros: its S and G are then 0 (its P is
    // 0 through its row term), so that a NaN in its e stays out of its dk.
    rowKept = rowIn;
    if (byKey && mask)
      for (int64_t r = 0; r < 2; ++r)
        rowKept[r] = kb.andI(rowIn[r], keyKept(rowAt[r]));
  }

  // A fragments of rows [16 x width] of `src` (of the operand type), each
  // element where the A atom places it; zeros past N and width.
  SmallVector<Value> rowFragments(Value src, int64_t padded, Value width) {
    LaneCoords aCoords(kb, aLayout.map.mode(0).shape(),
                       ArrayRef<Value>{tig, g});
    SmallVector<Value> frags;
    for (int64_t c = 0; c < padded / 16; ++c) {
      SmallVector<Value> elems;
      for (int64_t v = 0; v < 8; ++v) {
        const int64_t r = (v / 2) % 2;
        Value col =
            fragmentTileIndex(kb, aCoords, aLayout, v, 16 * c, /*rows=*/false);
        Value ok = kb.lt(col, width);
        Value x = kb.load(src, {bi, rowAt[r], kb.select(ok, col, c0)});
        ok = kb.andI(rowKept[r], ok);
        elems.push_back(kb.select(ok, x, zeroE));
      }
      frags.push_back(m.fragment(elems));
    }
    return frags;
  }

  // Each row's term of the exponent and, by query, its -delta (where the
  // cotangent dots' accumulators start).
  void bindRowTerms() {
    for (int64_t r = 0; r < 2; ++r) {
      if (byKey) {
        rowTerm.push_back(kb.select(rowKept[r], zero, negInf));
        continue;
      }
      Value l = kb.load(lse, {bi, rowAt[r]});
      rowTerm.push_back(kb.select(
          rowIn[r], kb.fmul(arith::NegFOp::create(b, l), log2e), negInf));
      rowNegDelta.push_back(
          arith::NegFOp::create(b, kb.load(delta, {bi, rowAt[r]})));
    }
  }

  // The column tiles: keys [0, N) by query (under causal up to the block's
  // last row), queries [0, N) by key (under causal from its first row, a tile
  // boundary: cols divides kMmaRows); the operands' alignment and the
  // staging's places.
  void prepareStaging() {
    first = c0, last = N;
    if (spec.causal) {
      if (byKey) {
        first = rowBase;
      } else {
        Value end = kb.add(rowBase, kb.idx(kMmaRows));
        last = kb.select(kb.lt(end, N), end, N);
      }
    }
    st.emplace(TileStaging{kb, b, m.elt, tid, kMmaThreads, bi, N});
    uAligned = st->aligned(u, D, Dp);
    // Z by query is e (16 bytes a load where aligned), by key the rounded dp
    // (this op's own buffer: rows of W, a multiple of 8, from an aligned base;
    // zeros past K).
    W = kb.dim(dp, 2);
    zAligned = byKey ? kb.cBool(true) : st->aligned(e, K, Kp);
    xAt = st->places(cols, Dp);
    zAt = st->places(cols, Kp);
    nX = xAt.size(), nZ = zAt.size();
  }

  Value keyKept(Value row) { return kb.load(mask, {bi, row}); }
  /// The staged columns' key mask: by query the staged keys are zeros where
  /// masked.
  function_ref<Value(Value)> colKept() {
    if (byKey || !mask)
      return nullptr;
    return keptByMask;
  }

  SmallVector<Value> fetchTile(Value col0) {
    SmallVector<Value> v = st->fetch(u, xAt, D, col0, uAligned, colKept());
    v.append(byKey ? st->fetch(dp, zAt, W, col0, zAligned)
                   : st->fetch(e, zAt, K, col0, zAligned, colKept()));
    return v;
  }

  // The tile at col0's rows of a buffer: the first or second `cols` rows by
  // the tile's parity in the pass (async), else the buffer.
  Value bufferOf(Value buffer, Value col0) {
    if (!async)
      return buffer;
    Value tile = kb.divu(kb.sub(col0, first), kb.idx(cols));
    Value row = kb.mul(kb.remu(tile, c2), kb.idx(cols));
    auto type = cast<MemRefType>(buffer.getType());
    return memref::SubViewOp::create(
        b, buffer, ArrayRef<OpFoldResult>{row, b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(cols),
                               b.getIndexAttr(type.getShape()[1])},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
  }

  // The aligned operands' copies of the tile at col0 into its buffers.
  void copyTile(Value col0) {
    Value xsAt = bufferOf(xs, col0), zsAt = bufferOf(zs, col0);
    kb.ifThen(uAligned,
              [&] { st->copyAsync(u, xAt, D, col0, xsAt, colKept()); });
    if (byKey)
      st->copyAsync(dp, zAt, W, col0, zsAt);
    else
      kb.ifThen(zAligned,
                [&] { st->copyAsync(e, zAt, K, col0, zsAt, colKept()); });
  }

  // The tile at col0 into the buffers, after the barrier that ends the last
  // tile's reads: with cp.async a misaligned operand's elements into this
  // tile's buffer and the next tile's copies into the other one; else the
  // carried vectors (`staged`) or the elements.
  void stageTile(Value col0, Value next, ValueRange staged, Value xsTile,
                 Value zsTile) {
    if (async) {
      kb.ifThen(kb.notI1(uAligned),
                [&] { st->elements(u, xsTile, cols, Dp, D, col0, colKept()); });
      if (!byKey)
        kb.ifThen(kb.notI1(zAligned), [&] {
          st->elements(e, zsTile, cols, Kp, K, col0, colKept());
        });
      // (Past the last tile too: rows in bounds or zeros, read by no one; no
      // branch in the loop.)
      copyTile(next);
      NVVM::CpAsyncCommitGroupOp::create(b);
      return;
    }
    kb.ifThenElse(
        uAligned, [&] { st->put(staged.take_front(nX), xAt, xs); },
        [&] { st->elements(u, xs, cols, Dp, D, col0, colKept()); });
    if (byKey)
      st->put(staged.slice(nX, nZ), zAt, zs);
    else
      kb.ifThenElse(
          zAligned, [&] { st->put(staged.slice(nX, nZ), zAt, zs); },
          [&] { st->elements(e, zs, cols, Kp, K, col0, colKept()); });
  }

  // Each column's term in the dots' units, where its logits' accumulators
  // start (by key -lse' tau of the query, by query 0 or -inf for an excluded
  // key), and by key its -delta: terms[0][c], [1][c].
  void storeColumnTerms(Value col0) {
    kb.ifThen(kb.lt(tid, kb.idx(cols)), [&] {
      Value col = kb.add(col0, tid);
      Value in = kb.lt(col, N);
      Value at = kb.select(in, col, c0);
      if (byKey) {
        Value l = kb.load(lse, {bi, at});
        kb.store(kb.select(in, kb.fmul(l, kb.cF32(-spec.scaleDiv)), negInf),
                 terms, {c0, tid});
        Value d = kb.load(delta, {bi, at});
        kb.store(kb.select(in, arith::NegFOp::create(b, d), zero), terms,
                 {c1, tid});
      } else {
        Value kept = in;
        if (mask)
          kept = kb.andI(kept, keyKept(at));
        kb.store(kb.select(kept, zero, negInf), terms, {c0, tid});
      }
    });
  }

  // One column tile: stage it, the columns' terms, S' and G', the weights P
  // and dX rounded in pairs, and the accumulation; carries the next tile's
  // vectors (without cp.async).
  SmallVector<Value> columnTile(Value col0, ValueRange carried) {
    SmallVector<Value> accs(carried.take_front(nAcc));
    ValueRange staged = carried.drop_front(nAcc);
    Value next = kb.add(col0, kb.idx(cols));
    // The last tile's reads of the buffers are done (and with the cp.async
    // copies this tile's have landed, every thread's).
    if (async)
      NVVM::CpAsyncWaitGroupOp::create(b, b.getI32IntegerAttr(0));
    kb.barrier();
    Value xsTile = bufferOf(xs, col0), zsTile = bufferOf(zs, col0);
    stageTile(col0, next, staged, xsTile, zsTile);
    storeColumnTerms(col0);
    kb.barrier();
    // The next tile's vectors in flight while this one is computed (the last
    // tile loads its own again: in bounds, not used).
    SmallVector<Value> ahead;
    if (!async)
      ahead = fetchTile(kb.select(kb.lt(next, last), next, col0));
    // The C fragments' columns 8 nb + 2 tig + {0, 1} of rows g and g + 8
    // ([nb][2 r + x]), and where the products' accumulators start: S' from
    // the columns' terms, G' from -delta (the row's by query, the column's by
    // key).
    SmallVector<Value> colIdx[2];
    Fragments sInit(nbs), gInit(nbs);
    for (int64_t nb = 0; nb < nbs; ++nb) {
      Value t[2], nd[2];
      for (int64_t x = 0; x < 2; ++x) {
        Value c = fragmentColumn(8 * nb, x);
        colIdx[x].push_back(kb.add(col0, c));
        t[x] = kb.load(terms, {c0, c});
        if (byKey)
          nd[x] = kb.load(terms, {c1, c});
      }
      sInit[nb] = {t[0], t[1], t[0], t[1]};
      gInit[nb] = byKey ? SmallVector<Value>{nd[0], nd[1], nd[0], nd[1]}
                        : SmallVector<Value>{rowNegDelta[0], rowNegDelta[0],
                                             rowNegDelta[1], rowNegDelta[1]};
    }
    Fragments S = products(X, xsTile, sInit);
    Fragments G = products(Y, zsTile, gInit);
    // P = 2^(S' log2(e)/tau + rowTerm) and dX = P G', rounded in pairs:
    // [r][nb].
    SmallVector<Value> pPairs(2 * nbs), dxPairs(2 * nbs);
    for (int64_t nb = 0; nb < nbs; ++nb) {
      for (int64_t r = 0; r < 2; ++r) {
        Value p[2], dx[2];
        for (int64_t x = 0; x < 2; ++x) {
          Value arg = kb.fma(S[nb][2 * r + x], scale, rowTerm[r]);
          if (spec.causal) {
            // Key j <= query i: by query the column is the key.
            Value keep = kb.cmpi(byKey ? arith::CmpIPredicate::sge
                                       : arith::CmpIPredicate::sle,
                                 colIdx[x][nb], rows[r]);
            arg = kb.select(keep, arg, negInf);
          }
          p[x] = exp2Approx(b, arg);
          dx[x] = kb.fmul(p[x], G[nb][2 * r + x]);
        }
        pPairs[r * nbs + nb] = m.roundPair(p[0], p[1]);
        dxPairs[r * nbs + nb] = m.roundPair(dx[0], dx[1]);
      }
    }
    Value xsOut = xsTile;
    if (splits > 1)
      xsOut = memref::SubViewOp::create(
          b, xsTile, ArrayRef<OpFoldResult>{b.getIndexAttr(0), outLo},
          ArrayRef<OpFoldResult>{b.getIndexAttr(cols),
                                 b.getIndexAttr(outWidth)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
    accumulate(accs, dxPairs, xsOut, wx, 0);
    if (byKey)
      accumulate(accs, pPairs, zsTile, wz, 4 * wx);
    accs.append(ahead);
    return accs;
  }

  // S' = X Uᵀ + terms and G' = Y Zᵀ - delta.
  Fragments products(ArrayRef<Value> rowFrags, Value tile, Fragments s) {
    for (auto [c, frag] : llvm::enumerate(rowFrags))
      m.keyBlockProducts(s, frag, tile, 16 * c, nbs, ldRow, ldSel);
    return s;
  }

  // acc += W · tile over the tile's 16-column slices kc (W's A fragment from
  // its C fragments' pairs of blocks 2 kc and 2 kc + 1).
  void accumulate(SmallVector<Value> &accs, ArrayRef<Value> pairs, Value tile,
                  int64_t blocks, int64_t at) {
    for (int64_t kc = 0; kc < cols / 16; ++kc) {
      Value aFrag =
          m.fragmentOfPairs({pairs[2 * kc], pairs[nbs + 2 * kc],
                             pairs[2 * kc + 1], pairs[nbs + 2 * kc + 1]});
      m.valueBlockProducts(accs, aFrag, at, 0, tile, 16 * kc, blocks, ldRow,
                           ldSel);
    }
  }

  // The rows' sums of blocks [at, at + 4 blocks) of `acc`: scaled by 1 / tau
  // (acc_X) or not (acc_P), stored or added to `out` at columns colLo + ...
  void writeRows(ArrayRef<Value> acc, int64_t at, int64_t blocks, Value width,
                 Value out, bool scaled, bool add, Value colLo) {
    for (int64_t eb = 0; eb < blocks; ++eb)
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t x = 0; x < 2; ++x) {
          Value col = kb.add(colLo, fragmentColumn(8 * eb, x));
          Value v = acc[at + 4 * eb + 2 * r + x];
          kb.ifThen(kb.andI(rowIn[r], kb.lt(col, width)), [&] {
            Value s = scaled ? kb.fmul(v, invTau) : v;
            if (add)
              s = kb.fadd(kb.load(out, {bi, rows[r], col}), s);
            kb.store(s, out, {bi, rows[r], col});
          });
        }
  }

  /// The C-fragment column of value x of the 8-column block at `block0`.
  Value fragmentColumn(int64_t block0, int64_t x) {
    return fragmentTileIndex(kb, *cCoords, cLayout, x, block0,
                             /*rows=*/false);
  }

  GPUKernel &k;
  const FlashLogitSpec &spec;
  const bool byKey;
  const int64_t Dp, Kp, cols, nbs, splits;
  // acc_X's features: split z's [outLo, outLo + Dp / splits)
  // (featureSplitsFor); wx of its 8-feature blocks, wz of acc_P's.
  const int64_t outWidth, wx, wz;
  // The next tile's loads in flight while one is computed: its vectors
  // carried in registers, or past 128 padded features (asyncStagingFor) its
  // cp.async copies into the other of two buffers (a misaligned operand's
  // elements still staged after the barrier, into the tile's own).
  const bool async;
  GpuKernelBuilder &kb;
  ImplicitLocOpBuilder &b;
  Mma m;
  const kernels::TVLayout cLayout = kernels::atoms::mmaM16N8C();
  const kernels::TVLayout aLayout = kernels::atoms::mmaM16N8K16A();
  std::function<Value(Value)> keptByMask = [this](Value row) {
    return keyKept(row);
  };

  Value u, e, dp, lse, delta, mask, out0, out1, xs, zs, terms;
  Value c0, c1, c2, bi, N, D, K, tid, g, tig, ldRow, ldSel, rowBase;
  Value zero, negInf, log2e, zeroE;
  std::optional<LaneCoords> cCoords;
  /// The thread's rows (g and g + 8 of its warp's 16), whether each is below
  /// N, its index in bounds, and whether it holds a row (by key: a kept
  /// key).
  SmallVector<Value> rows, rowIn, rowAt, rowKept;
  /// The rows' A fragments: X = u, Y = dp by query, e by key.
  SmallVector<Value> X, Y;
  SmallVector<Value> rowTerm, rowNegDelta;
  Value first, last;
  std::optional<TileStaging> st;
  Value uAligned, W, zAligned;
  SmallVector<TileStaging::Place> xAt, zAt;
  int64_t nX = 0, nZ = 0, nAcc = 0;
  Value split, outLo, scale, invTau;
};
} // namespace

void mlir::moe::gpu_lowering::launchFlashGradMma(HostCode &h, StringRef name,
                                                 const FlashGradSpec &spec,
                                                 ValueRange args,
                                                 Location loc) {
  GpuKernelBuilder &kb = h.kb;
  Value u = args[0], e = args[1];
  Type elt = cast<MemRefType>(u.getType()).getElementType();
  const int64_t Dp = padTo16(cast<MemRefType>(u.getType()).getShape()[2]);
  const int64_t Kp = padTo16(cast<MemRefType>(e.getType()).getShape()[2]);
  const int64_t cols = columnsFor(Dp, Kp);
  assert(kMmaRows % cols == 0 && "a row block starts at a column tile");
  // (Two buffers a tile with the cp.async copies.)
  const int64_t tileRows = asyncStagingFor(Dp) ? 2 * cols : cols;
  SmallVector<Type> workgroup = {
      workgroupMemRef({tileRows, Dp + kLdmatrixPad}, elt),
      workgroupMemRef({tileRows, Kp + kLdmatrixPad}, elt),
      workgroupMemRef({2, cols}, h.b.getF32Type())};
  GPUKernel k(h, name, args, workgroup, {kMmaThreads, 1, 1}, loc);
  alignWorkgroupBuffers(k.func);
  const int64_t splits = featureSplitsFor(Dp);
  // Past 128 features: 2 blocks a multiprocessor, ptxas's 255 registers (left
  // to itself it took 168 at D = 144, K = 40 and spilled 4 bytes).
  if (splits > 1)
    k.func->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                    k.b.getI32IntegerAttr(2));
  FlashGradMmaRecipe(k, spec, spec.keyMajor, Dp, Kp, cols, elt, splits)
      .emit(flashBlockOrder(spec.causal, spec.balanceCausal, spec.keyMajor));
  Value B = kb.dim(u, 0), N = kb.dim(u, 1);
  k.launch({kb.ceilDiv(N, kb.idx(kMmaRows)), B, kb.idx(splits)});
}
