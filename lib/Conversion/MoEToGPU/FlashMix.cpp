//===- FlashMix.cpp - The flash-style mixing kernel -----------------------===//
//
// Part of the MoE-MLIR project.
//
// moe.similarity_inform(_topk) and the posterior of moe.attention_posterior
// are the same computation: an attention whose values are the K-wide router
// probabilities. The kernel never forms the N x Nk matrix:
//
//  * a block (128 threads) owns a tile of kRows = 16 query rows of one
//    sequence; a group of kGroup = 8 lanes (inside one warp) owns a row and
//    holds its K-wide f32 accumulator in registers (K/8 per lane, column
//    m*8 + lane), with the running max and sum of the online softmax;
//  * key tiles of kCols = 32 keys stream through workgroup memory: the dot
//    products accumulate over feature chunks of kChunk = 32 (query and key
//    chunks staged in padded workgroup tiles, so no bank conflicts), the tile
//    max and sum are butterfly reductions over the row's 8 lanes, the
//    probabilities go through a small padded tile and meet the value tile
//    [kCols x K] in workgroup memory;
//  * causal tiles stop at the block's last row; masked keys are -inf; a row
//    with no key left yields 0;
//  * the epilogue divides by the running sum and either stores the K values
//    or, for the fused ops, runs the register top-k (emitRegisterTopk, 8-lane
//    butterflies) on the accumulator and stores only the k weights/indices.
//
// With `ws`, a small pre-kernel forms q = u · ws (f32) first, so the main
// kernel computes (u_i^T ws) · u_j.
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"
#include "HostCode.h"
#include "Reductions.h"
#include "RegisterTopk.h"
#include "Lowerings.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

static constexpr int64_t kRows = kFlashRows;
static constexpr int64_t kGroup = kFlashGroup;
static constexpr int64_t kCols = kFlashCols;
static constexpr int64_t kChunk = kFlashChunk;
static_assert(kFlashThreads % kWarp == 0, "rows must not straddle warps");

SmallVector<Value> mlir::moe::gpu_lowering::emitFlashDots(
    GpuKernelBuilder &kb, const FlashLanes &t, Value b, Value rowsOp,
    Value rowBase, Value numRows, Value colsOp, Value colBase, Value numCols,
    Value depth, Value rowTile, Value colTile) {
  Value zero = kb.cF32(0.0);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  SmallVector<Value> dots(kCols / kGroup, zero);
  return kb.forLoop(
      c0, depth, kb.idx(kChunk), dots,
      [&](Value d0, ValueRange acc) -> SmallVector<Value> {
        kb.barrier();
        // Stage the row and column chunks: rows [base, base + rows) of
        // src[b] at features [d0, d0 + kChunk) into `tile`, zeros past
        // `depth`. Columns past `limit` are zeros. Rows past `limit` repeat
        // the last row instead: only the lanes of those rows read them, whose
        // `row` is clamped the same way and who store nothing. A guard per
        // staged row would be a loop-invariant predicate that LLVM keeps
        // live through the whole column loop (ptxas spilled them).
        auto stage = [&](Value src, Value base, Value limit, Value tile,
                         int64_t rows, bool clampRows) {
          for (int64_t n = 0; n < rows * kChunk / kFlashThreads; ++n) {
            Value flat = kb.add(t.tid, kb.idx(n * kFlashThreads));
            Value rr = kb.divu(flat, kb.idx(kChunk));
            Value cc = kb.remu(flat, kb.idx(kChunk));
            Value gi = kb.add(base, rr), gd = kb.add(d0, cc);
            Value ok;
            if (clampRows) {
              ok = kb.lt(gd, depth);
              gi = kb.minu(gi, kb.sub(limit, c1));
            } else {
              // (One op a statement, in the order the plain build has
              // always emitted: as arguments, the C++ compiler's order.)
              Value inDepth = kb.lt(gd, depth);
              ok = kb.andI(kb.lt(gi, limit), inDepth);
            }
            Value v = kb.select(
                ok,
                kb.loadF(src, {b, kb.select(ok, gi, c0), kb.select(ok, gd, c0)}),
                zero);
            kb.store(v, tile, {rr, cc});
          }
        };
        stage(rowsOp, rowBase, numRows, rowTile, kRows, /*clampRows=*/true);
        stage(colsOp, colBase, numCols, colTile, kCols, /*clampRows=*/false);
        kb.barrier();
        return kb.forLoop(c0, kb.idx(kChunk), c1, acc,
                         [&](Value dd, ValueRange s) -> SmallVector<Value> {
                           Value qv = kb.load(rowTile, {t.row, dd});
                           SmallVector<Value> next;
                           for (int64_t c = 0; c < kCols / kGroup; ++c) {
                             Value jj = kb.add(kb.idx(c * kGroup), t.lane);
                             Value kv = kb.load(colTile, {jj, dd});
                             next.push_back(kb.fadd(s[c], kb.fmul(qv, kv)));
                           }
                           return next;
                         });
      });
}

