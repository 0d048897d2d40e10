//===- Flash.cpp - Tiled online-softmax mixing kernel ---------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "Flash.h"

#include "mlir/Dialect/SCF/IR/SCF.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::cpu_lowering;
using namespace mlir::moe::kernels;

std::pair<Value, Value>
mlir::moe::cpu_lowering::packValues(CpuKernelBuilder &kb, Value values,
                                    Value batch, Value keys, Value width,
                                    Value keysPad, Value widthPad) {
  auto type = MemRefType::get(
      {ShapedType::kDynamic, ShapedType::kDynamic, ShapedType::kDynamic},
      kb.f32());
  Value packed = kb.alloc(type, {batch, keysPad, widthPad});
  Value chunks = kb.divu(widthPad, kb.idx(kLanes));
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  // Sequential (O(Nk·K), small next to the mixing). The non-finite flag is
  // carried as Σ (v - v), NaN iff some v is ±inf or NaN (no i1 vectors live
  // across loop iterations).
  Value bad = kb.forLoop(
      kb.idx(0), batch, kb.idx(1), ValueRange{zeros},
      [&](Value b, ValueRange outer) -> SmallVector<Value> {
        return kb.forLoop(
            kb.idx(0), keysPad, kb.idx(1), outer,
            [&](Value j, ValueRange mid) -> SmallVector<Value> {
              return kb.forLoop(
                  kb.idx(0), chunks, kb.idx(1), mid,
                  [&](Value c, ValueRange acc) -> SmallVector<Value> {
                    Value base = kb.mul(c, kb.idx(kLanes));
                    Value inRow = kb.cmpi(arith::CmpIPredicate::ult, j, keys);
                    // Past the last key: nothing to read.
                    Value count = kb.select(inRow, kb.sub(width, base), kb.idx(0));
                    Value v = kb.vloadMasked(values, {b, j, base}, count, 0.0);
                    kb.vstore(v, packed, {b, j, base});
                    return {kb.fadd(acc[0], kb.fsub(v, v))};
                  });
            });
      })[0];
  // An f32 (NaN = some value is not finite), not an i1: an i1 captured by
  // the async runtime's outlined coroutines trips an LLVM 22 x86 codegen
  // error when mlir-runner runs without -O.
  return {packed, kb.sum(bad)};
}

FlashSpec mlir::moe::cpu_lowering::flashSpec(
    CpuKernelBuilder &kb, Value q, Value keysT, Value keysPad, Value values,
    Value out, Value batch, Value rows, Value keys, Value depth,
    std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)> logits,
    bool causal) {
  Value width = kb.dim(values, 2);
  Value widthPad = roundUp(kb, width, kLanes);
  auto [packed, nonFinite] =
      packValues(kb, values, batch, keys, width, keysPad, widthPad);
  // (No lse: the caller sets it when it wants one.)
  return FlashSpec{q,         keysT, packed, out,
                   Value(),   batch, rows,   keys,
                   depth,     width, widthPad, nonFinite,
                   causal,    kQueryTilesPerBlock, std::move(logits)};
}

void mlir::moe::cpu_lowering::workersIfLarge(
    CpuKernelBuilder &kb, const KernelOptions &opts, Value numItems, Value work,
    function_ref<void(Value item, Value worker)> body) {
  Value small = kb.cmpi(arith::CmpIPredicate::ult, work, kb.idx(kInlineWork));
  kb.workers(opts, numItems, body, small);
}

mlir::moe::cpu_lowering::RowBlocks
mlir::moe::cpu_lowering::rowBlocks(CpuKernelBuilder &kb, Value batch,
                                   Value rows, int64_t tilesPerBlock) {
  Value tiles = kb.ceilDiv(rows, kb.idx(kQueryTile));
  Value blocks = kb.ceilDiv(tiles, kb.idx(tilesPerBlock));
  return {rows, tiles, blocks, kb.mul(batch, blocks), tilesPerBlock};
}

