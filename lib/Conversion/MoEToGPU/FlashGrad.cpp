//===- FlashGrad.cpp - Flash-style backward tiles of the mixing ops -------===//
//
// Part of the MoE-MLIR project.
//
// The GPU counterpart of the CPU's emitFlashGrad (MoEToCPU/FlashGrad.cpp),
// FlashAttention-2-backward style, on the forward's tiles (Lowerings.h):
//
//  * a block (128 threads) owns 16 rows of one sequence, a group of 8 lanes
//    a row; column tiles of 32 stream through workgroup memory;
//  * per tile, the score dots <s_row, s_col> and the cotangent dots
//    <g_row, g_col> come from the forward's staged-chunk dot products
//    (emitFlashDots); each thread turns its 4 pairs into the probability
//    S = exp(x - lse_query) (recomputed from the saved log-sum-exp: no online
//    max) and the logit cotangent dX = S (g - delta_query) / scale, which
//    meet in two padded [16 x 33] workgroup tiles;
//  * each accumulator then streams its value rows [32 x W] through the column
//    tile in chunks of 32 features and adds Σ_col W_rc v_c to the block's own
//    output rows in global memory: a block is the only writer of its rows and
//    adds the tiles in column order, so the result is deterministic (no
//    atomics) and W (the feature width, dynamic) is not bounded by registers;
//  * an excluded pair (masked key, causal j > i, an added score of -inf,
//    padding) is marked S = -1 in the tile and adds nothing (not 0 · v, so
//    that a NaN in the value row of a key a query does not see stays out of
//    that query's gradient, as in the forward kernel);
//  * attention_posterior's logits (AttentionPosteriorGrad.cpp) add a per-key
//    bias and the scores of the head h*[b] to the scaled dot, in the forward
//    kernel's order, and its query-major pass also stores the logit
//    cotangent dz = S (g - delta) of every pair (0 for an excluded one): the
//    scores' gradient at h*;
//  * a `ones` accumulator sums the weights of a row (Σ_col W, values all 1)
//    without staging anything.
//
// The caller runs it twice with the roles swapped (query-major: rows are
// queries, for the query gradient; key-major: rows are keys, for the value
// and key gradients), so that every output row has one writer.
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"
#include "Lowerings.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

static constexpr int64_t kPairs = kFlashCols / kFlashGroup; // 4 per thread

// Blocks per multiprocessor the backward kernels ask of ptxas (PTX
// .minnctapersm; 65536 / (3 · 128) caps a thread at 168 registers). Given
// only .maxntid, ptxas -O3 picks its own register target for occupancy and,
// for these kernels, sometimes below what they keep live across the column
// loop (4 pairs' S and dX, two sets of 4 dots, 4 output sums, the tile's
// addresses): 72 registers and an 8 B spill in the key-major kernel of a
// causal similarity grad on sm_90, 128 and 20 B with saved statistics. With
// the floor stated, ptxas allocates what the kernel needs: 83-168 registers
// over every configuration of the tests (up to 202 uncapped), none spills
// (bench/results/ptxas-sm_*.md). Three blocks are 12 warps of 4 per
// multiprocessor, enough to overlap one block's barriers with another's
// loads; four (128 registers) spill the large configurations. The price:
// kernels ptxas had squeezed to 64-80 registers (6-8 blocks) now take
// 96-141; not yet timed on a GPU.
static constexpr int64_t kFlashGradBlocksPerSM = 3;

