//===- FlashSymmetric.cpp - Similarity mixing over half the pairs (GPU) ---===//
//
// Part of the MoE-MLIR project.
//
// similarity_inform's symmetric form on tensor cores (flash-mma-symmetric;
// the maths and the guard: MoE/Kernels/SymmetricMix.h). With h_j = n_j/2 in
// log2 units, c = max h over the valid keys, w_j = 2^(h_j - c) (0 for a
// masked key) and A_ij = 2^(S_ij log2(e) - h_i - h_j) <= 1:
//   out_i = Σ_j A_ij V'_j[:K] / Σ_j A_ij V'_j[K],  V'_j = [w_j e_j, w_j].
// Four kernels before the exact one:
//
//  1. norms: a thread a row, h_j (f32, from the operand's values), and per
//     block of 128 rows the max and min of h over the valid keys, their count
//     and a non-finite flag (NaN iff some u or e of the rows is not);
//  2. values: every block reduces its element's partials (fixed order:
//     deterministic) to c and the guard, writes V' (bf16, K + 1 columns
//     padded to a multiple of 8) for its rows, zeroes their accumulators, and
//     block 0 the element's stats [c, guard, any valid key, redo = 0];
//  3. pairs: a block owns 128 rows I (4 warps x 32: two 16-row MMA tiles a
//     warp, their U fragments and -h_i in registers, V'_I staged once) and
//     walks its share of the tile pairs {I, J} in 64-key halves: the round
//     robin J = I, I + 1, ..., I + m (mod T, T tiles, m = (T - 1) / 2, or T/2
//     and T/2 - 1 for the first and second half of the tiles when T is even)
//     takes every unordered pair once, and a block's walk splits over up to 4
//     blocks when the grid is under 264 blocks (the count that fills its
//     last wave best). Each half: the keys U_J, V'_J and -h_J staged (loaded
//     into registers, 16 bytes a load where u is aligned, while the half
//     before is computed), S - h_J = U_I U_J^T - h_J on
//     mma.sync (the accumulators start at -h_j), one FFMA and one EX2 a
//     score, then
//       rows of I:  acc_I += A V'_J (A's fragments straight from S's, as the
//                   exact kernel's P), in registers over the whole walk;
//       rows of J:  A (bf16) through shared memory, A^T's fragments by
//                   ldmatrix.trans, A^T V'_I on mma.sync, added to the rows'
//                   f32 accumulators in global memory (red.global.add),
//     the second only off the diagonal pair {I, I} (whose 128 x 128 weights
//     already give every row of I each of its keys once). acc_I is added to
//     the global accumulators at the end of the walk;
//  4. rows: a thread a row, out = acc[:K] / acc[K], lse = ln acc[K] + (h_i +
//     c) ln 2; a sum below kMinSymmetricSum in an element with a valid key
//     sets its redo flag.
//
// The exact kernel (launchFlashMixMma, gated) then runs the elements whose
// guard failed or whose redo flag is set, over all their rows. The global
// accumulators take each row's sums in the order the blocks' atomics land:
// results equal the exact kernel's within the MMA tolerance, but their last
// bits vary from run to run (as FlashAttention-2's dQ); the exact kernel is
// deterministic. bf16 only: f16's range (6e-8) would flush the weights w_j of
// a spread of more than about 16.
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"
#include "HostCode.h"
#include "Lowerings.h"
#include "MmaFragments.h"
#include "Reductions.h"
#include "TileStaging.h"

#include "MoE/Kernels/SymmetricMix.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"

#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

namespace {
constexpr int64_t kThreads = 128;
constexpr int64_t kWarps = kThreads / kWarp;
/// Rows a block owns (two 16-row MMA tiles a warp) and keys a step.
constexpr int64_t kRowTile = 128, kKeyHalf = 64;
/// Elements of padding per workgroup row (16 bytes: ldmatrix's row addresses
/// fall in distinct banks).
constexpr int64_t kPad = 8;
/// The largest feature count (the U fragments of two row tiles stay in
/// registers beside 64 logits) and width of V' (K + 1 padded to 8).
constexpr int64_t kMaxDepth = 64, kMaxWidth = 32;
/// At most this many blocks share a row tile's walk, and only while the
/// grid has fewer than 264 blocks (two on each of 132 multiprocessors).
constexpr int64_t kMaxSplits = 4, kSplitBelowBlocks = 2 * 132;
constexpr double kLog2E = 1.4426950408889634, kLn2 = 0.6931471805599453;

/// The element stats' columns.
enum Stat : int64_t { kShift = 0, kGuard = 1, kAnyKey = 2, kRedo = 3 };

int64_t widthOf(int64_t K) { return llvm::alignTo(K + 1, 8); }
} // namespace