mlir::moe::cpu_lowering::RowBlock
mlir::moe::cpu_lowering::rowBlock(CpuKernelBuilder &kb, Value item,
                                  const RowBlocks &blocks) {
  const int64_t QB = blocks.tilesPerBlock;
  Value c1 = kb.idx(1);
  RowBlock blk;
  blk.rows = blocks.rows;
  blk.b = kb.divu(item, blocks.blocksPerBatch);
  blk.t0 = kb.mul(kb.remu(item, blocks.blocksPerBatch), kb.idx(QB));
  blk.count = kb.mins(kb.idx(QB), kb.sub(blocks.tilesPerBatch, blk.t0));
  blk.lastRow =
      kb.mins(kb.sub(kb.mul(kb.add(blk.t0, blk.count), kb.idx(kQueryTile)), c1),
             kb.sub(blocks.rows, c1));
  return blk;
}

Value mlir::moe::cpu_lowering::RowBlock::firstRow(CpuKernelBuilder &kb,
                                                  Value qt) const {
  return kb.mul(kb.add(t0, qt), kb.idx(kQueryTile));
}

mlir::moe::cpu_lowering::RowTile
mlir::moe::cpu_lowering::RowBlock::tile(CpuKernelBuilder &kb, Value qt) const {
  RowTile t;
  t.i0 = firstRow(kb, qt);
  Value last = kb.sub(rows, kb.idx(1));
  for (int64_t r = 0; r < kQueryTile; ++r)
    t.rows.push_back(kb.mins(kb.add(t.i0, kb.idx(r)), last));
  return t;
}

void mlir::moe::cpu_lowering::zeroRows(CpuKernelBuilder &kb, Value buf,
                                       Value chunks) {
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  kb.forLoop(kb.idx(0), chunks, kb.idx(1), [&](Value c) {
    for (int64_t r = 0; r < kQueryTile; ++r)
      kb.vstore(zeros, buf, {kb.idx(r), kb.mul(c, kb.idx(kLanes))});
  });
}

/// Vector registers of a target whose f32 vectors have `lanes` lanes: 32 zmm
/// on AVX-512, 16 ymm on AVX2 (and 16 on 128-bit targets).
static int64_t vectorRegisters(int64_t lanes) { return lanes >= 16 ? 32 : 16; }

namespace {
/// One register block of dotTile: rows [r0, r0 + g) x key vectors
/// [v0, v0 + w), g·w accumulators, one depth loop.
struct DotBlock {
  int64_t r0, g, v0, w;
};
} // namespace

/// The register blocks of a rows x vectors tile. A block's accumulators,
/// its w key vectors and a broadcast query scalar must fit the registers
/// with one to spare (more accumulators than registers spill on every depth
/// step: the AVX2 code of the 8 x 32 tile as vector<16> values held 32 ymm
/// accumulators and ran at half the AVX-512 speed), and every block needs at
/// least 8 independent accumulators to cover the FMA latency (4 cycles, 2
/// pipes). Blocks of up to 2 key vectors take as many rows as fit (AVX-512:
/// all 8 rows x 2 zmm; AVX2: 6 rows x 2 ymm per key half); the rows left over
/// take the whole tile's width (AVX2: 2 rows x 4 ymm).
static SmallVector<DotBlock> dotBlocks(int64_t rows, int64_t vectors,
                                       int64_t regs) {
  auto fits = [&](int64_t g, int64_t w) { return g * w + w + 2 <= regs; };
  int64_t w = std::min<int64_t>(vectors, 2);
  int64_t g = std::max<int64_t>(1, std::min(rows, (regs - 2 - w) / w));
  SmallVector<DotBlock> blocks;
  int64_t main = rows - rows % g;
  for (int64_t v0 = 0; v0 < vectors; v0 += w)
    for (int64_t r0 = 0; r0 < main; r0 += g)
      blocks.push_back({r0, g, v0, std::min(w, vectors - v0)});
  if (main == rows)
    return blocks;
  int64_t rest = rows - main, wr = vectors;
  while (wr > 1 && !fits(rest, wr))
    --wr;
  for (int64_t v0 = 0; v0 < vectors; v0 += wr)
    blocks.push_back({main, rest, v0, std::min(wr, vectors - v0)});
  return blocks;
}

