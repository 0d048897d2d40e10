//===- FlashMixWide.cpp - The f32 flash mixing kernel, wide form ----------===//
//
// Part of the MoE-MLIR project.
//
// The wide form of the flash mixing kernel (launchFlashMix, FlashMix.cpp;
// flash-mix-wide) for the operands the tensor-core kernel does not take: f32
// (and ws's f32 q, mixed types), K <= kFlashWideMaxExperts. FlashMix.cpp's
// form spends ~275 SASS instructions a score at D = 64 (a scalar shared load
// a multiply-add, the query chunk and the probabilities through shared memory
// every 32 keys, a 4-key tile softmax over 8 lanes with its shuffles, the
// P·e products a lane's 2 columns over all 32 keys behind a barrier): on the
// H200 0.47x inductor at N = 16384 (f32, 2026-11-26). Here, for the same
// block of 16 rows and 8 lanes a row:
//
//  * key tiles of 64 keys, a lane keys c * 8 + lane (c < 8) of its row;
//  * the dot products over 32-feature chunks staged in shared memory (16
//    bytes a thread and load where the operand is f32 and aligned), read 16
//    bytes at a time (ld.shared.v4: the row's 4 features once, then each
//    key's 4: 9 loads a 32 multiply-adds, rows padded by 4 floats so that the
//    8 lanes' keys fall in distinct banks);
//  * each lane keeps its own online softmax state (m, l) over its keys and
//    all K partial sums Σ p e[j, :] of its keys (MoE/Kernels/OnlineSoftmax.h
//    over the lane's 8 logits, no reduction in the key loop): no shuffle, no
//    probability tile, one barrier pair a chunk;
//  * at the end the 8 states are merged (FlashAttention's split-KV combine
//    over lanes: the row max, each lane's sums scaled by exp(m - max)) and
//    the K sums reduce-scattered over the 8 lanes (halving: K/2 + K/4 + K/8
//    shuffles) to FlashMix.cpp's layout, column m * 8 + lane, for the shared
//    epilogue (emitFlashMixEpilogue: the normalization, the lse, p or the
//    fused top-k).
//
// About 105 instructions a score at D = 64, K = 16 (80 FFMA, 22 LDS.128 and
// the softmax, in base 2 on the SFU: Exp2SoftmaxBuilder). Excluded keys add
// nothing, as in FlashMix.cpp: a masked or padding key's e row is staged as
// zeros (its p is 0), and where a key can be excluded for some rows only (the
// causal diagonal tile, a bias or added scores) a lane skips it; a non-finite e
// of an excluded key reaches no row. The sums are in another order than
// FlashMix.cpp's (a lane's keys, then the lanes): the same results to f32
// rounding.
//
//===----------------------------------------------------------------------===//

#include "F32Staging.h"
#include "FlashTile.h"
#include "HostCode.h"
#include "Lowerings.h"
#include "Reductions.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

static constexpr int64_t kRows = kFlashRows;
static constexpr int64_t kGroup = kFlashGroup;
/// Keys a tile, and a lane's share of them.
static constexpr int64_t kCols = 64;
static constexpr int64_t kKeysPerLane = kCols / kGroup;
/// Features a staged chunk.
static constexpr int64_t kChunk = 32;
/// Floats of padding a shared row: 16 bytes keep the rows' 16-byte alignment
/// and put row r + 1 four banks after row r (the 8 lanes' keys in distinct
/// banks for ld.shared.v4).
static constexpr int64_t kPad = 4;
static constexpr int64_t kVec = kF32Vec;

static int64_t paddedExperts(const FlashMixSpec &spec) {
  return llvm::alignTo(spec.numExperts, kGroup);
}

bool mlir::moe::gpu_lowering::flashMixWideApplies(const FlashMixSpec &spec) {
  return spec.wide && !spec.gated && spec.numExperts >= 1 &&
         spec.numExperts <= kFlashWideMaxExperts;
}