bool mlir::moe::gpu_lowering::symmetricMixApplies(const FlashMixSpec &spec,
                                                  const FlashMmaTile &tile,
                                                  Type elt, int64_t rows) {
  return !spec.topk && !spec.causal && !spec.hasBias && !spec.hasAddScores &&
         elt.isBF16() && tile.depth <= kMaxDepth &&
         widthOf(spec.numExperts) <= kMaxWidth &&
         (ShapedType::isDynamic(rows) || rows >= kMinSymmetricRows);
}

Value mlir::moe::gpu_lowering::symmetricDeclined(GpuKernelBuilder &kb,
                                                 Value stats, Value b) {
  // One statement each: the loads' order must not be the C++ compiler's
  // (argument evaluation order).
  Value zero = kb.cF32(0.0);
  Value guard = kb.load(stats, {b, kb.idx(kGuard)});
  Value redo = kb.load(stats, {b, kb.idx(kRedo)});
  Value declined = kb.cmpf(arith::CmpFPredicate::OEQ, guard, zero);
  return kb.orI(declined, kb.cmpf(arith::CmpFPredicate::UNE, redo, zero));
}

/// Kernel 1: h_j (log2 units) and the blocks' partial stats [B, blocks, 4]:
/// max h, max -h (over the valid keys), valid keys, non-finite flag.
static void emitNorms(GPUKernel &k, const FlashMixSpec &spec) {
  GpuKernelBuilder &kb = k.kb;
  unsigned a = 0;
  Value u = k.arg(a++), e = k.arg(a++);
  Value mask = spec.hasKeyMask ? k.arg(a++) : Value();
  Value half = k.arg(a++), part = k.arg(a++);
  Value scratch = k.workgroup(0);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value bi = kb.blockId(gpu::Dimension::y), blk = kb.blockId();
  Value N = kb.dim(u, 1), D = kb.dim(u, 2), K = kb.dim(e, 2);
  Value j = kb.add(kb.mul(blk, kb.idx(kThreads)), kb.threadId());
  Value in = kb.lt(j, N);
  Value row = kb.select(in, j, c0);
  Value zero = kb.cF32(0.0), negInf = kb.negInfLike(kb.f32());
  // Σ u², and Σ (x - x) over the row's u and e: NaN iff one is not finite.
  SmallVector<Value> su = kb.forLoop(
      c0, D, c1, {zero, zero}, [&](Value d, ValueRange acc) -> SmallVector<Value> {
        Value x = kb.loadF(u, {bi, row, d});
        return {kb.fma(x, x, acc[0]), kb.fadd(acc[1], kb.fsub(x, x))};
      });
  Value badE = kb.forLoop(c0, K, c1, {su[1]},
                          [&](Value c, ValueRange acc) -> SmallVector<Value> {
                            Value x = kb.loadF(e, {bi, row, c});
                            return {kb.fadd(acc[0], kb.fsub(x, x))};
                          })[0];
  // h = |u|² / (2τ) in log2 units.
  Value h = kb.fmul(su[0], kb.cF32(0.5 * kLog2E / spec.scaleDiv));
  kb.ifThen(in, [&] { kb.store(h, half, {bi, j}); });
  Value valid = in;
  if (mask)
    valid = kb.andI(in, kb.load(mask, {bi, row}));
  SmallVector<Value> vals = {
      kb.select(valid, h, negInf),
      kb.select(valid, arith::NegFOp::create(k.b, h), negInf),
      kb.select(valid, kb.cF32(1.0), zero),
      kb.select(in, kb.fadd(kb.fsub(h, h), badE), zero)};
  ReduceKind kinds[] = {ReduceKind::Max, ReduceKind::Max, ReduceKind::Sum,
                        ReduceKind::Sum};
  for (auto [s, v] : llvm::enumerate(vals)) {
    Value r = blockReduce(kb, v, kinds[s], kThreads, scratch);
    kb.ifThen(kb.eq(kb.threadId(), c0), [&] {
      kb.store(r, part, {bi, blk, kb.idx(s)});
    });
  }
}