FailureOr<int64_t> mlir::moe::gpu_lowering::flashExpertCount(Operation *op,
                                                             Value e) {
  int64_t K = cast<RankedTensorType>(e.getType()).getShape()[2];
  if (ShapedType::isDynamic(K) || K > kFlashMaxExperts)
    return op->emitOpError("GPU lowering needs a static expert count <= ")
           << kFlashMaxExperts << " (got "
           << (ShapedType::isDynamic(K) ? std::string("?") : std::to_string(K))
           << ")";
  return K;
}

FlashLogitArgs::FlashLogitArgs(GPUKernel &kernel, const FlashLogitSpec &spec,
                               unsigned &next) {
  keyMask = spec.hasKeyMask ? kernel.arg(next++) : Value();
  bias = spec.hasBias ? kernel.arg(next++) : Value();
  add = spec.hasAddScores ? kernel.arg(next++) : Value();
  head = spec.hasAddScores ? kernel.arg(next++) : Value();
}

FlashMixArgs::FlashMixArgs(GPUKernel &kernel, const FlashMixSpec &spec)
    : next(3), q(kernel.arg(0)), keys(kernel.arg(1)), e(kernel.arg(2)),
      logit(kernel, spec, next) {
  outs.out = kernel.arg(next++);
  outs.outIdx = spec.topk ? kernel.arg(next++) : Value();
  outs.lse = spec.withLse ? kernel.arg(next++) : Value();
}

Value mlir::moe::gpu_lowering::flashPairLogit(GpuKernelBuilder &kb,
                                              const FlashMixSpec &spec,
                                              const FlashLogitArgs &logit,
                                              Value dot, Value b, Value h,
                                              Value row, Value j, Value Nk) {
  Value c0 = kb.idx(0);
  Value inRange = kb.lt(j, Nk);
  Value js = kb.select(inRange, j, c0);
  return flashLogit(
      kb, spec, dot,
      [&] {
        return kb.load(logit.bias, {b, js});
      },
      [&] {
        return kb.loadF(logit.add, {b, h, row, js});
      },
      [&] {
        return flashKeyKept(
            kb, spec, inRange,
            [&] {
              return logit.keyMask ? kb.load(logit.keyMask, {b, js}) : Value();
            },
            [&] { return kb.cmpi(arith::CmpIPredicate::ule, j, row); });
      });
}

FlashMixRows::FlashMixRows(GpuKernelBuilder &kb, const FlashMixSpec &spec,
                           const FlashMixArgs &args)
    : tile(kb, flashBlockOrder(spec.causal, spec.balanceCausal,
                               /*byKey=*/false)) {
  N = kb.dim(args.q, 1);
  D = kb.dim(args.q, 2);
  Nk = kb.dim(args.keys, 1);
  tile.clampRow(kb, N, kb.idx(1));
  head = args.logit.head
             ? kb.castInt(kb.load(args.logit.head, {tile.b}), kb.index())
             : Value();
  keyEnd = Nk;
  if (spec.causal)
    keyEnd = kb.minu(Nk, kb.add(tile.rowBase, kb.idx(kRows)));
}

