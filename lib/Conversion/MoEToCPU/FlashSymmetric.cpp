//===- FlashSymmetric.cpp - Similarity mixing over half the pairs ---------===//
//
// Part of the MoE-MLIR project.
//
// similarity_inform's logits are symmetric (q = k = u): with n_i = |u_i|²/τ
// and S_ij = u_i·u_j/τ, Cauchy-Schwarz gives S_ij <= (n_i + n_j)/2, so
//   A_ij = exp(S_ij - n_i/2 - n_j/2) = exp(-|u_i - u_j|²/(2τ)) <= 1
// is a symmetric weight that cannot overflow, and
//   softmax_j(S_ij) e_j = Σ_j A_ij V'_j[:K] / Σ_j A_ij V'_j[K],
//   V'_j = [w_j e_j, w_j],  w_j = exp(n_j/2 - c) (0 for a masked key),
// c = max over the valid keys of n_j/2 (the factor exp(n_i/2 - c) of row i
// cancels). A pair of 32-row granules (R <= J) is computed once and used
// twice: A_RJ V'_J into the rows of R and A_RJ^T V'_R into those of J, which
// halves the dot products and the exponentials of the exact kernel
// (emitFlashMix) and needs no online max or rescaling. Issue #47 item 4.
//
// Range: a valid row's sum holds its own term w_i >= exp(-spread/2), spread =
// max - min of n_j over the valid keys; a weight A_ij dropped by
// softmaxWeight (below e^-87) carries at most e^(-87 + spread/2) of the row's
// largest term. The kernel runs where spread <= kMaxSpread (60: e^-57 at
// most), every value of u and e is finite and N >= kMinRows; otherwise, and
// when a row's sum comes out below kMinSum although its batch element has a
// valid key (a masked row far from every key), the exact kernel runs instead
// (its result replaces everything). Determinism: the pairs of a batch element
// are dealt to S fixed slots (S from B only, never from the thread count),
// each a parallel item with its own accumulator, summed in slot order.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mlir::moe::cpu_lowering;

namespace {
constexpr int64_t TQ = kQueryTile, TK = kKeyTile, KV = kKeyTile / kLanes;
/// Row tiles of a 32-row granule (the key tile's size).
constexpr int64_t kSubTiles = kKeyTile / kQueryTile;
/// Slots a batch element's pairs are dealt to: 16 / B, at least 1.
constexpr int64_t kSlotsPerRun = 16;

/// Rows [row0, row0 + n) of acc[slot, b] ([S, B, Npad, Wp] f32) as an
/// [n, Wp] memref (strided).
Value accRows(CpuKernelBuilder &kb, Value acc, Value slot, Value b, Value row0,
              int64_t n) {
  auto type = cast<MemRefType>(acc.getType());
  SmallVector<OpFoldResult> offsets = {slot, b, row0, kb.b.getIndexAttr(0)};
  SmallVector<OpFoldResult> sizes = {kb.b.getIndexAttr(1), kb.b.getIndexAttr(1),
                                     kb.b.getIndexAttr(n),
                                     OpFoldResult(kb.dim(acc, 3))};
  SmallVector<OpFoldResult> strides(4, kb.b.getIndexAttr(1));
  auto resultType = memref::SubViewOp::inferRankReducedResultType(
      {n, ShapedType::kDynamic}, type, offsets, sizes, strides);
  return memref::SubViewOp::create(kb.b, cast<MemRefType>(resultType), acc,
                                   offsets, sizes, strides);
}

/// The TQ x TQ block of p [TQ, TK] at columns [c0, c0 + TQ), or with
/// `transposed` the block of p^T at rows [c0, c0 + TQ): both as one type, a
/// fully strided memref<TQ x TQ>, so that a select picks either.
Value blockOf(CpuKernelBuilder &kb, Value p, Value c0, bool transposed) {
  Value src = p;
  if (transposed) {
    auto perm = AffineMapAttr::get(AffineMap::getPermutationMap(
        ArrayRef<unsigned>{1, 0}, kb.b.getContext()));
    src = memref::TransposeOp::create(kb.b, p, perm);
  }
  auto type = cast<MemRefType>(src.getType());
  SmallVector<OpFoldResult> offsets = {kb.b.getIndexAttr(0), c0};
  if (transposed)
    std::swap(offsets[0], offsets[1]);
  SmallVector<OpFoldResult> sizes = {kb.b.getIndexAttr(TQ),
                                     kb.b.getIndexAttr(TQ)};
  SmallVector<OpFoldResult> strides(2, kb.b.getIndexAttr(1));
  auto viewType = cast<MemRefType>(
      memref::SubViewOp::inferResultType(type, offsets, sizes, strides));
  Value view =
      memref::SubViewOp::create(kb.b, viewType, src, offsets, sizes, strides);
  auto anyStrides = MemRefType::get(
      {TQ, TQ}, kb.f32(),
      StridedLayoutAttr::get(kb.b.getContext(), ShapedType::kDynamic,
                             {ShapedType::kDynamic, ShapedType::kDynamic}));
  return memref::CastOp::create(kb.b, anyStrides, view);
}
} // namespace