/// Kernel 2: the element's stats from the partials, V' and zeroed
/// accumulators for the block's rows.
static void emitValues(GPUKernel &k, const FlashMixSpec &spec) {
  GpuKernelBuilder &kb = k.kb;
  ImplicitLocOpBuilder &b = k.b;
  unsigned a = 0;
  Value e = k.arg(a++);
  Value mask = spec.hasKeyMask ? k.arg(a++) : Value();
  Value half = k.arg(a++), part = k.arg(a++), stats = k.arg(a++);
  Value vp = k.arg(a++), acc = k.arg(a++);
  Value scratch = k.workgroup(0);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value tid = kb.threadId();
  Value bi = kb.blockId(gpu::Dimension::y), blk = kb.blockId();
  Value N = kb.dim(e, 1), K = kb.dim(e, 2), W = kb.dim(vp, 2);
  Value blocks = kb.dim(part, 1);
  Value zero = kb.cF32(0.0), negInf = kb.negInfLike(kb.f32());
  // The partials, a thread a block (strided), then across the block.
  ReduceKind kinds[] = {ReduceKind::Max, ReduceKind::Max, ReduceKind::Sum,
                        ReduceKind::Sum};
  SmallVector<Value> st = kb.forLoop(
      tid, blocks, kb.idx(kThreads), {negInf, negInf, zero, zero},
      [&](Value p, ValueRange acc) -> SmallVector<Value> {
        SmallVector<Value> next;
        for (int64_t s = 0; s < 4; ++s) {
          Value v = kb.load(part, {bi, p, kb.idx(s)});
          next.push_back(s < 2 ? kb.fmax(acc[s], v) : kb.fadd(acc[s], v));
        }
        return next;
      });
  for (int64_t s = 0; s < 4; ++s)
    st[s] = blockReduce(kb, st[s], kinds[s], kThreads, scratch);
  Value c = st[0];
  Value anyKey = kb.cmpf(arith::CmpFPredicate::OGT, st[2], zero);
  // spread = max h - min h (natural units), false for NaN; no valid key
  // passes (every weight is 0, the rows are zeros).
  Value spread = kb.fmul(kb.fadd(st[0], st[1]), kb.cF32(kLn2));
  Value inRange = kb.orI(kb.notI1(anyKey),
                         kb.cmpf(arith::CmpFPredicate::OLE, spread,
                                 kb.cF32(kMaxSymmetricSpread)));
  Value finite = kb.cmpf(arith::CmpFPredicate::OEQ, st[3], zero);
  Value enough = kb.cmpi(arith::CmpIPredicate::uge, N,
                         kb.idx(kMinSymmetricRows));
  Value guard = kb.andI(kb.andI(inRange, finite), enough);
  kb.ifThen(kb.andI(kb.eq(blk, c0), kb.eq(tid, c0)), [&] {
    auto f = [&](Value flag) {
      return kb.select(flag, kb.cF32(1.0), zero);
    };
    kb.store(c, stats, {bi, kb.idx(kShift)});
    kb.store(f(guard), stats, {bi, kb.idx(kGuard)});
    kb.store(f(anyKey), stats, {bi, kb.idx(kAnyKey)});
    kb.store(zero, stats, {bi, kb.idx(kRedo)});
  });
  Value j = kb.add(kb.mul(blk, kb.idx(kThreads)), tid);
  kb.ifThen(kb.andI(guard, kb.lt(j, N)), [&] {
    Value valid = mask ? kb.load(mask, {bi, j}) : kb.cBool(true);
    // With a valid key, c is finite and h_j - c <= 0.
    Value w = kb.select(valid, exp2Approx(b, kb.fsub(kb.load(half, {bi, j}), c)),
                        zero);
    Type elt = cast<MemRefType>(vp.getType()).getElementType();
    kb.forLoop(c0, W, c1, [&](Value col) {
      Value isE = kb.lt(col, K);
      Value x = kb.loadF(e, {bi, j, kb.select(isE, col, c0)});
      // A masked key's column is 0, not 0 · e.
      Value v = kb.select(isE, kb.select(valid, kb.fmul(w, x), zero),
                          kb.select(kb.eq(col, K), w, zero));
      kb.store(arith::TruncFOp::create(b, elt, v), vp, {bi, j, col});
    });
    kb.forLoop(c0, kb.dim(acc, 2), c1,
               [&](Value col) { kb.store(zero, acc, {bi, j, col}); });
  });
}

