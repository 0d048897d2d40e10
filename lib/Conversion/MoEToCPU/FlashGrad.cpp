//===- FlashGrad.cpp - Tiled backward of the online-softmax mixing --------===//
//
// Part of the MoE-MLIR project.
//
// The backward counterpart of emitFlashMix (Flash.h): a row tile of
// kQueryTile rows streams column tiles of kKeyTile columns; per block the
// score dots and the cotangent dots come from the forward's register-blocked
// micro-kernel (dotTile), the op's epilogue turns them into the probability
// S (recomputed from the row's log-sum-exp, no online max) and the logit
// cotangent dX, both staged in per-worker scratch, and each accumulator adds
// its weighted packed column vectors with the forward's PV loop
// (accumulateTile). The caller runs it twice with the roles swapped
// (query-major for the query gradient, key-major for the key and value
// gradients), so that every output row has one writer; with symmetric scores
// a third dot tile (the transposed pair's cotangent) lets one query-major
// pass do both (FlashGradSpec::cotangentT).
//
//===----------------------------------------------------------------------===//

#include "Flash.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::cpu;

/// Column tiles summed into one partial before it joins the total (512
/// columns).
static constexpr int64_t kFoldTiles = 16;

void mlir::moe::cpu::emitFlashGrad(CpuKernelBuilder &k,
                                   const KernelOptions &opts,
                                   const FlashGradSpec &s) {
  constexpr int64_t TQ = kQueryTile, TK = kKeyTile, KV = TK / kLanes;
  constexpr int64_t QB = kQueryTilesPerBlock;
  Type f32 = k.f32();
  Value c0 = k.idx(0), c1 = k.idx(1);
  // A parallel item is a block of row tiles (rowBlocks): a column tile's
  // packed columns and values are read from memory once for the block's
  // tiles (from L1/L2 for all but the first), where one row tile an item
  // streamed every column from L3 for 8 rows (bandwidth-bound at D = 64: 11 MB
  // of packed data per 8 rows at N = 16384).
  RowBlocks blocks = rowBlocks(k, s.batch, s.rows);

  // Blocked summation: each accumulator sums kFoldTiles column tiles into a
  // partial (accAll) that is then added to its total (totAll). One running
  // f32 sum over all N columns (16384 at the prefill size) lost 2-7x the
  // accuracy of eager's blocked GEMM sums; blocks of 512 columns bring the
  // rounding error back to its level at the cost of one add per row and lane
  // per block.
  SmallVector<Value> accAll, totAll;
  for (const auto &a : s.accumulators) {
    auto type = MemRefType::get({QB, TQ, ShapedType::kDynamic}, f32);
    accAll.push_back(k.scratch(opts, type, {a.widthPad}));
    totAll.push_back(k.scratch(opts, type, {a.widthPad}));
  }
  Value sAll = k.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
  Value dAll = k.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
  Value tAll = s.cotangentT
                   ? k.scratch(opts, MemRefType::get({TQ, TK}, f32), {})
                   : Value();

  // Work: a multiply-add per (row, column, depth of each dot and lane of each
  // accumulator).
  Value perPair = k.add(s.score.depth, s.cotangent.depth);
  if (s.cotangentT)
    perPair = k.add(perPair, s.cotangentT->depth);
  for (const auto &a : s.accumulators)
    perPair = k.add(perPair, a.widthPad);
  Value work = k.mul(k.mul(k.mul(s.batch, s.rows), s.cols), perPair);
  workersIfLarge(k, opts, blocks.items, work, [&](Value item, Value worker) {
    SmallVector<Value> accBlk, totBlk, chunks;
    for (auto [buf, tot, a] : llvm::zip(accAll, totAll, s.accumulators)) {
      accBlk.push_back(k.workerSlice(buf, worker));
      totBlk.push_back(k.workerSlice(tot, worker));
      chunks.push_back(k.divu(a.widthPad, k.idx(kLanes)));
    }
    Value sBuf = k.workerSlice(sAll, worker);
    Value dBuf = k.workerSlice(dAll, worker);
    Value tBuf = tAll ? k.workerSlice(tAll, worker) : Value();
    RowBlock blk = rowBlock(k, item, blocks);
    Value b = blk.b, nt = blk.count;
    // Row tile qt's [TQ, W] slices of the block's accumulators.
    auto slices = [&](ArrayRef<Value> blk, Value qt) {
      SmallVector<Value> out;
      for (Value buf : blk)
        out.push_back(k.workerSlice(buf, qt)); // row-tile qt's [TQ, W]
      return out;
    };
    auto zero = [&](ArrayRef<Value> blk) {
      k.forLoop(c0, nt, c1, [&](Value qt) {
        for (auto [buf, n] : llvm::zip(slices(blk, qt), chunks))
          zeroRows(k, buf, n);
      });
    };
    zero(totBlk);

    // Column tiles of the block; a row tile skips those outside its band.
    Value first = c0, last = k.ceilDiv(s.cols, k.idx(TK));
    if (s.band == FlashGradSpec::Band::Lower) // columns c <= the last row
      last = k.ceilDiv(k.add(blk.lastRow, c1), k.idx(TK));
    else if (s.band == FlashGradSpec::Band::Upper) // columns c >= the first
      first = k.divu(blk.firstRow(k, c0), k.idx(TK));

    Value fold = k.idx(kFoldTiles);
    k.forLoop(first, last, fold, [&](Value jf) {
      zero(accBlk);
      k.forLoop(jf, k.mins(k.add(jf, fold), last), c1, [&](Value jt) {
        Value j0 = k.mul(jt, k.idx(TK));
        k.forLoop(c0, nt, c1, [&](Value qt) {
          RowTile tile = blk.tile(k, qt);
          ArrayRef<Value> rowIdx = tile.rows;
          Value inBand = Value();
          if (s.band == FlashGradSpec::Band::Lower)
            inBand = k.cmpi(arith::CmpIPredicate::ule, j0, rowIdx.back());
          else if (s.band == FlashGradSpec::Band::Upper)
            inBand = k.cmpi(arith::CmpIPredicate::uge, jt,
                            k.divu(tile.i0, k.idx(TK)));
          auto body = [&] {
            // (S and dX overwrite the dots a row at a time: sBuf and dBuf
            // hold both where the dots do not fit the registers.)
            auto dots = [&](const FlashGradSpec::Dot &dot, Value buf,
                            bool inBuffer = false) {
              return dotTile(k, opts, dot.rows, dot.colsT, b, rowIdx, jt,
                             dot.depth, buf, inBuffer);
            };
            // The transposed pair's cotangents first, to memory: the other
            // two tiles fill the registers.
            std::optional<DotTile> tDots;
            if (s.cotangentT)
              tDots = dots(*s.cotangentT, tBuf, /*inBuffer=*/true);
            DotTile sDots = dots(s.score, sBuf);
            DotTile gDots = dots(s.cotangent, dBuf);
            for (int64_t r = 0; r < TQ; ++r)
              for (int64_t v = 0; v < KV; ++v) {
                Value tv = tDots ? tDots->at(r, v) : Value();
                auto [sv, dv] =
                    s.weights(k, sDots.at(r, v), gDots.at(r, v), tv, b,
                              rowIdx[r], k.add(j0, k.idx(v * kLanes)));
                // dX = S (g - delta) / tau is subnormal for small S: flushed
                // once here, instead of a microcode assist in each of the
                // accumulators' FMAs that broadcast it (-19% backward time
                // on peaky logits). S itself is never subnormal
                // (OnlineSoftmax.h).
                dv = k.flushSubnormal(dv);
                k.vstore(sv, sBuf, {k.idx(r), k.idx(v * kLanes)});
                k.vstore(dv, dBuf, {k.idx(r), k.idx(v * kLanes)});
              }
            for (auto [buf, n, a] :
                 llvm::zip(slices(accBlk, qt), chunks, s.accumulators))
              accumulateTile(k, opts, buf, a.useDx ? dBuf : sBuf, a.values,
                             b, j0, n, {});
          };
          if (inBand)
            k.ifThen(inBand, body);
          else
            body();
        });
      });
      k.forLoop(c0, nt, c1, [&](Value qt) {
        for (auto [buf, tot, n] :
             llvm::zip(slices(accBlk, qt), slices(totBlk, qt), chunks))
          k.forLoop(c0, n, c1, [&](Value c) {
            Value col = k.mul(c, k.idx(kLanes));
            for (int64_t r = 0; r < TQ; ++r)
              k.vstore(k.fadd(k.vload(tot, {k.idx(r), col}),
                              k.vload(buf, {k.idx(r), col})),
                       tot, {k.idx(r), col});
          });
      });
    });

    k.forLoop(c0, nt, c1, [&](Value qt) {
      Value i0 = blk.firstRow(k, qt);
      SmallVector<Value> tot = slices(totBlk, qt);
      for (int64_t r = 0; r < TQ; ++r) {
        Value i = k.add(i0, k.idx(r));
        k.ifThen(k.cmpi(arith::CmpIPredicate::ult, i, s.rows), [&] {
          for (auto [buf, n, a] : llvm::zip(tot, chunks, s.accumulators))
            k.forLoop(c0, n, c1, [&](Value c) {
              Value col = k.mul(c, k.idx(kLanes));
              k.vstoreMasked(k.vload(buf, {k.idx(r), col}), a.out,
                             {b, i, col}, k.sub(a.width, col));
            });
        });
      }
    });
  });
}