void mlir::moe::gpu_lowering::launchFlashGrad(HostCode &host, StringRef name,
                                              const FlashGradSpec &spec,
                                              ValueRange args, Location loc) {
  MLIRContext *ctx = host.b.getContext();
  Type f32 = Float32Type::get(ctx);
  SmallVector<Type> workgroup = {
      workgroupMemRef({kFlashRows, kFlashChunk + 1}, f32), // row chunk
      workgroupMemRef({kFlashCols, kFlashChunk + 1}, f32), // column chunk
      workgroupMemRef({kFlashRows, kFlashCols + 1}, f32),  // S
      workgroupMemRef({kFlashRows, kFlashCols + 1}, f32),  // dX
  };
  GPUKernel kernel(host, name, args, workgroup, {kFlashThreads, 1, 1}, loc);
  kernel.func->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                       kernel.b.getI32IntegerAttr(kFlashGradBlocksPerSM));
  {
    GpuKernelBuilder &k = kernel.k;
    unsigned a = 0;
    Value scoreRows = kernel.arg(a++);
    Value scoreCols = kernel.arg(a++);
    Value gradRows = kernel.arg(a++);
    Value gradCols = kernel.arg(a++);
    Value lse = kernel.arg(a++);
    Value delta = kernel.arg(a++);
    FlashLogitArgs logit(kernel, spec, a);
    Value keyMask = logit.keyMask, bias = logit.bias, add = logit.add,
          head = logit.head;
    Value dzOut = spec.storeDz ? kernel.arg(a++) : Value();
    SmallVector<std::pair<Value, Value>> accs;
    for (const FlashGradSpec::Accumulator &acc : spec.accumulators) {
      Value values = acc.ones ? Value() : kernel.arg(a++);
      accs.push_back({values, kernel.arg(a++)});
    }
    Value rs = kernel.workgroup(0), cs = kernel.workgroup(1),
          ss = kernel.workgroup(2), dxs = kernel.workgroup(3);

    Value zero = k.cF32(0.0);
    Value negInf = k.negInfLike(k.f32());
    Value excludedMark = k.cF32(-1.0);
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value tid = k.threadId();
    FlashLanes t{tid, k.divu(tid, k.idx(kFlashGroup)),
                 k.remu(tid, k.idx(kFlashGroup))};
    Value b = k.blockId(gpu::Dimension::y);
    Value rowBase = k.mul(k.blockId(), k.idx(kFlashRows));
    Value R = k.dim(scoreRows, 1), C = k.dim(scoreCols, 1);
    Value D = k.dim(scoreRows, 2), G = k.dim(gradRows, 2);
    Value i = k.add(rowBase, t.row);
    Value active = k.lt(i, R);
    Value row = k.select(active, i, k.sub(R, c1));
    // The scores (and dz) of head h*[b] as rows [B·H·Nq, Nk]: the row of
    // query i is (b·H + h*) · Nq + i (one index computation per pair, not a
    // 4-D one: fewer registers).
    Value scoreRow0;
    if (add) {
      Value h = k.castInt(k.load(head, {b}), k.index());
      scoreRow0 = k.mul(k.add(k.mul(b, k.dim(add, 1)), h), k.dim(add, 2));
      add = viewAs2D(kernel.b, add);
      if (dzOut)
        dzOut = viewAs2D(kernel.b, dzOut);
    }

    // Columns the tile needs: causal pairs have key <= query, so a
    // query-major tile stops after its last row and a key-major tile starts
    // at the column tile of its first row.
    Value colBegin = c0, colEnd = C;
    if (spec.causal && spec.keyMajor)
      colBegin = k.mul(k.divu(rowBase, k.idx(kFlashCols)), k.idx(kFlashCols));
    else if (spec.causal)
      colEnd = k.minu(C, k.add(rowBase, k.idx(kFlashRows)));
    // The row's own statistics (query-major) or validity as a key.
    Value rowLse, rowDelta, rowIsKey;
    if (!spec.keyMajor) {
      rowLse = k.load(lse, {b, row});
      rowDelta = k.load(delta, {b, row});
    } else {
      if (keyMask)
        rowIsKey = k.load(keyMask, {b, row});
    }

    k.forLoop(colBegin, colEnd, k.idx(kFlashCols), [&](Value j0) {
      SmallVector<Value> sDots = emitFlashDots(k, t, b, scoreRows, rowBase, R,
                                               scoreCols, j0, C, D, rs, cs);
      SmallVector<Value> gDots = emitFlashDots(k, t, b, gradRows, rowBase, R,
                                               gradCols, j0, C, G, rs, cs);
      // S and dX of this thread's pairs into the tiles (the previous tile's
      // readers are past the barriers of the cotangent dots: G >= 1).
      for (int64_t c = 0; c < kPairs; ++c) {
        Value jj = k.add(k.idx(c * kFlashGroup), t.lane);
        Value col = k.add(j0, jj);
        Value inRange = k.lt(col, C);
        Value cl = k.select(inRange, col, c0);
        Value query = spec.keyMajor ? cl : row;
        Value key = spec.keyMajor ? row : cl;
        Value keep = flashKeyKept(
            k, spec, inRange,
            [&] {
              if (!keyMask)
                return Value();
              return spec.keyMajor ? rowIsKey : k.load(keyMask, {b, cl});
            },
            [&] { return k.cmpi(arith::CmpIPredicate::ule, key, query); });
        Value l = spec.keyMajor ? k.load(lse, {b, cl}) : rowLse;
        Value d = spec.keyMajor ? k.load(delta, {b, cl}) : rowDelta;
        // The forward kernel's logit (MoE/Kernels/FlashLogit.h); a pair whose
        // added score is -inf is excluded.
        Value score;
        Value x = flashScaledLogit(
            k, spec, sDots[c],
            [&] {
              return k.load(bias, {b, key});
            },
            [&] {
              score = k.loadF(add, {k.add(scoreRow0, query), key});
              return score;
            });
        if (score)
          keep = k.andI(keep, k.cmpf(arith::CmpFPredicate::UNE, score, negInf));
        SoftmaxGrad sg =
            softmaxGradFromLogSumExp(k, x, l, gDots[c], [&] { return d; });
        Value s = sg.prob, dz = sg.dlogit;
        Value dx = k.fdiv(dz, k.cF32(spec.scaleDiv));
        k.store(k.select(keep, s, excludedMark), ss, {t.row, jj});
        k.store(k.select(keep, dx, zero), dxs, {t.row, jj});
        if (dzOut)
          k.ifThen(k.andI(active, inRange), [&] {
            // Named first: argument evaluation order is unspecified, and the
            // IR must not depend on the host compiler.
            Value row = k.add(scoreRow0, query);
            Value v = k.select(keep, dz, zero);
            k.store(v, dzOut, {row, key});
          });
      }

      Value first = k.eq(j0, colBegin);
      for (auto [acc, outs] : llvm::zip(spec.accumulators, accs)) {
        auto [values, out] = outs;
        Value weights = acc.byDx ? dxs : ss;
        if (acc.ones) {
          // Σ_col W of the row: lane 0 of its group sums the tile row in
          // column order (the barrier publishes the other lanes' entries).
          k.barrier();
          Value sum = k.forLoop(
              c0, k.idx(kFlashCols), c1, {zero},
              [&](Value jj, ValueRange s) -> SmallVector<Value> {
                Value sw = k.load(ss, {t.row, jj});
                Value seen =
                    k.cmpf(arith::CmpFPredicate::UNE, sw, excludedMark);
                Value w = acc.byDx ? k.load(weights, {t.row, jj}) : sw;
                return {k.select(seen, k.fadd(s[0], w), s[0])};
              })[0];
          k.ifThen(k.andI(active, k.eq(t.lane, c0)), [&] {
            Value old = k.load(out, {b, row, c0});
            if (!acc.addToOut)
              old = k.select(first, zero, old);
            k.store(k.fadd(old, sum), out, {b, row, c0});
          });
          continue;
        }
        Value W = k.dim(values, 2);
        k.forLoop(c0, W, k.idx(kFlashChunk), [&](Value w0) {
          // The value rows of the tile's columns at features [w0, w0 + 32).
          k.barrier();
          for (int64_t n = 0; n < kFlashCols * kFlashChunk / kFlashThreads;
               ++n) {
            Value flat = k.add(tid, k.idx(n * kFlashThreads));
            Value rr = k.divu(flat, k.idx(kFlashChunk));
            Value cc = k.remu(flat, k.idx(kFlashChunk));
            Value gj = k.add(j0, rr), gw = k.add(w0, cc);
            Value ok = k.andI(k.lt(gj, C), k.lt(gw, W));
            Value v = k.select(ok,
                               k.loadF(values, {b, k.select(ok, gj, c0),
                                                k.select(ok, gw, c0)}),
                               zero);
            k.store(v, cs, {rr, cc});
          }
          k.barrier();
          SmallVector<Value> sums = k.forLoop(
              c0, k.idx(kFlashCols), c1, SmallVector<Value>(kPairs, zero),
              [&](Value jj, ValueRange s) -> SmallVector<Value> {
                Value sw = k.load(ss, {t.row, jj});
                // NaN weights count: only the mark is skipped.
                Value seen =
                    k.cmpf(arith::CmpFPredicate::UNE, sw, excludedMark);
                Value w = acc.byDx ? k.load(weights, {t.row, jj}) : sw;
                SmallVector<Value> next;
                for (int64_t c = 0; c < kPairs; ++c) {
                  Value cc = k.add(k.idx(c * kFlashGroup), t.lane);
                  Value sum = k.fadd(s[c], k.fmul(w, k.load(cs, {jj, cc})));
                  next.push_back(k.select(seen, sum, s[c]));
                }
                return next;
              });
          for (int64_t c = 0; c < kPairs; ++c) {
            Value gw = k.add(w0, k.add(k.idx(c * kFlashGroup), t.lane));
            k.ifThen(k.andI(active, k.lt(gw, W)), [&] {
              Value old = k.load(out, {b, row, gw});
              if (!acc.addToOut)
                old = k.select(first, zero, old);
              k.store(k.fadd(old, sums[c]), out, {b, row, gw});
            });
          }
        });
      }
    });
  }
  GpuKernelBuilder &k = host.k;
  Value rows = k.dim(args[0], 1);
  kernel.launch(
      {k.ceilDiv(rows, k.idx(kFlashRows)), k.dim(args[0], 0), k.idx(1)});
}