/// Kernel 3: the block's share of the pairs (see the file comment).
static void emitPairs(GPUKernel &k, const FlashMixSpec &spec,
                      const FlashMmaTile &tile, Type elt) {
  GpuKernelBuilder &kb = k.kb;
  ImplicitLocOpBuilder &b = k.b;
  Mma m{b, kb, elt};
  const int64_t chunks = tile.depth / 16;
  const int64_t Dp = tile.depth;
  unsigned a = 0;
  Value u = k.arg(a++), half = k.arg(a++), stats = k.arg(a++),
        vp = k.arg(a++), acc = k.arg(a++);
  const int64_t W = cast<MemRefType>(vp.getType()).getShape()[2];
  const int64_t wBlocks = W / 8;
  const int64_t K1 = spec.numExperts + 1;
  Value ks = k.workgroup(0), vsJ = k.workgroup(1), vsI = k.workgroup(2),
        ps = k.workgroup(3), hs = k.workgroup(4);
  Value c0 = kb.idx(0), c1 = kb.idx(1), c2 = kb.idx(2);
  Value bi = kb.blockId(gpu::Dimension::y);
  Value N = kb.dim(u, 1), D = kb.dim(u, 2);
  Value T = kb.ceilDiv(N, kb.idx(kRowTile));
  Value S = kb.divu(kb.gridDim(), T);
  Value I = kb.remu(kb.blockId(), T), split = kb.divu(kb.blockId(), T);

  // Only where the element's guard held.
  auto gate = scf::IfOp::create(
      b, kb.cmpf(arith::CmpFPredicate::UNE,
                 kb.load(stats, {bi, kb.idx(kGuard)}), kb.cF32(0.0)),
      /*withElseRegion=*/false);
  b.setInsertionPoint(gate.thenBlock()->getTerminator());

  Value tid = kb.threadId();
  Value warp = kb.divu(tid, kb.idx(kWarp));
  Value lane = kb.remu(tid, kb.idx(kWarp));
  Value g = kb.divu(lane, kb.idx(4)), tig = kb.remu(lane, kb.idx(4));
  Value ldRow = kb.remu(lane, kb.idx(8)), ldSel = kb.divu(lane, kb.idx(8));
  Value rowBase = kb.mul(I, kb.idx(kRowTile));
  // The thread's rows within the block: 32 warp + 16 t + 8 r + g.
  Value r0 = kb.add(kb.mul(warp, kb.idx(32)), g);
  SmallVector<Value> localRows;
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t r = 0; r < 2; ++r)
      localRows.push_back(kb.add(r0, kb.idx(16 * t + 8 * r)));
  Value zeroE = m.zeroElt();
  Value zero = kb.cF32(0.0);
  Value inf = kb.cF32(std::numeric_limits<float>::infinity());

  // U_I's fragments (zeros past N and D) and -h_i (-inf past N).
  SmallVector<Value> qFrag, negH;
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t c = 0; c < chunks; ++c) {
      SmallVector<Value> elems;
      for (int64_t hf = 0; hf < 2; ++hf)
        for (int64_t r = 0; r < 2; ++r)
          for (int64_t x = 0; x < 2; ++x) {
            Value row = kb.add(rowBase, localRows[2 * t + r]);
            Value d = kb.add(kb.mul(tig, c2), kb.idx(16 * c + 8 * hf + x));
            Value ok = kb.andI(kb.lt(row, N), kb.lt(d, D));
            Value v = kb.load(u, {bi, kb.select(ok, row, c0),
                                  kb.select(ok, d, c0)});
            elems.push_back(kb.select(ok, v, zeroE));
          }
      qFrag.push_back(m.fragment(elems));
    }
  for (Value lr : localRows) {
    Value row = kb.add(rowBase, lr);
    Value in = kb.lt(row, N);
    Value h = kb.load(half, {bi, kb.select(in, row, c0)});
    negH.push_back(kb.select(in, arith::NegFOp::create(b, h),
                             arith::NegFOp::create(b, inf)));
  }

  // The tiles' staging (TileStaging.h): 16-byte vectors fetched into
  // registers while a step is computed, stored after its barrier; the
  // element loop where u is not 16-byte aligned.
  TileStaging st{kb, b, elt, tid, kThreads, bi, N};
  using Place = TileStaging::Place;
  Value uAligned = st.aligned(u, D, Dp);
  // V' is this op's own buffer: rows of W elements (a multiple of 8) from a
  // 16-byte aligned base.
  Value vpAligned = kb.cBool(true);
  {
    SmallVector<Place> at = st.places(kRowTile, W);
    st.put(st.fetch(vp, at, kb.idx(W), rowBase, vpAligned), at, vsI);
  }

  // The walk: L = 1 + m tiles J = I + jt (mod T), two halves each, this
  // split's [s · 2L / S, (s + 1) · 2L / S).
  Value even = kb.eq(kb.remu(T, c2), c0);
  Value halfT = kb.divu(T, c2);
  Value mOdd = kb.divu(kb.sub(T, c1), c2);
  Value mEven = kb.select(kb.lt(I, halfT), halfT, kb.sub(halfT, c1));
  Value steps = kb.mul(kb.add(kb.select(even, mEven, mOdd), c1), c2);
  Value lo = kb.divu(kb.mul(split, steps), S);
  Value hi = kb.divu(kb.mul(kb.add(split, c1), steps), S);

  Value scale = kb.cF32(kLog2E / spec.scaleDiv);
  Value toDot = kb.cF32(-spec.scaleDiv / kLog2E);
  Value negInf = arith::NegFOp::create(b, inf);
  // B operands of V (rows = keys, k) at rows [16 kc, 16 kc + 16) of `tile`:
  // ldmatrix.trans, two 8-column blocks a load.
  auto valueFrags = [&](Value tileBuf, int64_t kc) {
    SmallVector<Value> frags;
    for (int64_t eb = 0; eb < wBlocks; eb += 2) {
      bool pair = eb + 1 < wBlocks;
      Value vf = m.valueFragments(tileBuf, 16 * kc, eb, pair, ldRow, ldSel);
      frags.push_back(m.rows(vf, 0, 2));
      if (pair)
        frags.push_back(m.rows(vf, 2, 2));
    }
    return frags;
  };
  // acc[b, row, col] += v for the columns below K + 1 and rows below N.
  auto addToRows = [&](Value row, Value col, Value v) {
    kb.ifThen(kb.andI(kb.lt(row, N), kb.lt(col, kb.idx(K1))), [&] {
      memref::AtomicRMWOp::create(b, arith::AtomicRMWKind::addf, v, acc,
                                  ValueRange{bi, row, col});
    });
  };

  // A step's key tile: the half of tile J = I + step / 2 (mod T).
  auto j0Of = [&](Value step) {
    Value J = kb.remu(kb.add(I, kb.divu(step, c2)), T);
    return kb.add(kb.mul(J, kb.idx(kRowTile)),
                  kb.mul(kb.remu(step, c2), kb.idx(kKeyHalf)));
  };
  SmallVector<Place> keyAt = st.places(kKeyHalf, Dp),
                     valueAt = st.places(kKeyHalf, W);
  const int64_t nKey = keyAt.size(), nValue = valueAt.size();
  // The registers a step's tiles pass through: the keys' and V'_J's vectors
  // and -h_j of key tid (tid < 64) in the dot product's units (|u_j|² / 2;
  // -inf past N): the logits' accumulators start from it, so a weight is
  // one FFMA and one EX2.
  auto fetchStep = [&](Value step) {
    Value j0 = j0Of(step);
    SmallVector<Value> xs = st.fetch(u, keyAt, D, j0, uAligned);
    xs.append(st.fetch(vp, valueAt, kb.idx(W), j0, vpAligned));
    Value j = kb.add(j0, kb.remu(tid, kb.idx(kKeyHalf)));
    Value in = kb.lt(j, N);
    Value h = kb.load(half, {bi, kb.select(in, j, c0)});
    xs.push_back(kb.select(in, kb.fmul(h, toDot), negInf));
    return xs;
  };

  SmallVector<Value> init(2 * wBlocks * 4, zero);
  const int64_t nAcc = init.size();
  init.append(fetchStep(lo));
  SmallVector<Value> accI = kb.forLoop(
      lo, hi, c1, init, [&](Value step, ValueRange carried) -> SmallVector<Value> {
        SmallVector<Value> accs(carried.take_front(nAcc));
        ValueRange staged = carried.drop_front(nAcc);
        Value jt = kb.divu(step, c2);
        Value j0 = j0Of(step);
        // The last step's reads of the buffers are done.
        kb.barrier();
        kb.ifThenElse(
            uAligned, [&] { st.put(staged.take_front(nKey), keyAt, ks); },
            [&] { st.elements(u, ks, kKeyHalf, Dp, D, j0); });
        st.put(staged.slice(nKey, nValue), valueAt, vsJ);
        kb.ifThen(kb.lt(tid, kb.idx(kKeyHalf)),
                  [&] { kb.store(staged.back(), hs, {tid}); });
        kb.barrier();
        // The next step's tiles in flight while this one is computed (the
        // last step loads its own again: in bounds, not used).
        Value next = kb.add(step, c1);
        SmallVector<Value> ahead =
            fetchStep(kb.select(kb.lt(next, hi), next, step));
        // S - h_J = U_I U_J^T - h_J (dot units): s[t * 8 + nb], row tile t,
        // key block nb, from accumulators holding -h_j of the thread's
        // columns 8 nb + 2 tig + x.
        SmallVector<SmallVector<Value>> s(2 * 8);
        for (int64_t nb = 0; nb < 8; ++nb) {
          Value h[2];
          for (int64_t x = 0; x < 2; ++x)
            h[x] = kb.load(hs, {kb.add(kb.mul(tig, c2), kb.idx(8 * nb + x))});
          s[nb] = s[8 + nb] = {h[0], h[1], h[0], h[1]};
        }
        for (int64_t c = 0; c < chunks; ++c)
          for (int64_t nb = 0; nb < 8; nb += 2) {
            Value kf = m.keyFragments(ks, nb * 8, 16 * c, ldRow, ldSel);
            for (int64_t t = 0; t < 2; ++t) {
              s[t * 8 + nb] = m.mma(qFrag[t * chunks + c], m.rows(kf, 0, 2),
                                    s[t * 8 + nb]);
              s[t * 8 + nb + 1] = m.mma(qFrag[t * chunks + c],
                                        m.rows(kf, 2, 2), s[t * 8 + nb + 1]);
            }
          }
        // A = 2^((S - h_J) log2(e)/τ - h_i) (h_i in log2 units): the
        // thread's columns 8 nb + 2 tig + x of rows r (g, g + 8).
        // pairs[t][r][nb]: the rounded pair (columns 8 nb + 2 tig + {0, 1}).
        SmallVector<Value> pairs(2 * 2 * 8);
        for (int64_t t = 0; t < 2; ++t)
          for (int64_t nb = 0; nb < 8; ++nb)
            for (int64_t r = 0; r < 2; ++r) {
              Value p[2];
              for (int64_t x = 0; x < 2; ++x) {
                p[x] = exp2Approx(
                    b, kb.fma(s[t * 8 + nb][2 * r + x], scale, negH[2 * t + r]));
              }
              pairs[(t * 2 + r) * 8 + nb] = m.roundPair(p[0], p[1]);
            }
        // Rows of I: acc_I += A V'_J, A's A operand per 16 keys kc from key
        // blocks 2 kc and 2 kc + 1.
        for (int64_t kc = 0; kc < 4; ++kc) {
          SmallVector<Value> vf = valueFrags(vsJ, kc);
          for (int64_t t = 0; t < 2; ++t) {
            Value aFrag = m.fragmentOfPairs(
                {pairs[(t * 2 + 0) * 8 + 2 * kc], pairs[(t * 2 + 1) * 8 + 2 * kc],
                 pairs[(t * 2 + 0) * 8 + 2 * kc + 1],
                 pairs[(t * 2 + 1) * 8 + 2 * kc + 1]});
            for (int64_t eb = 0; eb < wBlocks; ++eb) {
              int64_t at = (t * wBlocks + eb) * 4;
              SmallVector<Value> d =
                  m.mma(aFrag, vf[eb], ArrayRef<Value>(accs).slice(at, 4));
              std::copy(d.begin(), d.end(), accs.begin() + at);
            }
          }
        }
        // Rows of J (off the diagonal pair): A through shared memory, then
        // warp w takes keys [16 w, 16 w + 16) of the half: A^T V'_I over
        // the block's 128 rows.
        kb.ifThen(kb.cmpi(arith::CmpIPredicate::ne, jt, c0), [&] {
          for (int64_t t = 0; t < 2; ++t)
            for (int64_t r = 0; r < 2; ++r)
              for (int64_t nb = 0; nb < 8; ++nb) {
                Value col = kb.add(kb.mul(tig, c2), kb.idx(8 * nb));
                vector::StoreOp::create(b, pairs[(t * 2 + r) * 8 + nb], ps,
                                        ValueRange{localRows[2 * t + r], col});
              }
          kb.barrier();
          SmallVector<Value> accJ(wBlocks * 4, zero);
          Value keyCol = kb.mul(warp, kb.idx(16));
          for (int64_t kc = 0; kc < kRowTile / 16; ++kc) {
            // A^T's [16 keys x 16 rows] A operand: ps's quadrants by row,
            // (keys lo, rows lo), (hi, lo), (lo, hi), (hi, hi) of A^T, each
            // read transposed (LayoutTest: TransposedKeyPlacementIsAnAOperand).
            Value aFrag =
                m.ldmatrixWindow(ps, quadrantsByRow(), kb.idx(16 * kc), keyCol,
                                 ldRow, ldSel, 4, /*transpose=*/true);
            SmallVector<Value> vf = valueFrags(vsI, kc);
            for (int64_t eb = 0; eb < wBlocks; ++eb) {
              SmallVector<Value> d = m.mma(
                  aFrag, vf[eb], ArrayRef<Value>(accJ).slice(eb * 4, 4));
              std::copy(d.begin(), d.end(), accJ.begin() + eb * 4);
            }
          }
          for (int64_t eb = 0; eb < wBlocks; ++eb)
            for (int64_t r = 0; r < 2; ++r)
              for (int64_t x = 0; x < 2; ++x) {
                Value row = kb.add(kb.add(j0, keyCol), kb.add(g, kb.idx(8 * r)));
                Value col = kb.add(kb.mul(tig, c2), kb.idx(8 * eb + x));
                addToRows(row, col, accJ[eb * 4 + 2 * r + x]);
              }
        });
        accs.append(ahead);
        return accs;
      });
  accI.resize(nAcc);
  // Rows of I: the walk's sums.
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t eb = 0; eb < wBlocks; ++eb)
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t x = 0; x < 2; ++x) {
          Value row = kb.add(rowBase, localRows[2 * t + r]);
          Value col = kb.add(kb.mul(tig, c2), kb.idx(8 * eb + x));
          addToRows(row, col, accI[(t * wBlocks + eb) * 4 + 2 * r + x]);
        }
}