mlir::moe::cpu_lowering::DotTile mlir::moe::cpu_lowering::dotTile(
    CpuKernelBuilder &kb, const KernelOptions &opts, Value q, Value keysT,
    Value b, ArrayRef<Value> rowIdx, Value jt, Value depth, Value dotBuf,
    bool inBuffer) {
  // The micro-kernel computes in the target's registers (L lanes) over blocks
  // of G rows x W key vectors, one depth loop per block.
  const int64_t L = std::min<int64_t>(opts.lanes(), kLanes);
  const int64_t VL = kKeyTile / L;
  const int64_t rows = rowIdx.size();
  // The whole tile stays in registers when it fits them with room for the
  // epilogue (AVX-512: 16 zmm of 32); otherwise (AVX2: 32 ymm of 16) each
  // block goes to `dotBuf` and the epilogue reloads a row at a time, instead
  // of the register allocator spilling and reloading it piecemeal.
  const bool inRegisters =
      !inBuffer && rows * VL + 4 <= vectorRegisters(L);
  DotTile tile;
  tile.kb = &kb;
  if (!inRegisters) {
    assert(dotBuf && "dotTile needs a buffer on this target");
    tile.buf = dotBuf;
  }
  Value zeros = kb.constLike(kb.vf32(L), 0.0);
  SmallVector<Value> pieces(rows * VL);
  for (const DotBlock &blk : dotBlocks(rows, VL, vectorRegisters(L))) {
    const int64_t r0 = blk.r0, g = blk.g, v0 = blk.v0, w = blk.w;
    SmallVector<Value> init(g * w, zeros);
    SmallVector<Value> acc = kb.forLoop(
        kb.idx(0), depth, kb.idx(1), init,
        [&](Value d, ValueRange a) -> SmallVector<Value> {
          SmallVector<Value> kv;
          for (int64_t v = 0; v < w; ++v)
            kv.push_back(kb.vload(keysT, {b, jt, d, kb.idx((v0 + v) * L)}, L));
          SmallVector<Value> next;
          for (int64_t r = 0; r < g; ++r) {
            Value qv = kb.splat(kb.loadF(q, {b, rowIdx[r0 + r], d}), L);
            for (int64_t v = 0; v < w; ++v)
              next.push_back(kb.fma(qv, kv[v], a[r * w + v]));
          }
          return next;
        });
    for (int64_t r = 0; r < g; ++r)
      for (int64_t v = 0; v < w; ++v) {
        if (inRegisters)
          pieces[(r0 + r) * VL + v0 + v] = acc[r * w + v];
        else
          kb.vstore(acc[r * w + v], dotBuf,
                   {kb.idx(r0 + r), kb.idx((v0 + v) * L)});
      }
  }
  if (inRegisters) {
    // kLanes-wide vectors from the pieces (free after legalization).
    const int64_t per = kLanes / L, KV = kKeyTile / kLanes;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = 0; v < KV; ++v)
        tile.dots.push_back(
            kb.concat(ArrayRef<Value>(pieces).slice(r * VL + v * per, per)));
  }
  return tile;
}

Value mlir::moe::cpu_lowering::DotTile::at(int64_t r, int64_t v) const {
  constexpr int64_t KV = kKeyTile / kLanes;
  if (!buf)
    return dots[r * KV + v];
  return kb->vload(buf, {kb->idx(r), kb->idx(v * kLanes)});
}