/// ptxas takes the registers a block count leaves it (the P·e loads of the
/// lane's 8 keys hoisted ahead of their multiply-adds: K = 8 at 122 of 128).
/// 3 blocks (168 registers) up to 32 experts, else 2 (K = 64 spilled 160
/// bytes at 168; 203-210 at 2): at 4 (128) K = 16 spilled 4 bytes where
/// lowered for sm_80 and assembled for sm_90 (D = 72), K = 24 4 bytes. A
/// causal mask, a key mask, the lse, the fused top-k or attention_posterior's
/// terms take 3 up to 16 experts only: at 168 K = 24 with a mask and the lse
/// spilled 32-40 bytes (sm_80 and sm_90, D = 40).
int64_t mlir::moe::gpu_lowering::flashMixWideBlocks(const FlashMixSpec &spec) {
  const int64_t Kp = paddedExperts(spec);
  const bool plain = !spec.causal && !spec.hasKeyMask && !spec.hasBias &&
                     !spec.hasAddScores && !spec.topk && !spec.withLse;
  return Kp <= (plain ? 32 : 16) ? 3 : 2;
}

SmallVector<Type>
mlir::moe::gpu_lowering::flashMixWideWorkgroup(MLIRContext *ctx,
                                               const FlashMixSpec &spec) {
  Type f32 = Float32Type::get(ctx);
  return {
      workgroupMemRef({kRows, kChunk + kPad}, f32),              // queries
      workgroupMemRef({kCols, kChunk + kPad}, f32),              // keys
      workgroupMemRef({kCols, paddedExperts(spec) + kPad}, f32), // values
  };
}

/// The K sums of a row spread over its kGroup lanes, each lane all K
/// (accs[j], column j), reduced and scattered: lane l ends with column
/// m * kGroup + l of the row's sums in element m. Halving by butterflies: at
/// distance d (4, 2, 1) a lane keeps the columns whose bit d matches its own
/// and adds its partner's of them.
static SmallVector<Value> reduceScatter(GpuKernelBuilder &kb, Value lane,
                                        ArrayRef<Value> accs) {
  const int64_t per = accs.size() / kGroup;
  // held[m][p]: column m * kGroup + p + (the lane's bits above the step's).
  SmallVector<SmallVector<Value>> held(per);
  for (int64_t m = 0; m < per; ++m)
    held[m].assign(accs.begin() + m * kGroup, accs.begin() + (m + 1) * kGroup);
  for (int64_t d = kGroup / 2; d >= 1; d /= 2) {
    Value upper =
        kb.cmpi(arith::CmpIPredicate::ne, kb.andI(lane, kb.idx(d)), kb.idx(0));
    for (int64_t m = 0; m < per; ++m) {
      SmallVector<Value> next;
      for (int64_t p = 0; p < d; ++p) {
        Value low = held[m][p], high = held[m][p + d];
        Value send = kb.select(upper, low, high);
        Value keep = kb.select(upper, high, low);
        next.push_back(kb.fadd(keep, kb.shuffleXor(send, d)));
      }
      held[m] = std::move(next);
    }
  }
  SmallVector<Value> out;
  for (int64_t m = 0; m < per; ++m)
    out.push_back(held[m][0]);
  return out;
}