/// Kernel 4: a thread a row, the normalized row and its lse; a row sum too
/// small for f32 sends its element to the exact kernel.
static void emitRows(GPUKernel &k, const FlashMixSpec &spec) {
  GpuKernelBuilder &kb = k.kb;
  unsigned a = 0;
  Value half = k.arg(a++), stats = k.arg(a++), acc = k.arg(a++),
        out = k.arg(a++);
  Value lse = spec.withLse ? k.arg(a++) : Value();
  Value B = kb.dim(out, 0), N = kb.dim(out, 1);
  const int64_t K = spec.numExperts;
  Value zero = kb.cF32(0.0);
  k.forItem(kb.mul(B, N), [&](Value item) {
    Value bi = kb.divu(item, N), i = kb.remu(item, N);
    Value ran = kb.cmpf(arith::CmpFPredicate::UNE,
                        kb.load(stats, {bi, kb.idx(kGuard)}), zero);
    kb.ifThen(ran, [&] {
      Value den = kb.load(acc, {bi, i, kb.idx(K)});
      Value inv = kb.divOrZero(kb.cF32(1.0), den);
      for (int64_t c = 0; c < K; ++c)
        kb.store(kb.fmul(kb.load(acc, {bi, i, kb.idx(c)}), inv), out,
                 {bi, i, kb.idx(c)});
      if (lse) {
        Value h = kb.fadd(kb.load(half, {bi, i}),
                          kb.load(stats, {bi, kb.idx(kShift)}));
        kb.store(kb.fma(h, kb.cF32(kLn2), kb.log(den)), lse, {bi, i});
      }
      Value anyKey = kb.cmpf(arith::CmpFPredicate::UNE,
                             kb.load(stats, {bi, kb.idx(kAnyKey)}), zero);
      Value small = kb.cmpf(arith::CmpFPredicate::ULT, den,
                            kb.cF32(kMinSymmetricSum));
      // Every writer writes 1: the race is benign.
      kb.ifThen(kb.andI(anyKey, small), [&] {
        kb.store(kb.cF32(1.0), stats, {bi, kb.idx(kRedo)});
      });
    });
  });
}