mlir::moe::cpu::GradRowStats
mlir::moe::cpu::gradRowStats(CpuKernelBuilder &k, Value lse, Value p, Value dp,
                             Value batch, Value rows, Value width,
                             Value widthPad, Value rowsPad) {
  Type f32 = k.f32();
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value lseRow = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rowsPad});
  Value delta = k.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rowsPad});
  Value posInf = k.cF32(std::numeric_limits<float>::infinity());
  Value widthChunks = k.divu(widthPad, k.idx(kLanes));
  k.forLoop(c0, batch, c1, [&](Value bi) {
    k.forLoop(c0, rowsPad, c1, [&](Value i) {
      Value in = k.cmpi(arith::CmpIPredicate::ult, i, rows);
      Value ic = k.mins(i, k.sub(rows, c1));
      Value l = k.load(lse, {bi, ic});
      Value none = k.cmpf(arith::CmpFPredicate::OEQ, l, k.negInfLike(f32));
      k.store(k.select(k.andI(in, k.notI1(none)), l, posInf), lseRow, {bi, i});
      Value dot =
          k.forLoop(c0, widthChunks, c1, ValueRange{k.constLike(k.vf32(), 0.0)},
                    [&](Value c, ValueRange acc) -> SmallVector<Value> {
                      Value col = k.mul(c, k.idx(kLanes));
                      Value count = k.sub(width, col);
                      Value g = k.vloadMasked(dp, {bi, ic, col}, count, 0.0);
                      Value pv = k.vloadMasked(p, {bi, ic, col}, count, 0.0);
                      return {k.fma(g, pv, acc[0])};
                    })[0];
      k.store(k.select(in, k.sum(dot), k.cF32(0.0)), delta, {bi, i});
    });
  });
  return {lseRow, delta};
}