namespace {
/// accumulateTile's register blocking: `groupRows` rows x `width` chunks of
/// the target's vectors a step, `width` value vectors loaded and `groupRows`
/// weights broadcast for groupRows * width FMAs. With 8 rows one chunk is
/// 9 loads per 8 FMAs (load-bound; the causal similarity backward spent a
/// quarter of its time on it); AVX-512 fits three chunks of all 8 rows (24
/// accumulators, 11 loads per 24 FMAs). AVX2's 16 ymm hold 8 rows x 1 only
/// with no room for LLVM's unrolling, which then spilled an accumulator
/// through the stack on every step (perf: the backward pass of the
/// Similarity-Inform demo at half the forward's FMA rate), so there half the
/// rows take two chunks at a time: 8 accumulators, 6 loads per 8 FMAs.
struct AccBlocking {
  int64_t groupRows, width;
};
AccBlocking accBlocking(int64_t rows, int64_t regs) {
  int64_t width = std::max<int64_t>(1, (regs - 4) / std::max<int64_t>(rows, 1));
  if (width == 1 && rows >= 8 && rows % 2 == 0)
    return {rows / 2, 2};
  return {rows, width};
}
} // namespace

void mlir::moe::cpu_lowering::accumulateTile(
    CpuKernelBuilder &kb, const KernelOptions &opts, Value accBuf, Value pBuf,
    Value values, Value b, Value j0, Value widthChunks, ArrayRef<Value> alpha,
    Value logitBuf, Value guarded) {
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  int64_t rows = cast<MemRefType>(pBuf.getType()).getDimSize(0);
  int64_t keyCols = cast<MemRefType>(pBuf.getType()).getDimSize(1);
  // Chunks of the target's register width, `W` adjacent ones a step for a
  // group of `G` rows (accBlocking).
  const int64_t L = std::min<int64_t>(opts.lanes(), kLanes);
  const auto [G, W] = accBlocking(rows, vectorRegisters(L));
  Value chunks = kb.mul(widthChunks, kb.idx(kLanes / L));
  // The tile's keys are summed from zero in registers and the sum added to
  // the row's accumulator once: a peaked row's accumulator holds its largest
  // term, and its many small ones (exp(-13) of it in a Similarity-Inform row
  // at D = 128), each added to it alone, lost what fell below its ulp (the
  // forward's p was 3-5x eager's error, which the gradient of u, a
  // cancellation of O(1) terms, grew 16x).
  Value zerosL = kb.constLike(kb.vf32(L), 0.0);
  // Rows [r0, r0 + g) x chunks [c, c + w).
  auto step = [&](Value c, int64_t w, int64_t r0, int64_t g) {
    SmallVector<Value> cols, acc(g * w, zerosL); // acc[r * w + q]
    for (int64_t q = 0; q < w; ++q)
      cols.push_back(kb.mul(q ? kb.add(c, kb.idx(q)) : c, kb.idx(L)));
    auto pvLoop = [&](bool guard) -> SmallVector<Value> {
      return kb.forLoop(
          c0, kb.idx(keyCols), c1, acc,
          [&](Value j, ValueRange a) -> SmallVector<Value> {
            SmallVector<Value> v;
            for (int64_t q = 0; q < w; ++q)
              v.push_back(kb.vload(values, {b, kb.add(j0, j), cols[q]}, L));
            SmallVector<Value> next;
            for (int64_t r = 0; r < g; ++r) {
              Value p = kb.splat(kb.load(pBuf, {kb.idx(r0 + r), j}), L);
              Value valid;
              if (guard) {
                Value logit = kb.load(logitBuf, {kb.idx(r0 + r), j});
                valid = kb.cmpf(arith::CmpFPredicate::UNE, logit,
                               kb.negInfLike(f32));
              }
              for (int64_t q = 0; q < w; ++q) {
                Value upd = kb.fma(p, v[q], a[r * w + q]);
                next.push_back(guard ? kb.select(valid, upd, a[r * w + q])
                                     : upd);
              }
            }
            return next;
          });
    };
    SmallVector<Value> res;
    if (logitBuf) {
      SmallVector<Type> types(g * w, kb.vf32(L));
      res = kb.ifElse(
          guarded, types, [&] { return pvLoop(true); },
          [&] { return pvLoop(false); });
    } else {
      res = pvLoop(false);
    }
    for (int64_t r = 0; r < g; ++r)
      for (int64_t q = 0; q < w; ++q) {
        Value a = kb.vload(accBuf, {kb.idx(r0 + r), cols[q]}, L);
        Value sum =
            alpha.empty()
                ? kb.fadd(a, res[r * w + q])
                : kb.fma(a, kb.splat(alpha[r0 + r], L), res[r * w + q]);
        kb.vstore(sum, accBuf, {kb.idx(r0 + r), cols[q]});
      }
  };
  // A single chunk (the tail) takes all rows: w + rows accumulators fit.
  auto rowGroups = [&](Value c, int64_t w) {
    int64_t g = w == W ? G : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += g)
      step(c, w, r0, std::min(g, rows - r0));
  };
  // Steps of W, then single chunks. (Splitting a tail of one, e.g. 4 chunks
  // as 2 + 2 instead of 3 + 1, measured the same: D = 64 and D = 256.)
  Value whole = kb.mul(kb.divu(chunks, kb.idx(W)), kb.idx(W));
  kb.forLoop(c0, whole, kb.idx(W), [&](Value c) { rowGroups(c, W); });
  if (W > 1)
    kb.forLoop(whole, chunks, c1, [&](Value c) { rowGroups(c, 1); });
}

