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

#include "KernelUtils.h"
#include "Lowerings.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"

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
    GpuKernelBuilder &k, const FlashLanes &t, Value b, Value rowsOp,
    Value rowBase, Value numRows, Value colsOp, Value colBase, Value numCols,
    Value depth, Value rowTile, Value colTile) {
  Value zero = k.cF32(0.0);
  Value c0 = k.idx(0), c1 = k.idx(1);
  SmallVector<Value> dots(kCols / kGroup, zero);
  return k.forLoop(
      c0, depth, k.idx(kChunk), dots,
      [&](Value d0, ValueRange acc) -> SmallVector<Value> {
        k.barrier();
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
            Value flat = k.add(t.tid, k.idx(n * kFlashThreads));
            Value rr = k.divu(flat, k.idx(kChunk));
            Value cc = k.remu(flat, k.idx(kChunk));
            Value gi = k.add(base, rr), gd = k.add(d0, cc);
            Value ok;
            if (clampRows) {
              ok = k.lt(gd, depth);
              gi = k.minu(gi, k.sub(limit, c1));
            } else {
              ok = k.andI(k.lt(gi, limit), k.lt(gd, depth));
            }
            Value v = k.select(
                ok,
                k.loadF(src, {b, k.select(ok, gi, c0), k.select(ok, gd, c0)}),
                zero);
            k.store(v, tile, {rr, cc});
          }
        };
        stage(rowsOp, rowBase, numRows, rowTile, kRows, /*clampRows=*/true);
        stage(colsOp, colBase, numCols, colTile, kCols, /*clampRows=*/false);
        k.barrier();
        return k.forLoop(c0, k.idx(kChunk), c1, acc,
                         [&](Value dd, ValueRange s) -> SmallVector<Value> {
                           Value qv = k.load(rowTile, {t.row, dd});
                           SmallVector<Value> next;
                           for (int64_t c = 0; c < kCols / kGroup; ++c) {
                             Value jj = k.add(k.idx(c * kGroup), t.lane);
                             Value kv = k.load(colTile, {jj, dd});
                             next.push_back(k.fadd(s[c], k.fmul(qv, kv)));
                           }
                           return next;
                         });
      });
}

FlashLogitArgs::FlashLogitArgs(GPUKernel &kernel, const FlashLogitSpec &spec,
                               unsigned &next) {
  keyMask = spec.hasKeyMask ? kernel.arg(next++) : Value();
  bias = spec.hasBias ? kernel.arg(next++) : Value();
  add = spec.hasAddScores ? kernel.arg(next++) : Value();
  head = spec.hasAddScores ? kernel.arg(next++) : Value();
}