/// The body of a flash mixing kernel (launchFlashMix).
static void emitFlashMix(GPUKernel &kernel, const FlashMixSpec &spec) {
  const int64_t K = spec.numExperts;
  const int64_t vpt = llvm::divideCeil(K, kGroup);
  GpuKernelBuilder &kb = kernel.kb;
  FlashMixArgs args(kernel, spec);
  Value q = args.q, keys = args.keys, e = args.e;
  const FlashLogitArgs &logit = args.logit;
  Value qs = kernel.workgroup(0), ks = kernel.workgroup(1),
        es = kernel.workgroup(2), ps = kernel.workgroup(3);

  Value zero = kb.cF32(0.0);
  Value negInf = kb.cF32(-std::numeric_limits<double>::infinity());
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  FlashMixRows rows(kb, spec, args);
  const FlashTile &tile = rows.tile;
  Value tid = tile.t.tid, r = tile.t.row, lane = tile.t.lane;
  Value b = tile.b, rowBase = tile.rowBase;
  Value N = rows.N, D = rows.D, Nk = rows.Nk, h = rows.head;
  Value i = tile.i, active = tile.active, row = tile.row;
  Value keyEnd = rows.keyEnd;

  SoftmaxState start = softmaxStart(kb);
  SmallVector<Value> init(vpt, zero);
  init.push_back(start.max);
  init.push_back(start.sum);
  SmallVector<Value> fin = kb.forLoop(
      c0, keyEnd, kb.idx(kCols), init,
      [&](Value j0, ValueRange carried) -> SmallVector<Value> {
        // Dot products of this lane's keys j0 + c*8 + lane, c < 4.
        SmallVector<Value> dots = emitFlashDots(
            kb, {tid, r, lane}, b, q, rowBase, N, keys, j0, Nk, D, qs, ks);

        // Logits with masks, then the online softmax update.
        SmallVector<Value> logits;
        for (int64_t c = 0; c < kCols / kGroup; ++c) {
          Value j = kb.add(j0, kb.add(kb.idx(c * kGroup), lane));
          logits.push_back(
              flashPairLogit(kb, spec, logit, dots[c], b, h, row, j, Nk));
        }
        // The row's online softmax (MoE/Kernels/OnlineSoftmax.h) over the
        // tile: its kCols logits are spread over the row's kGroup lanes.
        SoftmaxTile tile = onlineSoftmaxStep(
            kb, {carried[vpt], carried[vpt + 1]}, logits,
            [&](Value v) {
              return subgroupReduce(kb, v, ReduceKind::Max, kGroup);
            },
            [&](Value v) {
              return subgroupReduce(kb, v, ReduceKind::Sum, kGroup);
            });
        Value alpha = tile.rescale;
        ArrayRef<Value> probs = tile.probs;

        // Value tile and probabilities through workgroup memory. An excluded
        // key (masked, causal, padding: logit -inf) is stored as -1 and adds
        // nothing below, not 0 · e, so that a NaN in its e row reaches no
        // row that does not see the key (as the reference and the CPU).
        kb.barrier();
        Value excludedMark = kb.cF32(-1.0);
        for (int64_t c = 0; c < kCols / kGroup; ++c) {
          Value excluded = kb.cmpf(arith::CmpFPredicate::OEQ, logits[c], negInf);
          Value col = kb.add(kb.idx(c * kGroup), lane);
          kb.store(kb.select(excluded, excludedMark, probs[c]), ps, {r, col});
        }
        kb.forLoop(tid, kb.idx(kCols * K), kb.idx(kFlashThreads), [&](Value flat) {
          Value jj = kb.divu(flat, kb.idx(K));
          Value cc = kb.remu(flat, kb.idx(K));
          Value gj = kb.add(j0, jj);
          Value ok = kb.lt(gj, Nk);
          Value v =
              kb.select(ok, kb.loadF(e, {b, kb.select(ok, gj, c0), cc}), zero);
          kb.store(v, es, {jj, cc});
        });
        kb.barrier();

        SmallVector<Value> acc;
        for (int64_t m = 0; m < vpt; ++m)
          acc.push_back(kb.fmul(carried[m], alpha));
        acc = kb.forLoop(
            c0, kb.idx(kCols), c1, acc,
            [&](Value jj, ValueRange s) -> SmallVector<Value> {
              Value p = kb.load(ps, {r, jj});
              Value seen = kb.cmpf(arith::CmpFPredicate::OGE, p, zero);
              SmallVector<Value> next;
              for (int64_t m = 0; m < vpt; ++m) {
                int64_t col = m * kGroup;
                Value cc = kb.add(kb.idx(col), lane);
                if (col + kGroup > K)
                  cc = kb.minu(cc, kb.idx(K - 1)); // padding lanes: ignored
                Value sum = kb.fadd(s[m], kb.fmul(p, kb.load(es, {jj, cc})));
                next.push_back(kb.select(seen, sum, s[m]));
              }
              return next;
            });
        acc.push_back(tile.next.max);
        acc.push_back(tile.next.sum);
        return acc;
      });

  // Epilogue: normalize; a row without any key gets zeros.
  emitFlashMixEpilogue(kernel, spec, args.outs, {fin[vpt], fin[vpt + 1]},
                       ArrayRef<Value>(fin).take_front(vpt), b, N, i, row,
                       active, lane);
}