void mlir::moe::gpu_lowering::launchSymmetricMixMma(
    HostCode &h, StringRef name, const FlashMixSpec &spec,
    const FlashMmaTile &tile, Value q, ValueRange args, Location loc) {
  GpuKernelBuilder &kb = h.kb;
  ImplicitLocOpBuilder &b = h.b;
  Type f32 = b.getF32Type();
  Type elt = cast<MemRefType>(q.getType()).getElementType();
  const int64_t K = spec.numExperts, W = widthOf(K);
  // args: q (= u), u, e, [key mask], out, [lse].
  unsigned a = 1;
  Value u = args[a++], e = args[a++];
  Value mask = spec.hasKeyMask ? args[a++] : Value();
  Value out = args[a++];
  Value lse = spec.withLse ? args[a++] : Value();
  Value B = kb.dim(u, 0), N = kb.dim(u, 1);
  Value blocks = kb.ceilDiv(N, kb.idx(kThreads));
  const int64_t dyn = ShapedType::kDynamic;
  Value half = h.alloc(MemRefType::get({dyn, dyn}, f32), {B, N});
  Value part = h.alloc(MemRefType::get({dyn, dyn, 4}, f32), {B, blocks});
  Value stats = h.alloc(MemRefType::get({dyn, 4}, f32), {B});
  Value vp = h.alloc(MemRefType::get({dyn, dyn, W}, elt), {B, N});
  Value acc = h.alloc(MemRefType::get({dyn, dyn, K + 1}, f32), {B, N});
  Type scratchType = workgroupMemRef({kWarps}, f32);

  {
    SmallVector<Value> operands = {u, e};
    if (mask)
      operands.push_back(mask);
    operands.append({half, part});
    GPUKernel k(h, (name + "_norms").str(), operands, {scratchType},
                {kThreads, 1, 1}, loc);
    emitNorms(k, spec);
    k.launch({blocks, B, kb.idx(1)});
  }
  {
    SmallVector<Value> operands = {e};
    if (mask)
      operands.push_back(mask);
    operands.append({half, part, stats, vp, acc});
    GPUKernel k(h, (name + "_values").str(), operands, {scratchType},
                {kThreads, 1, 1}, loc);
    emitValues(k, spec);
    k.launch({blocks, B, kb.idx(1)});
  }
  {
    SmallVector<Type> workgroup = {
        workgroupMemRef({kKeyHalf, tile.depth + kPad}, elt),
        workgroupMemRef({kKeyHalf, W + kPad}, elt),
        workgroupMemRef({kRowTile, W + kPad}, elt),
        workgroupMemRef({kRowTile, kKeyHalf + kPad}, elt),
        workgroupMemRef({kKeyHalf}, f32)};
    GPUKernel k(h, (name + "_pairs").str(),
                ValueRange{u, half, stats, vp, acc}, workgroup,
                {kThreads, 1, 1}, loc);
    alignWorkgroupBuffers(k.func);
    // Two blocks a multiprocessor stated to ptxas (up to 255 registers):
    // without it ptxas aimed at more for the dynamic-N kernel on sm_90 (128
    // registers) and spilled, as the exact kernel did (FlashMmaTile's
    // blocksPerSM).
    k.func->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                    k.b.getI32IntegerAttr(2));
    emitPairs(k, spec, tile, elt);
    // Splits, while T x B < 264 blocks: the S of 1 .. kMaxSplits whose
    // grid fills its last wave of 264 blocks best (S / waves(S) largest,
    // the fewest splits on a tie): 128 tiles take 2 (256 blocks), not 3
    // (384: a second wave of 120).
    Value T = kb.ceilDiv(N, kb.idx(kRowTile));
    Value TB = kb.mul(T, B);
    Value wave = kb.idx(kSplitBelowBlocks);
    Value S = kb.idx(1), wavesS = kb.ceilDiv(TB, wave);
    for (int64_t s = 2; s <= kMaxSplits; ++s) {
      Value waves = kb.ceilDiv(kb.mul(TB, kb.idx(s)), wave);
      Value better = kb.cmpi(arith::CmpIPredicate::ugt,
                             kb.mul(kb.idx(s), wavesS), kb.mul(S, waves));
      S = kb.select(better, kb.idx(s), S);
      wavesS = kb.select(better, waves, wavesS);
    }
    S = kb.select(kb.cmpi(arith::CmpIPredicate::ult, TB, wave), S, kb.idx(1));
    k.launch({kb.mul(T, S), B, kb.idx(1)});
  }
  {
    SmallVector<Value> operands = {half, stats, acc, out};
    if (lse)
      operands.push_back(lse);
    GPUKernel k(h, (name + "_rows").str(), operands, {}, {kThreads, 1, 1}, loc);
    emitRows(k, spec);
    k.launchOver(kb.mul(B, N));
  }
  FlashMixSpec gated = spec;
  gated.gated = true;
  SmallVector<Value> exactArgs(args);
  exactArgs.push_back(stats);
  launchFlashMixMma(h, name, gated, tile, q, exactArgs, loc);
  for (Value buffer : {half, part, stats, vp, acc})
    h.release(buffer);
}