/// The body of a flash mixing kernel (launchFlashMix).
static void emitFlashMix(GPUKernel &kernel, const FlashMixSpec &spec) {
  const int64_t K = spec.numExperts;
  const int64_t vpt = llvm::divideCeil(K, kGroup);
  GpuKernelBuilder &k = kernel.k;
  unsigned a = 0;
  Value q = kernel.arg(a++);
  Value keys = kernel.arg(a++);
  Value e = kernel.arg(a++);
  FlashLogitArgs logit(kernel, spec, a);
  Value keyMask = logit.keyMask, bias = logit.bias, add = logit.add,
        head = logit.head;
  Value out = kernel.arg(a++);
  Value outIdx = spec.topk ? kernel.arg(a++) : Value();
  Value lseOut = spec.withLse ? kernel.arg(a++) : Value();
  Value qs = kernel.workgroup(0), ks = kernel.workgroup(1),
        es = kernel.workgroup(2), ps = kernel.workgroup(3);

  Value zero = k.cF32(0.0);
  Value negInf = k.cF32(-std::numeric_limits<double>::infinity());
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value tid = k.threadId();
  Value r = k.divu(tid, k.idx(kGroup));
  Value lane = k.remu(tid, k.idx(kGroup));
  Value b = k.blockId(gpu::Dimension::y);
  Value rowBase = k.mul(k.blockId(), k.idx(kRows));
  Value N = k.dim(q, 1);
  Value D = k.dim(q, 2);
  Value Nk = k.dim(keys, 1);
  Value i = k.add(rowBase, r);
  Value active = k.lt(i, N);
  Value row = k.select(active, i, k.sub(N, c1));
  Value h = head ? k.castInt(k.load(head, {b}), k.index()) : Value();

  // Keys needed by the tile: all, or up to its last row when causal.
  Value keyEnd = Nk;
  if (spec.causal)
    keyEnd = k.minu(Nk, k.add(rowBase, k.idx(kRows)));

  SoftmaxState start = softmaxStart(k);
  SmallVector<Value> init(vpt, zero);
  init.push_back(start.max);
  init.push_back(start.sum);
  SmallVector<Value> fin = k.forLoop(
      c0, keyEnd, k.idx(kCols), init,
      [&](Value j0, ValueRange carried) -> SmallVector<Value> {
        // Dot products of this lane's keys j0 + c*8 + lane, c < 4.
        SmallVector<Value> dots = emitFlashDots(
            k, {tid, r, lane}, b, q, rowBase, N, keys, j0, Nk, D, qs, ks);

        // Logits with masks, then the online softmax update.
        SmallVector<Value> logits;
        for (int64_t c = 0; c < kCols / kGroup; ++c) {
          Value j = k.add(j0, k.add(k.idx(c * kGroup), lane));
          Value inRange = k.lt(j, Nk);
          Value js = k.select(inRange, j, c0);
          logits.push_back(flashLogit(
              k, spec, dots[c],
              [&] {
                return k.load(bias, {b, js});
              },
              [&] {
                return k.loadF(add, {b, h, row, js});
              },
              [&] {
                return flashKeyKept(
                    k, spec, inRange,
                    [&] {
                      return keyMask ? k.load(keyMask, {b, js}) : Value();
                    },
                    [&] { return k.cmpi(arith::CmpIPredicate::ule, j, row); });
              }));
        }
        // The row's online softmax (MoE/Kernels/OnlineSoftmax.h) over the
        // tile: its kCols logits are spread over the row's kGroup lanes.
        SoftmaxTile tile = onlineSoftmaxStep(
            k, {carried[vpt], carried[vpt + 1]}, logits,
            [&](Value v) {
              return subgroupReduce(k, v, ReduceKind::Max, kGroup);
            },
            [&](Value v) {
              return subgroupReduce(k, v, ReduceKind::Sum, kGroup);
            });
        Value alpha = tile.rescale;
        ArrayRef<Value> probs = tile.probs;

        // Value tile and probabilities through workgroup memory. An excluded
        // key (masked, causal, padding: logit -inf) is stored as -1 and adds
        // nothing below, not 0 · e, so that a NaN in its e row reaches no
        // row that does not see the key (as the reference and the CPU).
        k.barrier();
        Value excludedMark = k.cF32(-1.0);
        for (int64_t c = 0; c < kCols / kGroup; ++c) {
          Value excluded = k.cmpf(arith::CmpFPredicate::OEQ, logits[c], negInf);
          k.store(k.select(excluded, excludedMark, probs[c]), ps,
                  {r, k.add(k.idx(c * kGroup), lane)});
        }
        k.forLoop(tid, k.idx(kCols * K), k.idx(kFlashThreads), [&](Value flat) {
          Value jj = k.divu(flat, k.idx(K));
          Value cc = k.remu(flat, k.idx(K));
          Value gj = k.add(j0, jj);
          Value ok = k.lt(gj, Nk);
          Value v =
              k.select(ok, k.loadF(e, {b, k.select(ok, gj, c0), cc}), zero);
          k.store(v, es, {jj, cc});
        });
        k.barrier();

        SmallVector<Value> acc;
        for (int64_t m = 0; m < vpt; ++m)
          acc.push_back(k.fmul(carried[m], alpha));
        acc = k.forLoop(
            c0, k.idx(kCols), c1, acc,
            [&](Value jj, ValueRange s) -> SmallVector<Value> {
              Value p = k.load(ps, {r, jj});
              Value seen = k.cmpf(arith::CmpFPredicate::OGE, p, zero);
              SmallVector<Value> next;
              for (int64_t m = 0; m < vpt; ++m) {
                int64_t col = m * kGroup;
                Value cc = k.add(k.idx(col), lane);
                if (col + kGroup > K)
                  cc = k.minu(cc, k.idx(K - 1)); // padding lanes: ignored
                Value sum = k.fadd(s[m], k.fmul(p, k.load(es, {jj, cc})));
                next.push_back(k.select(seen, sum, s[m]));
              }
              return next;
            });
        acc.push_back(tile.next.max);
        acc.push_back(tile.next.sum);
        return acc;
      });

  // Epilogue: normalize; a row without any key gets zeros. The stores are
  // guarded by `active`, where row = i: they index i, so that the clamped
  // 64-bit row does not live through the key loop (ptxas spilled its high
  // word at the register count it picked for sm_80).
  SoftmaxState rowState = {fin[vpt], fin[vpt + 1]};
  SmallVector<Value> vals;
  for (int64_t m = 0; m < vpt; ++m)
    vals.push_back(softmaxNormalize(k, rowState, fin[m]));
  if (lseOut)
    k.ifThen(k.andI(active, k.eq(lane, c0)), [&] {
      k.store(softmaxLogSumExp(k, rowState), lseOut, {b, i});
    });
  if (spec.topk) {
    Value outRows = viewAs2D(kernel.b, out),
          idxRows = viewAs2D(kernel.b, outIdx);
    Value flatRow = k.add(k.mul(b, N), row);
    emitRegisterTopk(k, vals, lane, kGroup, K, *spec.topk, outRows, idxRows,
                     flatRow, active, Value(), Value());
  } else {
    k.ifThen(active, [&] {
      for (int64_t m = 0; m < vpt; ++m) {
        int64_t col = m * kGroup;
        Value cc = k.add(k.idx(col), lane);
        if (col + kGroup <= K) {
          k.store(vals[m], out, {b, i, cc});
          continue;
        }
        k.ifThen(k.lt(cc, k.idx(K)), [&] {
          k.store(vals[m], out, {b, i, cc});
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
  emitFlashMix(kernel, spec);
  GpuKernelBuilder &k = h.k;
  Value grid = k.ceilDiv(k.dim(q, 1), k.idx(kRows));
  kernel.launch({grid, k.dim(q, 0), k.idx(1)});
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
    GpuKernelBuilder &k = kernel.k;
    Value u = kernel.arg(0), ws = kernel.arg(1), q = kernel.arg(2);
    Value D = k.dim(u, 2);
    Value N = k.dim(u, 1);
    Value rows = k.mul(k.dim(u, 0), N);
    Value col = kernel.globalId();
    kernel.forRowsOfColumn(k.lt(col, D), rows, [&](Value flatRow) {
      Value b = k.divu(flatRow, N), i = k.remu(flatRow, N);
      Value s = k.forLoop(
          k.idx(0), D, k.idx(1), {k.cF32(0.0)},
          [&](Value d, ValueRange acc) -> SmallVector<Value> {
            Value wv =
                transposed ? k.loadF(ws, {col, d}) : k.loadF(ws, {d, col});
            return {k.fadd(acc[0], k.fmul(k.loadF(u, {b, i, d}), wv))};
          })[0];
      if (accumulate)
        s = k.fadd(k.load(q, {b, i, col}), s);
      k.store(s, q, {b, i, col});
    });
  }
  GpuKernelBuilder &k = host.k;
  Value rows = k.mul(k.dim(x, 0), k.dim(x, 1));
  kernel.launchColumns(k.dim(x, 2), rows);
}