void mlir::moe::gpu_lowering::emitFlashMixEpilogue(
    GPUKernel &kernel, const FlashMixSpec &spec, const FlashMixOutputs &outs,
    SoftmaxState rowState, ArrayRef<Value> accs, Value b, Value N, Value i,
    Value row, Value active, Value lane) {
  GpuKernelBuilder &kb = kernel.kb;
  const int64_t K = spec.numExperts;
  Value c0 = kb.idx(0);
  Value out = outs.out, outIdx = outs.outIdx, lseOut = outs.lse;
  // The stores are guarded by `active`, where row = i: they index i, so that
  // the clamped 64-bit row does not live through the key loop (ptxas spilled
  // its high word at the register count it picked for sm_80).
  SmallVector<Value> vals;
  for (Value acc : accs)
    vals.push_back(softmaxNormalize(kb, rowState, acc));
  if (lseOut)
    kb.ifThen(kb.andI(active, kb.eq(lane, c0)), [&] {
      kb.store(softmaxLogSumExp(kb, rowState), lseOut, {b, i});
    });
  if (spec.topk) {
    Value outRows = viewAs2D(kernel.b, out),
          idxRows = viewAs2D(kernel.b, outIdx);
    Value flatRow = kb.add(kb.mul(b, N), row);
    emitRegisterTopk(kb, {.vals = vals,
                          .lane = lane,
                          .width = kGroup,
                          .numElements = K,
                          .out = {.spec = *spec.topk,
                                  .weights = outRows,
                                  .indices = idxRows,
                                  .row = flatRow,
                                  .active = active}});
  } else {
    kb.ifThen(active, [&] {
      for (int64_t m = 0; m < static_cast<int64_t>(vals.size()); ++m) {
        int64_t col = m * kGroup;
        Value cc = kb.add(kb.idx(col), lane);
        if (col + kGroup <= K) {
          kb.store(vals[m], out, {b, i, cc});
          continue;
        }
        kb.ifThen(kb.lt(cc, kb.idx(K)), [&] {
          kb.store(vals[m], out, {b, i, cc});
        });
      }
    });
  }
}

void mlir::moe::gpu_lowering::launchFlashMix(HostCode &h, StringRef name,
                                             const FlashMixSpec &spec, Value q,
                                             ValueRange args, Location loc) {
  Type f32 = h.b.getF32Type();
  SmallVector<Type> workgroup = {
      workgroupMemRef({kRows, kChunk + 1}, f32),      // query chunk
      workgroupMemRef({kCols, kChunk + 1}, f32),      // key chunk
      workgroupMemRef({kCols, spec.numExperts}, f32), // value tile
      workgroupMemRef({kRows, kCols + 1}, f32),       // probabilities
  };
  GPUKernel kernel(h, name, args, workgroup, {kFlashThreads, 1, 1}, loc);
  alignWorkgroupBuffers(kernel.func);
  emitFlashMix(kernel, spec);
  GpuKernelBuilder &kb = h.kb;
  Value grid = kb.ceilDiv(kb.dim(q, 1), kb.idx(kRows));
  kernel.launch({grid, kb.dim(q, 0), kb.idx(1)});
}

/// out = x · w (or w^T, or +=) in f32: one thread per output feature (blocks
/// along x); the B·N rows of x are strided over the blocks along y (a
/// grid-stride loop: gridDim.y is capped at 65535, B·N is not). The forward's
/// q = u · ws and the backward's du += dq · ws^T.
void mlir::moe::gpu_lowering::launchRowProjection(
    HostCode &host, StringRef name, Value x, Value w, Value out,
    bool transposed, bool accumulate, Location loc) {
  const int64_t threads = 128;
  GPUKernel kernel(host, name, {x, w, out}, {}, {threads, 1, 1}, loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value u = kernel.arg(0), ws = kernel.arg(1), q = kernel.arg(2);
    Value D = kb.dim(u, 2);
    Value N = kb.dim(u, 1);
    Value rows = kb.mul(kb.dim(u, 0), N);
    Value col = kernel.globalId();
    kernel.forRowsOfColumn(kb.lt(col, D), rows, [&](Value flatRow) {
      Value b = kb.divu(flatRow, N), i = kb.remu(flatRow, N);
      Value s = kb.forLoop(
          kb.idx(0), D, kb.idx(1), {kb.cF32(0.0)},
          [&](Value d, ValueRange acc) -> SmallVector<Value> {
            Value wv =
                transposed ? kb.loadF(ws, {col, d}) : kb.loadF(ws, {d, col});
            return {kb.fadd(acc[0], kb.fmul(kb.loadF(u, {b, i, d}), wv))};
          })[0];
      if (accumulate)
        s = kb.fadd(kb.load(q, {b, i, col}), s);
      kb.store(s, q, {b, i, col});
    });
  }
  GpuKernelBuilder &kb = host.kb;
  Value N = kb.dim(x, 1), B = kb.dim(x, 0);
  Value rows = kb.mul(B, N);
  kernel.launchColumns(kb.dim(x, 2), rows);
}

void mlir::moe::gpu_lowering::launchFlashMixKernel(
    HostCode &h, StringRef name, const FlashMixSpec &spec,
    const std::optional<FlashMmaTile> &mma,
    const std::optional<FlashTf32Tile> &tf32, Value q, ValueRange args,
    Location loc) {
  if (mma)
    launchFlashMixMma(h, (name + "_mma").str(), spec, *mma, q, args, loc);
  else if (tf32)
    launchFlashTf32(h, (name + "_tf32").str(), spec, *tf32, q, args, loc);
  else
    launchFlashMix(h, name, spec, q, args, loc);
}
