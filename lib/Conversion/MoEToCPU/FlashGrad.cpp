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
using namespace mlir::moe::cpu_lowering;

/// Column tiles summed into one partial before it joins the total (512
/// columns).
static constexpr int64_t kFoldTiles = 16;

void mlir::moe::cpu_lowering::emitFlashGrad(CpuKernelBuilder &kb,
                                            const KernelOptions &opts,
                                            const FlashGradSpec &s) {
  constexpr int64_t TQ = kQueryTile, TK = kKeyTile, KV = TK / kLanes;
  constexpr int64_t QB = kQueryTilesPerBlock;
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  // A parallel item is a block of row tiles (rowBlocks): a column tile's
  // packed columns and values are read from memory once for the block's
  // tiles (from L1/L2 for all but the first), where one row tile an item
  // streamed every column from L3 for 8 rows (bandwidth-bound at D = 64: 11 MB
  // of packed data per 8 rows at N = 16384).
  RowBlocks blocks = rowBlocks(kb, s.batch, s.rows);

  // Blocked summation: each accumulator sums kFoldTiles column tiles into a
  // partial (accAll) that is then added to its total (totAll). One running
  // f32 sum over all N columns (16384 at the prefill size) lost 2-7x the
  // accuracy of eager's blocked GEMM sums; blocks of 512 columns bring the
  // rounding error back to its level at the cost of one add per row and lane
  // per block.
  SmallVector<Value> accAll, totAll;
  for (const auto &a : s.accumulators) {
    auto type = MemRefType::get({QB, TQ, ShapedType::kDynamic}, f32);
    accAll.push_back(kb.scratch(opts, type, {a.widthPad}));
    totAll.push_back(kb.scratch(opts, type, {a.widthPad}));
  }
  Value sAll = kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
  Value dAll = kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
  Value tAll = s.cotangentT
                   ? kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {})
                   : Value();

  // Work: a multiply-add per (row, column, depth of each dot and lane of each
  // accumulator).
  Value perPair = kb.add(s.score.depth, s.cotangent.depth);
  if (s.cotangentT)
    perPair = kb.add(perPair, s.cotangentT->depth);
  for (const auto &a : s.accumulators)
    perPair = kb.add(perPair, a.widthPad);
  Value work = kb.mul(kb.mul(kb.mul(s.batch, s.rows), s.cols), perPair);
  workersIfLarge(kb, opts, blocks.items, work, [&](Value item, Value worker) {
    SmallVector<Value> accBlk, totBlk, chunks;
    for (auto [buf, tot, a] : llvm::zip(accAll, totAll, s.accumulators)) {
      accBlk.push_back(kb.workerSlice(buf, worker));
      totBlk.push_back(kb.workerSlice(tot, worker));
      chunks.push_back(kb.divu(a.widthPad, kb.idx(kLanes)));
    }
    Value sBuf = kb.workerSlice(sAll, worker);
    Value dBuf = kb.workerSlice(dAll, worker);
    Value tBuf = tAll ? kb.workerSlice(tAll, worker) : Value();
    RowBlock blk = rowBlock(kb, item, blocks);
    Value b = blk.b, nt = blk.count;
    // Row tile qt's [TQ, W] slices of the block's accumulators.
    auto slices = [&](ArrayRef<Value> blk, Value qt) {
      SmallVector<Value> out;
      for (Value buf : blk)
        out.push_back(kb.workerSlice(buf, qt)); // row-tile qt's [TQ, W]
      return out;
    };
    auto zero = [&](ArrayRef<Value> blk) {
      kb.forLoop(c0, nt, c1, [&](Value qt) {
        for (auto [buf, n] : llvm::zip(slices(blk, qt), chunks))
          zeroRows(kb, buf, n);
      });
    };
    zero(totBlk);

    // Column tiles of the block; a row tile skips those outside its band.
    Value first = c0, last = kb.ceilDiv(s.cols, kb.idx(TK));
    if (s.band == FlashGradSpec::Band::Lower) // columns c <= the last row
      last = kb.ceilDiv(kb.add(blk.lastRow, c1), kb.idx(TK));
    else if (s.band == FlashGradSpec::Band::Upper) // columns c >= the first
      first = kb.divu(blk.firstRow(kb, c0), kb.idx(TK));

    Value fold = kb.idx(kFoldTiles);
    kb.forLoop(first, last, fold, [&](Value jf) {
      zero(accBlk);
      kb.forLoop(jf, kb.mins(kb.add(jf, fold), last), c1, [&](Value jt) {
        Value j0 = kb.mul(jt, kb.idx(TK));
        kb.forLoop(c0, nt, c1, [&](Value qt) {
          RowTile tile = blk.tile(kb, qt);
          ArrayRef<Value> rowIdx = tile.rows;
          Value inBand = Value();
          if (s.band == FlashGradSpec::Band::Lower)
            inBand = kb.cmpi(arith::CmpIPredicate::ule, j0, rowIdx.back());
          else if (s.band == FlashGradSpec::Band::Upper)
            inBand = kb.cmpi(arith::CmpIPredicate::uge, jt,
                            kb.divu(tile.i0, kb.idx(TK)));
          auto body = [&] {
            // (S and dX overwrite the dots a row at a time: sBuf and dBuf
            // hold both where the dots do not fit the registers.)
            auto dots = [&](const FlashGradSpec::Dot &dot, Value buf,
                            bool inBuffer = false) {
              return dotTile(kb, opts, dot.rows, dot.colsT, b, rowIdx, jt,
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
                    s.weights(kb, sDots.at(r, v), gDots.at(r, v), tv, b,
                              rowIdx[r], kb.add(j0, kb.idx(v * kLanes)));
                // dX = S (g - delta) / tau is subnormal for small S: flushed
                // once here, instead of a microcode assist in each of the
                // accumulators' FMAs that broadcast it (-19% backward time
                // on peaky logits). S itself is never subnormal
                // (OnlineSoftmax.h).
                dv = kb.flushSubnormal(dv);
                kb.vstore(sv, sBuf, {kb.idx(r), kb.idx(v * kLanes)});
                kb.vstore(dv, dBuf, {kb.idx(r), kb.idx(v * kLanes)});
              }
            for (auto [buf, n, a] :
                 llvm::zip(slices(accBlk, qt), chunks, s.accumulators))
              accumulateTile(kb, opts, buf, a.useDx ? dBuf : sBuf, a.values,
                             b, j0, n, {});
          };
          if (inBand)
            kb.ifThen(inBand, body);
          else
            body();
        });
      });
      kb.forLoop(c0, nt, c1, [&](Value qt) {
        for (auto [buf, tot, n] :
             llvm::zip(slices(accBlk, qt), slices(totBlk, qt), chunks))
          kb.forLoop(c0, n, c1, [&](Value c) {
            Value col = kb.mul(c, kb.idx(kLanes));
            for (int64_t r = 0; r < TQ; ++r)
              kb.vstore(kb.fadd(kb.vload(tot, {kb.idx(r), col}),
                              kb.vload(buf, {kb.idx(r), col})),
                       tot, {kb.idx(r), col});
          });
      });
    });

    kb.forLoop(c0, nt, c1, [&](Value qt) {
      Value i0 = blk.firstRow(kb, qt);
      SmallVector<Value> tot = slices(totBlk, qt);
      for (int64_t r = 0; r < TQ; ++r) {
        Value i = kb.add(i0, kb.idx(r));
        kb.ifThen(kb.cmpi(arith::CmpIPredicate::ult, i, s.rows), [&] {
          for (auto [buf, n, a] : llvm::zip(tot, chunks, s.accumulators))
            kb.forLoop(c0, n, c1, [&](Value c) {
              Value col = kb.mul(c, kb.idx(kLanes));
              kb.vstoreMasked(kb.vload(buf, {kb.idx(r), col}), a.out,
                             {b, i, col}, kb.sub(a.width, col));
            });
        });
      }
    });
  });
}