void mlir::moe::gpu_lowering::emitFlashMixWide(GPUKernel &kernel,
                                               const FlashMixSpec &spec) {
  const int64_t K = spec.numExperts;
  const int64_t Kp = paddedExperts(spec);
  GpuKernelBuilder &kb = kernel.kb;
  ImplicitLocOpBuilder &ib = kernel.b;
  Exp2SoftmaxBuilder exp2(ib);
  FlashMixArgs args(kernel, spec);
  Value q = args.q, keys = args.keys, e = args.e;
  const FlashLogitArgs &logit = args.logit;
  Value qs = kernel.workgroup(0), ks = kernel.workgroup(1),
        es = kernel.workgroup(2);

  Value zero = kb.cF32(0.0);
  Value negInf = kb.cF32(-std::numeric_limits<double>::infinity());
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  FlashMixRows rows(kb, spec, args);
  const FlashTile &tile = rows.tile;
  Value tid = tile.t.tid, r = tile.t.row, lane = tile.t.lane;
  Value b = tile.b, rowBase = tile.rowBase;
  Value N = rows.N, D = rows.D, Nk = rows.Nk, h = rows.head;
  Value i = tile.i, active = tile.active, row = tile.row;
  Value width = kb.idx(K);
  // The staging's 16-byte path where all three operands take it.
  auto isF32 = [](Value v) {
    return cast<MemRefType>(v.getType()).getElementType().isF32();
  };
  Value allAligned;
  if (isF32(q) && isF32(keys) && isF32(e)) {
    Value qAligned = f32StagedAligned(kb, ib, q, D);
    Value kAligned = f32StagedAligned(kb, ib, keys, D);
    allAligned = kb.andI(kb.andI(qAligned, kAligned),
                         f32StagedAligned(kb, ib, e, width));
  }
  // At least one chunk: the values are staged with the first (D = 0 at run
  // time still stages them).
  Value chunkEnd = kb.maxs(D, c1);
  F32Stage stage{kb, ib, tid, kFlashThreads, b};

  Value keyEnd = rows.keyEnd;
  VectorType v4 = VectorType::get({kVec}, kb.f32());
  auto load4 = [&](Value tileBuf, Value rr, Value cc) {
    return vector::LoadOp::create(ib, v4, tileBuf, ValueRange{rr, cc},
                                  /*nontemporal=*/false, llvm::MaybeAlign(16))
        .getResult();
  };
  auto element = [&](Value v, int64_t x) {
    return vector::ExtractOp::create(ib, v, x).getResult();
  };

  SoftmaxState start = softmaxStart(kb);
  SmallVector<Value> init(Kp, zero);
  init.push_back(start.max);
  init.push_back(start.sum);
  // Both stagings inside the one key loop, chosen a chunk by the (uniform)
  // alignment: two key loops, one a staging, doubled the kernel and left
  // ptxas short of registers in the element one (4 bytes spilled at 168,
  // D = 72, K = 16 lowered for sm_80).
  auto stageChunk = [&](Value d0, Value j0, bool vectors) {
    stage(q, qs, kRows, kChunk, rowBase, N, d0, D, vectors);
    stage(keys, ks, kCols, kChunk, j0, Nk, d0, D, vectors);
    // The value tile with the first chunk (its buffer's readers, the
    // previous tile's P·e, are past this barrier). A masked key's row is
    // zeros: its p is 0 and no non-finite e enters.
    kb.ifThen(kb.eq(d0, c0), [&] {
      stage(e, es, kCols, Kp, j0, Nk, c0, width, vectors,
            logit.keyMask ? function_ref<Value(Value)>([&](Value key) {
              return kb.load(logit.keyMask, {b, key});
            })
                          : nullptr);
    });
  };
  auto keyLoop = [&]() {
    return kb.forLoop(
        c0, keyEnd, kb.idx(kCols), init,
        [&](Value j0, ValueRange carried) -> SmallVector<Value> {
          // Dot products of this lane's keys j0 + c * 8 + lane, c < 8.
          SmallVector<Value> dots = kb.forLoop(
              c0, chunkEnd, kb.idx(kChunk),
              SmallVector<Value>(kKeysPerLane, zero),
              [&](Value d0, ValueRange acc) -> SmallVector<Value> {
                kb.barrier();
                if (allAligned)
                  kb.ifThenElse(
                      allAligned, [&] { stageChunk(d0, j0, true); },
                      [&] { stageChunk(d0, j0, false); });
                else
                  stageChunk(d0, j0, false);
                kb.barrier();
                SmallVector<Value> next(acc.begin(), acc.end());
                for (int64_t dd = 0; dd < kChunk; dd += kVec) {
                  Value qv = load4(qs, r, kb.idx(dd));
                  for (int64_t c = 0; c < kKeysPerLane; ++c) {
                    Value kv =
                        load4(ks, kb.add(kb.idx(c * kGroup), lane), kb.idx(dd));
                    for (int64_t x = 0; x < kVec; ++x)
                      next[c] = kb.fma(element(qv, x), element(kv, x), next[c]);
                  }
                }
                return next;
              });

          // Logits with masks, then this lane's online softmax step.
          SmallVector<Value> logits;
          for (int64_t c = 0; c < kKeysPerLane; ++c) {
            Value j = kb.add(j0, kb.add(kb.idx(c * kGroup), lane));
            logits.push_back(
                flashPairLogit(kb, spec, logit, dots[c], b, h, row, j, Nk));
          }
          SoftmaxTile step =
              onlineSoftmaxStep(exp2, {carried[Kp], carried[Kp + 1]}, logits);
          SmallVector<Value> acc;
          for (int64_t m = 0; m < Kp; ++m)
            acc.push_back(kb.fmul(carried[m], step.rescale));

          // Σ p e[j, :] over the lane's keys, e's rows 16 bytes at a time.
          auto addKey = [&](int64_t c, ArrayRef<Value> sums) {
            SmallVector<Value> next(sums);
            Value jj = kb.add(kb.idx(c * kGroup), lane);
            for (int64_t m = 0; m < Kp; m += kVec) {
              Value ev = load4(es, jj, kb.idx(m));
              for (int64_t x = 0; x < kVec; ++x)
                next[m + x] =
                    kb.fma(step.probs[c], element(ev, x), next[m + x]);
            }
            return next;
          };
          auto plain = [&]() -> SmallVector<Value> {
            SmallVector<Value> sums(acc);
            for (int64_t c = 0; c < kKeysPerLane; ++c)
              sums = addKey(c, sums);
            return sums;
          };
          // A key excluded for this row but not for others (causal, a bias or
          // added scores of -inf) is skipped, not added as 0 · e.
          auto checked = [&]() -> SmallVector<Value> {
            SmallVector<Value> sums(acc);
            SmallVector<Type> types(Kp, kb.f32());
            for (int64_t c = 0; c < kKeysPerLane; ++c) {
              Value excluded =
                  kb.cmpf(arith::CmpFPredicate::OEQ, logits[c], negInf);
              sums = kb.ifElse(
                  excluded, types, [&] { return sums; },
                  [&] { return addKey(c, sums); });
            }
            return sums;
          };
          SmallVector<Type> accTypes(Kp, kb.f32());
          if (spec.hasBias || spec.hasAddScores)
            acc = checked();
          else if (spec.causal)
            // Only the tile reaching past the block's first row has keys
            // after some of its rows (uniform over the block).
            acc = kb.ifElse(kb.lt(rowBase, kb.add(j0, kb.idx(kCols))), accTypes,
                            checked, plain);
          else
            acc = plain();
          acc.push_back(step.next.max);
          acc.push_back(step.next.sum);
          return acc;
        });
  };
  SmallVector<Value> fin = keyLoop();

  // Merge the row's 8 lane states: the row max, each lane's sums scaled by
  // exp(m - max) (0 for a lane without keys; no shift where the row has
  // none), then the sums over the lanes.
  Value laneMax = fin[Kp], laneSum = fin[Kp + 1];
  Value rowMax = subgroupReduce(kb, laneMax, ReduceKind::Max, kGroup);
  Value none = kb.cmpf(arith::CmpFPredicate::OEQ, rowMax, negInf);
  Value scale =
      exp2.softmaxWeight(kb.fsub(laneMax, kb.select(none, zero, rowMax)));
  Value rowSum =
      subgroupReduce(kb, kb.fmul(laneSum, scale), ReduceKind::Sum, kGroup);
  SmallVector<Value> scaled;
  for (int64_t m = 0; m < Kp; ++m)
    scaled.push_back(kb.fmul(fin[m], scale));
  SmallVector<Value> accs = reduceScatter(kb, lane, scaled);
  emitFlashMixEpilogue(kernel, spec, args.outs, {rowMax, rowSum}, accs, b, N, i,
                       row, active, lane);
}
