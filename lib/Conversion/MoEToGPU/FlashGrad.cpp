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

#include "FlashTile.h"
#include "HostCode.h"
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

namespace {
/// A column tile's accumulations (launchFlashGrad): the tile's weights S
/// (`ss`, the excluded pairs marked) and dX in workgroup memory, summed over
/// the columns into the thread's row of each accumulator's output.
struct FlashGradSums {
  GpuKernelBuilder &kb;
  FlashLanes t;
  Value b, row, active, C, ss, cs, excludedMark, zero, c0, c1;
  /// The tile's first column, and whether it is the row's first tile (an
  /// output not added to starts from zero there).
  Value j0, first;

  /// Σ_col W of the row: lane 0 of its group sums the tile row in column
  /// order (the barrier publishes the other lanes' entries).
  void rowSum(const FlashGradSpec::Accumulator &acc, Value weights, Value out) {
    kb.barrier();
    Value sum =
        kb.forLoop(c0, kb.idx(kFlashCols), c1, {zero},
                   [&](Value jj, ValueRange s) -> SmallVector<Value> {
                     Value sw = kb.load(ss, {t.row, jj});
                     Value seen =
                         kb.cmpf(arith::CmpFPredicate::UNE, sw, excludedMark);
                     Value w = acc.byDx ? kb.load(weights, {t.row, jj}) : sw;
                     return {kb.select(seen, kb.fadd(s[0], w), s[0])};
                   })[0];
    kb.ifThen(kb.andI(active, kb.eq(t.lane, c0)), [&] {
      Value old = kb.load(out, {b, row, c0});
      if (!acc.addToOut)
        old = kb.select(first, zero, old);
      kb.store(kb.fadd(old, sum), out, {b, row, c0});
    });
  }