mlir::moe::cpu_lowering::GradRowStats mlir::moe::cpu_lowering::gradRowStats(
    CpuKernelBuilder &kb, Value lse, Value p, Value dp, Value batch, Value rows,
    Value width, Value widthPad, Value rowsPad) {
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value lseRow = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rowsPad});
  Value delta = kb.alloc(MemRefType::get({kDyn, kDyn}, f32), {batch, rowsPad});
  Value posInf = kb.cF32(std::numeric_limits<float>::infinity());
  Value widthChunks = kb.divu(widthPad, kb.idx(kLanes));
  kb.forLoop(c0, batch, c1, [&](Value bi) {
    kb.forLoop(c0, rowsPad, c1, [&](Value i) {
      Value in = kb.cmpi(arith::CmpIPredicate::ult, i, rows);
      Value ic = kb.mins(i, kb.sub(rows, c1));
      Value l = kb.load(lse, {bi, ic});
      Value none = kb.cmpf(arith::CmpFPredicate::OEQ, l, kb.negInfLike(f32));
      kb.store(kb.select(kb.andI(in, kb.notI1(none)), l, posInf), lseRow, {bi, i});
      Value dot =
          kb.forLoop(c0, widthChunks, c1, ValueRange{kb.constLike(kb.vf32(), 0.0)},
                    [&](Value c, ValueRange acc) -> SmallVector<Value> {
                      Value col = kb.mul(c, kb.idx(kLanes));
                      Value count = kb.sub(width, col);
                      Value g = kb.vloadMasked(dp, {bi, ic, col}, count, 0.0);
                      Value pv = kb.vloadMasked(p, {bi, ic, col}, count, 0.0);
                      return {kb.fma(g, pv, acc[0])};
                    })[0];
      kb.store(kb.select(in, kb.sum(dot), kb.cF32(0.0)), delta, {bi, i});
    });
  });
  return {lseRow, delta};
}