Value mlir::moe::cpu_lowering::packKeysT(CpuKernelBuilder &kb,
                                         const KernelOptions &opts, Value x,
                                         Value batch, Value rows, Value depth) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value keyTiles = kb.ceilDiv(rows, kb.idx(kKeyTile));
  Value keysT = kb.alloc(MemRefType::get({kDyn, kDyn, kDyn, kKeyTile}, kb.f32()),
                        {batch, keyTiles, depth});
  bool f32Rows = cast<MemRefType>(x.getType()).getElementType().isF32();
  // One item per (b, key tile); rows past the end are zeros.
  kb.workers(opts, kb.mul(batch, keyTiles), [&](Value item, Value) {
    Value bi = kb.divu(item, keyTiles), jt = kb.remu(item, keyTiles);
    Value last = kb.sub(rows, c1);
    // Key jj of the tile: its row, clamped to the last row (its values are
    // replaced by zeros past the end), and whether it is inside.
    auto keyRow = [&](Value jj) {
      Value j = kb.add(kb.mul(jt, kb.idx(kKeyTile)), jj);
      Value in = kb.cmpi(arith::CmpIPredicate::ult, j, rows);
      return std::pair{kb.mins(j, last), in};
    };
    // Columns [from, D) of every key of the tile, an element at a time (the
    // rows of f16/bf16 inputs, and the ragged tail of f32 ones).
    auto scalarCols = [&](Value from) {
      kb.forLoop(c0, kb.idx(kKeyTile), c1, [&](Value jj) {
        auto [jc, in] = keyRow(jj);
        kb.forLoop(from, depth, c1, [&](Value d) {
          Value v = kb.loadF(x, {bi, jc, d});
          kb.store(kb.select(in, v, kb.cF32(0.0)), keysT, {bi, jt, d, jj});
        });
      });
    };
    if (!f32Rows)
      return scalarCols(c0);
    // A vector of columns at a time, its lanes stored one by one into
    // `lanes` lines of the tile, for every key before the next vector (the
    // lines stay in L1 until whole). Each key's columns in turn (a loop of
    // scalar stores 128 bytes apart) made LLVM emit AVX-512 scatters
    // (VSCATTERQPS) into lines that left L1 between keys: a fifth of the
    // N = 64, D = 1024 decode mix.
    int64_t lanes = kb.lanes();
    Value whole = kb.mul(kb.divu(depth, kb.idx(lanes)), kb.idx(lanes));
    Value zeros = kb.constLike(kb.vf32(), 0.0);
    kb.forLoop(c0, whole, kb.idx(lanes), [&](Value d0) {
      kb.forLoop(c0, kb.idx(kKeyTile), c1, [&](Value jj) {
        auto [jc, in] = keyRow(jj);
        Value inV = kb.splat(in, lanes);
        Value row = kb.vload(x, {bi, jc, d0});
        Value v = kb.select(inV, row, zeros);
        for (int64_t l = 0; l < lanes; ++l)
          kb.store(vector::ExtractOp::create(kb.b, v, l), keysT,
                  {bi, jt, kb.add(d0, kb.idx(l)), jj});
      });
    });
    scalarCols(whole);
  });
  return keysT;
}