  /// Σ_col W · values[col] of the row, 32 features at a time: the value
  /// rows of the tile's columns staged in `cs`, each lane of the row's group
  /// summing kPairs features in column order.
  void valueSums(const FlashGradSpec::Accumulator &acc, Value weights,
                 Value values, Value out) {
    Value W = kb.dim(values, 2);
    kb.forLoop(c0, W, kb.idx(kFlashChunk), [&](Value w0) {
      // The value rows of the tile's columns at features [w0, w0 + 32).
      kb.barrier();
      for (int64_t n = 0; n < kFlashCols * kFlashChunk / kFlashThreads; ++n) {
        Value flat = kb.add(t.tid, kb.idx(n * kFlashThreads));
        Value rr = kb.divu(flat, kb.idx(kFlashChunk));
        Value cc = kb.remu(flat, kb.idx(kFlashChunk));
        Value gj = kb.add(j0, rr), gw = kb.add(w0, cc);
        Value inWidth = kb.lt(gw, W);
        Value ok = kb.andI(kb.lt(gj, C), inWidth);
        Value v = kb.select(
            ok,
            kb.loadF(values, {b, kb.select(ok, gj, c0), kb.select(ok, gw, c0)}),
            zero);
        kb.store(v, cs, {rr, cc});
      }
      kb.barrier();
      SmallVector<Value> sums = kb.forLoop(
          c0, kb.idx(kFlashCols), c1, SmallVector<Value>(kPairs, zero),
          [&](Value jj, ValueRange s) -> SmallVector<Value> {
            Value sw = kb.load(ss, {t.row, jj});
            // NaN weights count: only the mark is skipped.
            Value seen = kb.cmpf(arith::CmpFPredicate::UNE, sw, excludedMark);
            Value w = acc.byDx ? kb.load(weights, {t.row, jj}) : sw;
            SmallVector<Value> next;
            for (int64_t c = 0; c < kPairs; ++c) {
              Value cc = kb.add(kb.idx(c * kFlashGroup), t.lane);
              Value sum = kb.fadd(s[c], kb.fmul(w, kb.load(cs, {jj, cc})));
              next.push_back(kb.select(seen, sum, s[c]));
            }
            return next;
          });
      for (int64_t c = 0; c < kPairs; ++c) {
        Value gw = kb.add(w0, kb.add(kb.idx(c * kFlashGroup), t.lane));
        kb.ifThen(kb.andI(active, kb.lt(gw, W)), [&] {
          Value old = kb.load(out, {b, row, gw});
          if (!acc.addToOut)
            old = kb.select(first, zero, old);
          kb.store(kb.fadd(old, sums[c]), out, {b, row, gw});
        });
      }
    });
  }
};
} // namespace

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
  alignWorkgroupBuffers(kernel.func);
  {
    GpuKernelBuilder &kb = kernel.kb;
    unsigned a = 0;
    Value scoreRows = kernel.arg(a++);
    Value scoreCols = kernel.arg(a++);
    Value gradRows = kernel.arg(a++);
    Value gradCols = kernel.arg(a++);
    Value lse = kernel.arg(a++);
    Value delta = kernel.arg(a++);
    FlashLogitArgs logit(kernel, spec, a);
    Value dzOut = spec.storeDz ? kernel.arg(a++) : Value();
    SmallVector<std::pair<Value, Value>> accs;
    for (const FlashGradSpec::Accumulator &acc : spec.accumulators) {
      Value values = acc.ones ? Value() : kernel.arg(a++);
      accs.push_back({values, kernel.arg(a++)});
    }
    Value rs = kernel.workgroup(0), cs = kernel.workgroup(1),
          ss = kernel.workgroup(2), dxs = kernel.workgroup(3);

    Value zero = kb.cF32(0.0);
    Value negInf = kb.negInfLike(kb.f32());
    Value excludedMark = kb.cF32(-1.0);
    Value c0 = kb.idx(0), c1 = kb.idx(1);
    FlashTile tile(kb, flashBlockOrder(spec.causal, spec.balanceCausal,
                                       spec.keyMajor));
    FlashLanes t = tile.t;
    Value b = tile.b, rowBase = tile.rowBase;
    Value R = kb.dim(scoreRows, 1), C = kb.dim(scoreCols, 1);
    Value D = kb.dim(scoreRows, 2), G = kb.dim(gradRows, 2);
    tile.clampRow(kb, R, c1);
    Value active = tile.active, row = tile.row;
    // The scores (and dz) of head h*[b] as rows [B·H·Nq, Nk]: the row of
    // query i is (b·H + h*) · Nq + i (one index computation per pair, not a
    // 4-D one: fewer registers).
    Value scoreRow0;
    if (logit.add) {
      Value h = kb.castInt(kb.load(logit.head, {b}), kb.index());
      // (One op a statement, in the order the plain build has always
      // emitted: as arguments of one call, the C++ compiler's order.)
      Value numQueries = kb.dim(logit.add, 2), numHeads = kb.dim(logit.add, 1);
      scoreRow0 = kb.mul(kb.add(kb.mul(b, numHeads), h), numQueries);
      logit.add = viewAs2D(kernel.b, logit.add);
      if (dzOut)
        dzOut = viewAs2D(kernel.b, dzOut);
    }

    // Columns the tile needs: causal pairs have key <= query, so a
    // query-major tile stops after its last row and a key-major tile starts
    // at the column tile of its first row.
    Value colBegin = c0, colEnd = C;
    if (spec.causal && spec.keyMajor)
      colBegin = kb.mul(kb.divu(rowBase, kb.idx(kFlashCols)), kb.idx(kFlashCols));
    else if (spec.causal)
      colEnd = kb.minu(C, kb.add(rowBase, kb.idx(kFlashRows)));
    // The row's own statistics (query-major) or validity as a key.
    Value rowLse, rowDelta, rowIsKey;
    if (!spec.keyMajor) {
      rowLse = kb.load(lse, {b, row});
      rowDelta = kb.load(delta, {b, row});
    } else {
      if (logit.keyMask)
        rowIsKey = kb.load(logit.keyMask, {b, row});
    }

    kb.forLoop(colBegin, colEnd, kb.idx(kFlashCols), [&](Value j0) {
      SmallVector<Value> sDots = emitFlashDots(kb, t, b, scoreRows, rowBase, R,
                                               scoreCols, j0, C, D, rs, cs);
      SmallVector<Value> gDots = emitFlashDots(kb, t, b, gradRows, rowBase, R,
                                               gradCols, j0, C, G, rs, cs);
      // S and dX of this thread's pairs into the tiles (the previous tile's
      // readers are past the barriers of the cotangent dots: G >= 1).
      for (int64_t c = 0; c < kPairs; ++c) {
        Value jj = kb.add(kb.idx(c * kFlashGroup), t.lane);
        Value col = kb.add(j0, jj);
        Value inRange = kb.lt(col, C);
        Value cl = kb.select(inRange, col, c0);
        Value query = spec.keyMajor ? cl : row;
        Value key = spec.keyMajor ? row : cl;
        Value keep = flashKeyKept(
            kb, spec, inRange,
            [&] {
              if (!logit.keyMask)
                return Value();
              return spec.keyMajor ? rowIsKey : kb.load(logit.keyMask, {b, cl});
            },
            [&] { return kb.cmpi(arith::CmpIPredicate::ule, key, query); });
        Value l = spec.keyMajor ? kb.load(lse, {b, cl}) : rowLse;
        Value d = spec.keyMajor ? kb.load(delta, {b, cl}) : rowDelta;
        // The forward kernel's logit (MoE/Kernels/FlashLogit.h); a pair whose
        // added score is -inf is excluded.
        Value score;
        Value x = flashScaledLogit(
            kb, spec, sDots[c],
            [&] {
              return kb.load(logit.bias, {b, key});
            },
            [&] {
              score = kb.loadF(logit.add, {kb.add(scoreRow0, query), key});
              return score;
            });
        if (score)
          keep = kb.andI(keep, kb.cmpf(arith::CmpFPredicate::UNE, score, negInf));
        SoftmaxGrad sg =
            softmaxGradFromLogSumExp(kb, x, l, gDots[c], [&] { return d; });
        Value s = sg.prob, dz = sg.dlogit;
        Value dx = kb.fdiv(dz, kb.cF32(spec.scaleDiv));
        kb.store(kb.select(keep, s, excludedMark), ss, {t.row, jj});
        kb.store(kb.select(keep, dx, zero), dxs, {t.row, jj});
        if (dzOut)
          kb.ifThen(kb.andI(active, inRange), [&] {
            // Named first: argument evaluation order is unspecified, and the
            // IR must not depend on the host compiler.
            Value row = kb.add(scoreRow0, query);
            Value v = kb.select(keep, dz, zero);
            kb.store(v, dzOut, {row, key});
          });
      }

      Value first = kb.eq(j0, colBegin);
      FlashGradSums sums{kb,           t,    b,  row, active, C,    ss, cs,
                         excludedMark, zero, c0, c1,  j0,     first};
      for (auto [acc, outs] : llvm::zip(spec.accumulators, accs)) {
        auto [values, out] = outs;
        Value weights = acc.byDx ? dxs : ss;
        if (acc.ones)
          sums.rowSum(acc, weights, out);
        else
          sums.valueSums(acc, weights, values, out);
      }
    });
  }
  GpuKernelBuilder &kb = host.kb;
  Value rows = kb.dim(args[0], 1);
  kernel.launch(
      {kb.ceilDiv(rows, kb.idx(kFlashRows)), kb.dim(args[0], 0), kb.idx(1)});
}