void mlir::moe::cpu_lowering::emitSymmetricMix(CpuKernelBuilder &kb,
                                               const KernelOptions &opts,
                                               const SymmetricMixSpec &s,
                                               function_ref<void()> exact) {
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value batch = s.batch, rows = s.rows, keysPad = s.keysPad;
  Value width = s.width;
  // V' has K + 1 columns: the weighted values and the weight.
  Value widthPad = roundUp(kb, kb.add(width, c1), kLanes);
  Value widthChunks = kb.divu(widthPad, kb.idx(kLanes));
  Value invTau = kb.cF32(1.0 / static_cast<double>(s.tau));
  Value inf = kb.cF32(std::numeric_limits<float>::infinity());
  auto dynF32 = [&](int64_t rank) {
    return MemRefType::get(SmallVector<int64_t>(rank, kDyn), f32);
  };

  // Below kMinSymmetricRows the exact kernel runs whatever the data, so the
  // set-up below (three allocations and a pass over u and e) covers no batch
  // element there: a decode call (N <= 16) pays nothing for this path.
  Value enough = kb.cmpi(arith::CmpIPredicate::uge, rows,
                         kb.idx(kMinSymmetricRows));
  Value setUp = kb.select(enough, batch, c0);

  // 1. Per batch element: h_j = n_j / 2 (+inf for the padding keys, which
  // zeroes their weights A), c, the spread, the valid-key count and
  // V'[b, j, :] (zero for masked and padding keys).
  Value half = kb.alloc(dynF32(2), {setUp, keysPad});
  Value packed = kb.alloc(dynF32(3), {setUp, keysPad, widthPad});
  // stats[b] = {c, spread, valid keys, non-finite flag (NaN iff some u or e
  // of the element is not finite)}.
  Value stats = kb.alloc(MemRefType::get({kDyn, 4}, f32), {setUp});
  Value depthChunks = kb.ceilDiv(s.depth, kb.idx(kLanes));
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  kb.workers(opts, setUp, [&](Value b, Value) {
    // Key j of element b: inside the rows, the row it reads (clamped: the
    // padding keys read the last row, whose values are then not used) and
    // valid (inside and, with a key mask, kept).
    struct Key {
      Value in, row, valid;
    };
    auto keyAt = [&](Value j) {
      Key k{kb.cmpi(arith::CmpIPredicate::ult, j, rows),
            kb.mins(j, kb.sub(rows, c1)), Value()};
      k.valid = s.keyValid ? kb.cmpf(arith::CmpFPredicate::ONE,
                                     kb.load(s.keyValid, {b, j}), kb.cF32(0.0))
                           : k.in;
      return k;
    };
    // Norms, the extremes of h over the valid keys, the count.
    SmallVector<Value> init = {kb.negInfLike(f32), inf, kb.cF32(0.0),
                               kb.cF32(0.0)};
    SmallVector<Value> st = kb.forLoop(
        c0, keysPad, c1, init, [&](Value j, ValueRange a) -> SmallVector<Value> {
          Key key = keyAt(j);
          Value in = key.in, jc = key.row, valid = key.valid;
          Value sq = kb.forLoop(c0, depthChunks, c1, ValueRange{zeros},
                                [&](Value c, ValueRange acc) -> SmallVector<Value> {
                                  Value col = kb.mul(c, kb.idx(kLanes));
                                  Value v = kb.vloadMasked(
                                      s.u, {b, jc, col}, kb.sub(s.depth, col), 0.0);
                                  return {kb.fma(v, v, acc[0])};
                                })[0];
          Value h = kb.fmul(kb.fmul(kb.sum(sq), invTau), kb.cF32(0.5));
          kb.store(kb.select(in, h, inf), half, {b, j});
          // Σ (h - h) is NaN iff some norm is not finite.
          Value bad = kb.select(in, kb.fsub(h, h), kb.cF32(0.0));
          return {kb.select(valid, kb.fmax(a[0], h), a[0]),
                  kb.select(valid, kb.fmin(a[1], h), a[1]),
                  kb.fadd(a[2], kb.select(valid, kb.cF32(1.0), kb.cF32(0.0))),
                  kb.fadd(a[3], bad)};
        });
    Value c = st[0];
    // V'[b, j, :K] = w_j e_j, V'[b, j, K] = w_j, zeros beyond; the values'
    // non-finite flag joins the norms'.
    Value badE = kb.forLoop(
        c0, keysPad, c1, ValueRange{st[3]},
        [&](Value j, ValueRange a) -> SmallVector<Value> {
          Key key = keyAt(j);
          Value in = key.in, jc = key.row, valid = key.valid;
          Value w = kb.select(valid, kb.exp(kb.fsub(kb.load(half, {b, j}), c)),
                              kb.cF32(0.0));
          Value wv = kb.splat(w, kLanes);
          Value bad = kb.forLoop(
              c0, widthChunks, c1, ValueRange{a[0]},
              [&](Value ch, ValueRange acc) -> SmallVector<Value> {
                Value col = kb.mul(ch, kb.idx(kLanes));
                Value count = kb.select(in, kb.sub(width, kb.mins(col, width)),
                                        c0);
                Value e = kb.vloadMasked(s.e, {b, jc, col}, count, 0.0);
                // Masked keys get 0, not 0 * e (a non-finite e must not turn
                // into NaN there).
                Value v = kb.select(kb.splat(valid, kLanes), kb.fmul(wv, e),
                                    zeros);
                // The weight at column K.
                Value lane = kb.iota(kb.castInt(col, kb.i32()), kLanes);
                Value isK = kb.eq(lane, kb.splat(kb.castInt(width, kb.i32()),
                                                 kLanes));
                kb.vstore(kb.select(isK, wv, v), packed, {b, j, col});
                return {kb.fadd(acc[0], kb.sum(kb.fsub(e, e)))};
              })[0];
          return {bad};
        })[0];
    kb.store(c, stats, {b, kb.idx(0)});
    kb.store(kb.fsub(st[0], st[1]), stats, {b, kb.idx(1)});
    kb.store(st[2], stats, {b, kb.idx(2)});
    kb.store(badE, stats, {b, kb.idx(3)});
  });

  // 2. The guard: every element's spread within range (false for NaN), no
  // non-finite value, enough rows for the pairs to pay.
  Value ok = kb.forLoop(
      c0, setUp, c1, ValueRange{enough},
      [&](Value b, ValueRange a) -> SmallVector<Value> {
        Value spread = kb.load(stats, {b, kb.idx(1)});
        Value finite = kb.cmpf(arith::CmpFPredicate::OEQ,
                               kb.load(stats, {b, kb.idx(3)}), kb.cF32(0.0));
        // No valid key: spread is -inf - inf; the element's rows are zeros
        // either way.
        Value none = kb.cmpf(arith::CmpFPredicate::OEQ,
                             kb.load(stats, {b, kb.idx(2)}), kb.cF32(0.0));
        Value inRange = kb.orI(none, kb.cmpf(arith::CmpFPredicate::OLE, spread,
                                            kb.cF32(kMaxSymmetricSpread)));
        return {kb.andI(a[0], kb.andI(inRange, finite))};
      })[0];

  SmallVector<Value> redo = kb.ifElse(
      ok, TypeRange{kb.b.getI1Type()},
      [&]() -> SmallVector<Value> {
        // 3. The pairs: items (b, slot), slot s taking the granule rows R = s,
        // s + S, ... against J >= R.
        Value slots = kb.maxs(c1, kb.mins(kb.idx(kSlotsPerRun),
                                          kb.ceilDiv(kb.idx(kSlotsPerRun), batch)));
        Value acc = kb.alloc(dynF32(4), {slots, batch, keysPad, widthPad});
        Value granules = kb.divu(keysPad, kb.idx(TK));
        Value dotAll = kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
        Value pAll = kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
        Value last = kb.sub(rows, c1);
        // (Never inline: the path needs N >= kMinSymmetricRows, so there is
        // work for the pool, and the body is emitted once.)
        Value onPool = kb.cBool(false);
        kb.workers(opts, kb.mul(batch, slots), [&](Value item, Value worker) {
          Value b = kb.divu(item, slots), slot = kb.remu(item, slots);
          Value dotBuf = kb.workerSlice(dotAll, worker);
          Value pBuf = kb.workerSlice(pAll, worker);
          // This slot's accumulator starts at zero.
          kb.forLoop(c0, keysPad, c1, [&](Value i) {
            kb.forLoop(c0, widthChunks, c1, [&](Value ch) {
              kb.vstore(zeros, acc, {slot, b, i, kb.mul(ch, kb.idx(kLanes))});
            });
          });
          kb.forLoop(slot, granules, slots, [&](Value R) {
            kb.forLoop(R, granules, c1, [&](Value J) {
              Value j0 = kb.mul(J, kb.idx(TK));
              SmallVector<Value> hKeys;
              for (int64_t v = 0; v < KV; ++v)
                hKeys.push_back(
                    kb.vload(half, {b, kb.add(j0, kb.idx(v * kLanes))}));
              Value offDiagonal = kb.cmpi(arith::CmpIPredicate::ne, R, J);
              // One row tile of R at a time (loops, not unrolled: the code
              // of a tile is large, and the kernel's compile time with it).
              kb.forLoop(c0, kb.idx(kSubTiles), c1, [&](Value q) {
                Value i0 = kb.add(kb.mul(R, kb.idx(TK)), kb.mul(q, kb.idx(TQ)));
                SmallVector<Value> rowIdx;
                for (int64_t r = 0; r < TQ; ++r)
                  rowIdx.push_back(kb.mins(kb.add(i0, kb.idx(r)), last));
                DotTile dots = dotTile(kb, opts, s.u, s.keysT, b, rowIdx, J,
                                       s.depth, dotBuf);
                // A = exp(dot / tau - h_i - h_j) (the padding rows' and
                // keys' h is +inf: 0).
                for (int64_t r = 0; r < TQ; ++r) {
                  Value hRow = kb.splat(
                      kb.load(half, {b, kb.add(i0, kb.idx(r))}), kLanes);
                  for (int64_t v = 0; v < KV; ++v) {
                    Value x = kb.fsub(kb.fsub(kb.fmul(dots.at(r, v),
                                                      kb.splat(invTau, kLanes)),
                                              hRow),
                                      hKeys[v]);
                    kb.vstore(kb.softmaxWeight(x), pBuf,
                              {kb.idx(r), kb.idx(v * kLanes)});
                  }
                }
                // The rows of R from the keys of J and, off the diagonal, the
                // rows of J from the keys of R: 8 x 8 blocks of A (columns of
                // A, or rows of A^T) through one accumulateTile, so that its
                // code is emitted once (the kernel's compile time).
                Value dirs = kb.select(offDiagonal, kb.idx(2), c1);
                kb.forLoop(c0, dirs, c1, [&](Value d) {
                  Value fromJ = kb.eq(d, c0);
                  kb.forLoop(c0, kb.idx(kSubTiles), c1, [&](Value p) {
                    Value c = kb.mul(p, kb.idx(TQ));
                    Value block = kb.select(fromJ, blockOf(kb, pBuf, c, false),
                                            blockOf(kb, pBuf, c, true));
                    Value row0 = kb.select(fromJ, i0, kb.add(j0, c));
                    Value key0 = kb.select(fromJ, kb.add(j0, c), i0);
                    accumulateTile(kb, opts, accRows(kb, acc, slot, b, row0, TQ),
                                   block, packed, b, key0, widthChunks, {});
                  });
                });
              });
            });
          });
        }, onPool);

        // 4. Rows: the slots summed in order, then normalized; lse = log(sum)
        // + h_i + c. A row whose sum is below kMinSum while its element has a
        // valid key sends the whole op to the exact kernel.
        Value flags = kb.alloc(MemRefType::get({kDyn}, f32), {kb.mul(batch, granules)});
        kb.workers(opts, kb.mul(batch, granules), [&](Value item, Value) {
          Value b = kb.divu(item, granules), R = kb.remu(item, granules);
          Value c = kb.load(stats, {b, kb.idx(0)});
          Value anyKey = kb.cmpf(arith::CmpFPredicate::OGT,
                                 kb.load(stats, {b, kb.idx(2)}), kb.cF32(0.0));
          Value flag = kb.forLoop(
              c0, kb.idx(TK), c1, ValueRange{kb.cF32(0.0)},
              [&](Value r, ValueRange a) -> SmallVector<Value> {
                Value i = kb.add(kb.mul(R, kb.idx(TK)), r);
                Value inside = kb.cmpi(arith::CmpIPredicate::ult, i, rows);
                return kb.ifElse(
                    inside, TypeRange{f32},
                    [&]() -> SmallVector<Value> {
                      Value den = kb.forLoop(
                          c0, slots, c1, ValueRange{kb.cF32(0.0)},
                          [&](Value sl, ValueRange d) -> SmallVector<Value> {
                            return {kb.fadd(d[0], kb.load(acc, {sl, b, i, width}))};
                          })[0];
                      Value inv = kb.divOrZero(kb.cF32(1.0), den);
                      kb.forLoop(c0, widthChunks, c1, [&](Value ch) {
                        Value col = kb.mul(ch, kb.idx(kLanes));
                        Value sum = kb.forLoop(
                            c0, slots, c1, ValueRange{zeros},
                            [&](Value sl, ValueRange d) -> SmallVector<Value> {
                              return {kb.fadd(d[0], kb.vload(acc, {sl, b, i, col}))};
                            })[0];
                        Value count = kb.sub(width, kb.mins(col, width));
                        kb.vstoreMasked(kb.fmul(sum, kb.splat(inv, kLanes)), s.out,
                                        {b, i, col}, count);
                      });
                      if (s.lse) {
                        Value lse = kb.fadd(kb.fadd(kb.log(den), kb.load(half, {b, i})), c);
                        kb.store(lse, s.lse, {b, i});
                      }
                      Value small = kb.andI(
                          anyKey, kb.cmpf(arith::CmpFPredicate::ULT, den,
                                          kb.cF32(kMinSymmetricSum)));
                      return {kb.select(small, kb.cF32(1.0), a[0])};
                    },
                    [&]() -> SmallVector<Value> { return {a[0]}; });
              })[0];
          kb.store(flag, flags, {item});
        }, onPool);
        Value any = kb.forLoop(c0, kb.mul(batch, granules), c1,
                               ValueRange{kb.cF32(0.0)},
                               [&](Value it, ValueRange a) -> SmallVector<Value> {
                                 return {kb.fadd(a[0], kb.load(flags, {it}))};
                               })[0];
        return {kb.cmpf(arith::CmpFPredicate::OGT, any, kb.cF32(0.0))};
      },
      [&]() -> SmallVector<Value> { return {kb.cBool(true)}; });
  kb.ifThen(redo[0], exact);
}