void mlir::moe::gpu_lowering::launchFlashGradStats(HostCode &host, Value lse,
                                                   Value p, Value dp,
                                                   Value delta, Location loc,
                                                   Value lseOut, Value skip) {
  const int64_t threads = 128;
  SmallVector<Value> operands = {lse, p, dp, delta, lseOut ? lseOut : lse};
  if (skip)
    operands.push_back(skip);
  GPUKernel kernel(host, "flash_grad_stats", operands, {}, {threads, 1, 1},
                   loc);
  {
    GpuKernelBuilder &k = kernel.k;
    Value l = kernel.arg(0), pv = kernel.arg(1), g = kernel.arg(2),
          dl = kernel.arg(3), lOut = kernel.arg(4);
    Value N = k.dim(pv, 1);
    Value i = kernel.globalId();
    Value b = k.blockId(gpu::Dimension::y);
    k.ifThen(k.lt(i, N), [&] {
      Value x = k.load(l, {b, i});
      Value none = k.cmpf(arith::CmpFPredicate::OEQ, x, k.negInfLike(k.f32()));
      if (skip) {
        // (Operands named first: the order of a call's arguments differs
        // between compilers, and with it the order of the emitted ops.)
        Value flag = k.load(kernel.arg(5), {b});
        Value zero = k.cI32(0);
        none = k.orI(none, k.cmpi(arith::CmpIPredicate::ne, flag, zero));
      }
      k.store(
          k.select(none, k.cF32(std::numeric_limits<double>::infinity()), x),
          lOut, {b, i});
      Value dot =
          k.forLoop(k.idx(0), k.dim(pv, 2), k.idx(1), {k.cF32(0.0)},
                    [&](Value c, ValueRange acc) -> SmallVector<Value> {
                      return {k.fadd(acc[0], k.fmul(k.load(g, {b, i, c}),
                                                    k.load(pv, {b, i, c})))};
                    })[0];
      k.store(dot, dl, {b, i});
    });
  }
  GpuKernelBuilder &k = host.k;
  kernel.launch(
      {k.ceilDiv(k.dim(p, 1), k.idx(threads)), k.dim(p, 0), k.idx(1)});
}