void mlir::moe::gpu_lowering::launchFlashGradStats(HostCode &host, Value lse,
                                                   Value p, Value dp,
                                                   Value delta, Location loc,
                                                   Value lseOut, Value skip,
                                                   Value dpRounded) {
  const int64_t threads = 128;
  SmallVector<Value> operands = {lse, p, dp, delta, lseOut ? lseOut : lse};
  if (skip)
    operands.push_back(skip);
  if (dpRounded)
    operands.push_back(dpRounded);
  GPUKernel kernel(host, "flash_grad_stats", operands, {}, {threads, 1, 1},
                   loc);
  {
    GpuKernelBuilder &kb = kernel.kb;
    Value l = kernel.arg(0), pv = kernel.arg(1), g = kernel.arg(2),
          dl = kernel.arg(3), lOut = kernel.arg(4);
    // dp rounded to the type of `dpRounded`, when given, is written there.
    Value dpOut = dpRounded ? kernel.arg(skip ? 6 : 5) : Value();
    Type roundDp =
        dpOut ? cast<MemRefType>(dpOut.getType()).getElementType() : Type();
    Value N = kb.dim(pv, 1);
    Value i = kernel.globalId();
    Value b = kb.blockId(gpu::Dimension::y);
    kb.ifThen(kb.lt(i, N), [&] {
      Value x = kb.load(l, {b, i});
      Value none = kb.cmpf(arith::CmpFPredicate::OEQ, x, kb.negInfLike(kb.f32()));
      if (skip) {
        // (Operands named first: the order of a call's arguments differs
        // between compilers, and with it the order of the emitted ops.)
        Value flag = kb.load(kernel.arg(5), {b});
        Value zero = kb.cI32(0);
        none = kb.orI(none, kb.cmpi(arith::CmpIPredicate::ne, flag, zero));
      }
      kb.store(
          kb.select(none, kb.cF32(std::numeric_limits<double>::infinity()), x),
          lOut, {b, i});
      Value dot =
          kb.forLoop(kb.idx(0), kb.dim(pv, 2), kb.idx(1), {kb.cF32(0.0)},
                    [&](Value c, ValueRange acc) -> SmallVector<Value> {
                      Value pc = kb.load(pv, {b, i, c});
                      Value gc = kb.load(g, {b, i, c});
                      if (roundDp) {
                        Value r =
                            arith::TruncFOp::create(kernel.b, roundDp, gc);
                        kb.store(r, dpOut, {b, i, c});
                        gc = arith::ExtFOp::create(kernel.b, kb.f32(), r);
                      }
                      return {kb.fadd(acc[0], kb.fmul(gc, pc))};
                    })[0];
      kb.store(dot, dl, {b, i});
      // The rounded dp's padding columns: zeros.
      if (dpOut)
        kb.forLoop(kb.dim(pv, 2), kb.dim(dpOut, 2), kb.idx(1), [&](Value c) {
          kb.store(kb.constLike(roundDp, 0.0), dpOut, {b, i, c});
        });
    });
  }
  GpuKernelBuilder &kb = host.kb;
  kernel.launch(
      {kb.ceilDiv(kb.dim(p, 1), kb.idx(threads)), kb.dim(p, 0), kb.idx(1)});
}