Value mlir::moe::cpu_lowering::keyValidity(CpuKernelBuilder &kb, Value mask,
                                           Value batch, Value rows,
                                           Value keysPad) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value valid = kb.alloc(MemRefType::get({kDyn, kDyn}, kb.f32()),
                        {batch, keysPad});
  kb.forLoop(c0, batch, c1, [&](Value bi) {
    kb.forLoop(c0, keysPad, c1, [&](Value j) {
      Value in = kb.cmpi(arith::CmpIPredicate::ult, j, rows);
      if (mask) {
        Value m = kb.load(mask, {bi, kb.mins(j, kb.sub(rows, c1))});
        in = kb.andI(in, m);
      }
      kb.store(kb.select(in, kb.cF32(1.0), kb.cF32(0.0)), valid, {bi, j});
    });
  });
  return valid;
}

void mlir::moe::cpu_lowering::forEachRowChunk(
    CpuKernelBuilder &kb, const KernelOptions &opts, Value batch, Value rows,
    Value width,
    function_ref<void(Value b, Value i, Value col, Value count)> body) {
  Value chunks = kb.ceilDiv(width, kb.idx(kLanes));
  kb.workers(opts, kb.mul(batch, rows), [&](Value item, Value) {
    Value bi = kb.divu(item, rows), i = kb.remu(item, rows);
    kb.forLoop(kb.idx(0), chunks, kb.idx(1), [&](Value c) {
      Value col = kb.mul(c, kb.idx(kLanes));
      body(bi, i, col, kb.sub(width, col));
    });
  });
}

Value mlir::moe::cpu_lowering::projectRows(CpuKernelBuilder &kb,
                                           const KernelOptions &opts, Value x,
                                           Value w, Value batch, Value rows,
                                           Value depth, Value outWidth,
                                           Value init, Value out) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  if (!out)
    out = kb.alloc(MemRefType::get({kDyn, kDyn, kDyn}, kb.f32()),
                  {batch, rows, outWidth});
  forEachRowChunk(kb, opts, batch, rows, outWidth,
                  [&](Value bi, Value i, Value col, Value count) {
                    Value start =
                        init ? kb.vloadMasked(init, {bi, i, col}, count, 0.0)
                             : kb.constLike(kb.vf32(), 0.0);
                    Value acc = kb.forLoop(
                        c0, depth, c1, ValueRange{start},
                        [&](Value d, ValueRange a) -> SmallVector<Value> {
                          Value xv = kb.splat(kb.loadF(x, {bi, i, d}), kLanes);
                          Value wv = kb.vloadMasked(w, {d, col}, count, 0.0);
                          return {kb.fma(xv, wv, a[0])};
                        })[0];
                    kb.vstoreMasked(acc, out, {bi, i, col}, count);
                  });
  return out;
}

std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
mlir::moe::cpu_lowering::scaledMaskedLogits(
    Value keyValid, const kernels::FlashLogitSpec &logit) {
  return [=](CpuKernelBuilder &kk, Value dot, Value bi, Value i, Value j0) {
    // The keys of a lane group: j0 + lane.
    return kernels::flashLogit(kk, logit, dot, nullptr, nullptr, [&] {
      return kernels::flashKeyKept(
          kk, logit, /*inRange=*/Value(),
          [&] {
            if (!keyValid)
              return Value();
            return kk.cmpf(arith::CmpFPredicate::ONE,
                           kk.vload(keyValid, {bi, j0}),
                           kk.constLike(kk.vf32(), 0.0));
          },
          [&] {
            Value js = kk.iota(kk.castInt(j0, kk.i32()), kLanes);
            return kk.cmpi(arith::CmpIPredicate::sle, js,
                           kk.splat(kk.castInt(i, kk.i32()), kLanes));
          });
    });
  };
}

moe::kernels::SoftmaxGrad mlir::moe::cpu_lowering::queryRowGrad(
    CpuKernelBuilder &kb,
    const std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
        &logits,
    Value lse, Value delta, Value sDot, Value gDot, Value b, Value i,
    Value j0) {
  Value x = logits(kb, sDot, b, i, j0);
  return moe::kernels::softmaxGradFromLogSumExp(
      kb, x, kb.load(lse, {b, i}), gDot, [&] {
        return kb.splat(kb.load(delta, {b, i}), kLanes);
      });
}

void mlir::moe::cpu_lowering::emitFlashMix(CpuKernelBuilder &kb,
                                           const KernelOptions &opts,
                                           const FlashSpec &s) {
  constexpr int64_t TQ = kQueryTile, TK = kKeyTile, KV = TK / kLanes;
  const int64_t QB = s.tilesPerBlock;
  Type f32 = kb.f32();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value widthChunks = kb.divu(s.widthPad, kb.idx(kLanes));
  // A parallel item is a block of query tiles (rowBlocks); each tile's
  // online-softmax state lives in `stateAll` between its key tiles.
  RowBlocks blocks = rowBlocks(kb, s.batch, s.rows, QB);

  Value accAll = kb.scratch(
      opts, MemRefType::get({QB, TQ, ShapedType::kDynamic}, f32),
      {s.widthPad});
  Value stateAll = kb.scratch(opts, MemRefType::get({QB, 2 * TQ}, f32), {});
  Value pAll = kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {});
  Value sAll = kb.scratch(opts, MemRefType::get({TQ, TK}, f32), {});

  auto body = [&](Value item, Value worker) {
    Value accBlk = kb.workerSlice(accAll, worker);
    Value stateBlk = kb.workerSlice(stateAll, worker);
    Value pBuf = kb.workerSlice(pAll, worker);
    Value sBuf = kb.workerSlice(sAll, worker);
    RowBlock blk = rowBlock(kb, item, blocks);
    Value b = blk.b, nt = blk.count;
    // The online softmax (MoE/Kernels/OnlineSoftmax.h) of each row: the
    // running max and sum, TQ of each per tile.
    SoftmaxState start = softmaxStart(kb);
    auto loadState = [&](Value qt) {
      SmallVector<Value> st;
      for (int64_t x = 0; x < 2 * TQ; ++x)
        st.push_back(kb.load(stateBlk, {qt, kb.idx(x)}));
      return st;
    };
    kb.forLoop(c0, nt, c1, [&](Value qt) {
      zeroRows(kb, kb.workerSlice(accBlk, qt), widthChunks);
      for (int64_t r = 0; r < TQ; ++r) {
        kb.store(start.max, stateBlk, {qt, kb.idx(r)});
        kb.store(start.sum, stateBlk, {qt, kb.idx(TQ + r)});
      }
    });
    Value keyTiles = kb.ceilDiv(s.keys, kb.idx(TK));
    if (s.causal) {
      // Keys 0 .. the block's last row; a tile stops at its own last row.
      keyTiles = kb.ceilDiv(kb.add(blk.lastRow, c1), kb.idx(TK));
    }
    auto maxOfLanes = [&](Value v) { return kb.maxf(v); };
    auto sumOfLanes = [&](Value v) { return kb.sum(v); };

    kb.forLoop(c0, keyTiles, c1, [&](Value jt) {
      Value j0 = kb.mul(jt, kb.idx(TK));
      kb.forLoop(c0, nt, c1, [&](Value qt) {
        RowTile tile = blk.tile(kb, qt);
        ArrayRef<Value> rowIdx = tile.rows;
        Value accBuf = kb.workerSlice(accBlk, qt);
        auto step = [&] {
          SmallVector<Value> it = loadState(qt);
          // QK: TQ x TK dot products over d.
          // (Logits overwrite the dots a row at a time: sBuf holds both.)
          DotTile dots =
              dotTile(kb, opts, s.q, s.keysT, b, rowIdx, jt, s.depth, sBuf);

          // Online softmax over the tile, per row.
          SmallVector<Value> alpha;
          Value anyExcluded = kb.cBool(false);
          Value negInfV = kb.negInfLike(kb.vf32());
          for (int64_t r = 0; r < TQ; ++r) {
            SmallVector<Value> sv;
            Value excluded;
            for (int64_t v = 0; v < KV; ++v) {
              sv.push_back(s.logits(kb, dots.at(r, v), b, rowIdx[r],
                                    kb.add(j0, kb.idx(v * kLanes))));
              Value out = kb.cmpf(arith::CmpFPredicate::OEQ, sv[v], negInfV);
              excluded = v ? kb.orI(excluded, out) : out;
            }
            SoftmaxTile st = onlineSoftmaxStep(kb, {it[r], it[TQ + r]}, sv,
                                               maxOfLanes, sumOfLanes);
            for (int64_t v = 0; v < KV; ++v) {
              kb.vstore(st.probs[v], pBuf, {kb.idx(r), kb.idx(v * kLanes)});
              kb.vstore(sv[v], sBuf, {kb.idx(r), kb.idx(v * kLanes)});
            }
            kb.store(st.next.max, stateBlk, {qt, kb.idx(r)});
            kb.store(st.next.sum, stateBlk, {qt, kb.idx(TQ + r)});
            alpha.push_back(st.rescale);
            anyExcluded = kb.orI(anyExcluded, kb.anyTrue(excluded));
          }
          Value guarded = kb.andI(anyExcluded, kb.isNaN(s.valuesNonFinite));

          // PV: acc = acc · alpha + Σ_j p_j v_j, a register of lanes at a
          // time.
          accumulateTile(kb, opts, accBuf, pBuf, s.values, b, j0, widthChunks,
                         alpha, sBuf, guarded);
        };
        if (s.causal) // key tiles up to the tile's last row
          kb.ifThen(kb.cmpi(arith::CmpIPredicate::ule, j0, rowIdx.back()), step);
        else
          step();
      });
    });

    // Epilogue: acc / l, zeros for a row that saw no key.
    kb.forLoop(c0, nt, c1, [&](Value qt) {
      Value i0 = blk.firstRow(kb, qt);
      Value accBuf = kb.workerSlice(accBlk, qt);
      SmallVector<Value> state = loadState(qt);
      for (int64_t r = 0; r < TQ; ++r) {
        Value i = kb.add(i0, kb.idx(r));
        kb.ifThen(kb.cmpi(arith::CmpIPredicate::ult, i, s.rows), [&] {
          SoftmaxState row = {state[r], state[TQ + r]};
          kb.forLoop(c0, widthChunks, c1, [&](Value c) {
            Value col = kb.mul(c, kb.idx(kLanes));
            Value p =
                softmaxNormalize(kb, row, kb.vload(accBuf, {kb.idx(r), col}));
            kb.vstoreMasked(p, s.out, {b, i, col}, kb.sub(s.width, col));
          });
          if (s.lse)
            kb.store(softmaxLogSumExp(kb, row), s.lse, {b, i});
        });
      }
    });
  };
  // Work: a multiply-add per (row, key, depth or value lane).
  Value work = kb.mul(kb.mul(kb.mul(s.batch, s.rows), s.keys),
                     kb.add(s.depth, s.widthPad));
  workersIfLarge(kb, opts, blocks.items, work, body);
}
