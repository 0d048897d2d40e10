//===- FlashTf32.cpp - The f32 flash mixing kernel on tensor cores --------===//
//
// Part of the MoE-MLIR project.
//
// similarity_inform (and its training forward) with f32 operands on the
// tensor cores (flash-mma-tf32), at f32's accuracy by 3xTF32 (CUTLASS's
// "fast accurate" f32 GEMM): each f32 operand x is split into big =
// x with its low 13 mantissa bits cleared (exact in tf32) and small = x -
// big (exact in f32; the MMA reads its top 10 mantissa bits), and a
// product is big·big' + big·small' + small·big' on mma.sync m16n8k8 tf32 with
// f32 sums (small·small' and the truncations: about 2^-20 of |x x'|, against
// f32's 2^-24 a rounding). FlashAttention-2's structure, as FlashMma.cpp's
// one-row-tile kernel:
//
//  * a block of 4 warps owns 64 query rows, a warp 16; a thread holds its
//    rows' query fragments (big and small) in registers for the whole
//    kernel, loaded once;
//  * key tiles of 64 keys (32 where 64 would not fit the static shared
//    memory) and their values staged in shared memory as f32 (16 bytes a
//    thread and load where aligned), rows padded by 4 floats: the B
//    fragments' lanes (key g, feature t) fall in distinct banks; masked and
//    padding keys are zeros;
//  * S = Q Kᵀ: per 8 features and 8 keys two 32-bit loads, their split and 3
//    MMAs; the online softmax on the C fragments (a row's values over the 4
//    lanes of a quad: its max by two shuffles, its sum a lane's own until the
//    end);
//  * P·e on the same MMAs: the C fragment of S is the A fragment of P·e once
//    the 8 keys of a block are taken in the order 0, 2, 4, 6, 1, 3, 5, 7
//    (C holds keys 2t and 2t + 1 of row g where A wants k = t and t + 4), so
//    the values' B operand reads keys 2t and 2t + 1: no trip through memory.
//
// About 30 instructions a score at D = 64, K = 16 (the 3 MMAs, the loads and
// splits of a 8x8 block of keys: 18; P·e's 7; the softmax's 5), against the
// scalar kernel's ~275 (FlashMix.cpp). As the bf16 kernel, a
// non-finite value of a key that the causal mask hides from some rows of the
// diagonal tile reaches those rows (0 · inf), and a non-finite value gives
// NaN where it enters (its split: inf - inf); masked keys and padding cannot.
//
//===----------------------------------------------------------------------===//

#include "F32Staging.h"
#include "FlashTile.h"
#include "HostCode.h"
#include "Lowerings.h"
#include "Atoms.h"
#include "MmaFragments.h"
#include "Reductions.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

/// Floats of padding a value row (the B fragments' lanes (key 2t, expert g)
/// in distinct banks).
static constexpr int64_t kPad = 4;

/// The key rows' stride: a multiple of 8 floats that is 8 mod 32, so that
/// the B fragments' 8-byte loads (key g, features 2t and 2t + 1) of a
/// half-warp fall in distinct banks.
static int64_t keyStride(int64_t depth) {
  return depth + ((8 - depth) % 32 + 32) % 32;
}
/// The largest feature count: the query's fragments, big and small, take
/// D registers.
static constexpr int64_t kMaxDepth = 64;
/// The largest expert count: a warp's P·e accumulators, K/2 a lane for its
/// 16 rows, stay in registers beside the query's.
static constexpr int64_t kMaxExperts = 64;

/// The tiles, big and small halves of the keys and the values.
static int64_t tf32Bytes(int64_t cols, int64_t depth, int64_t experts) {
  return 2 * cols * (keyStride(depth) + experts + kPad) * 4;
}

std::optional<FlashTf32Tile>
mlir::moe::gpu_lowering::flashTf32Tile(const FlashMixSpec &spec, Type qElt,
                                       Type keyElt, Type eElt, int64_t depth,
                                       const ConvertMoEToGPUOptions &options) {
  if (!options.flashMmaTf32 || !qElt.isF32() || !keyElt.isF32() ||
      !eElt.isF32())
    return std::nullopt;
  if (spec.topk || spec.hasBias || spec.hasAddScores)
    return std::nullopt;
  if (ShapedType::isDynamic(depth) || depth < 1 || depth > kMaxDepth ||
      spec.numExperts < 1 || spec.numExperts > kMaxExperts)
    return std::nullopt;
  FlashTf32Tile tile;
  tile.depth = llvm::alignTo(depth, 8);
  tile.experts = llvm::alignTo(spec.numExperts, 8);
  for (int64_t cols : {64, 32}) {
    if (tf32Bytes(cols, tile.depth, tile.experts) > options.sharedMemoryBytes)
      continue;
    tile.cols = cols;
    return tile;
  }
  return std::nullopt;
}

namespace {
/// A tf32 operand's two halves as the MMA takes them (32-bit registers).
struct Split {
  Value big, small;
};

struct Tf32 {
  ImplicitLocOpBuilder &b;
  GpuKernelBuilder &kb;

  /// x = big + small: big is x with its low 13 mantissa bits cleared.
  Split split(Value x) {
    Type i32 = b.getI32Type();
    Value bits = kb.bitcast(x, i32);
    Value bigBits = kb.andI(bits, kb.cI32(static_cast<int32_t>(0xFFFFE000)));
    Value big = kb.bitcast(bigBits, kb.f32());
    return {bigBits, kb.bitcast(kb.fsub(x, big), i32)};
  }
  /// d = a · bfrag + c on one 16x8x8 tile (4 and 2 tf32 registers, 4 f32).
  SmallVector<Value> mma(ValueRange a, ValueRange bfrag, ValueRange c) {
    return mmaSyncF32(b, NVVM::MMATypes::tf32, {16, 8, 8}, a, bfrag, c);
  }
  /// c + a·b' at f32's accuracy: the small products first.
  SmallVector<Value> mma3(ArrayRef<Split> a, ArrayRef<Split> bfrag,
                          ArrayRef<Value> c) {
    SmallVector<Value> aBig, aSmall, bBig, bSmall;
    for (const Split &s : a) {
      aBig.push_back(s.big);
      aSmall.push_back(s.small);
    }
    for (const Split &s : bfrag) {
      bBig.push_back(s.big);
      bSmall.push_back(s.small);
    }
    SmallVector<Value> d = mma(aSmall, bBig, c);
    d = mma(aBig, bSmall, d);
    return mma(aBig, bBig, d);
  }
};
} // namespace

/// The epilogue of emitFlashTf32: each row's sum over its quad, then p =
/// O / l at the C fragments' columns (`lanes`: the lane's (t, g)) and the lse.
static void storeTf32Rows(GpuKernelBuilder &kb, LaneCoords &lanes,
                          ArrayRef<Value> fin, int64_t outBlocks, int64_t K,
                          ArrayRef<Value> rows, Value N, Value t, Value bi,
                          Value out, Value lseOut) {
  const TVLayout cLayout = atoms::mmaM16N8C();
  Value c0 = kb.idx(0);
  for (int64_t r = 0; r < 2; ++r) {
    Value row = rows[r];
    SoftmaxState state = {
        fin[outBlocks * 4 + 2 * r],
        subgroupReduce(kb, fin[outBlocks * 4 + 2 * r + 1], ReduceKind::Sum, 4)};
    Value active = kb.lt(row, N);
    if (lseOut)
      kb.ifThen(kb.andI(active, kb.eq(t, c0)), [&] {
        kb.store(softmaxLogSumExp(kb, state), lseOut, {bi, row});
      });
    kb.ifThen(active, [&] {
      for (int64_t ob = 0; ob < outBlocks; ++ob)
        for (int64_t i = 0; i < 2; ++i) {
          int64_t col0 = 8 * ob;
          Value col = fragmentTileIndex(kb, lanes, cLayout, 2 * r + i, col0,
                                        /*rows=*/false);
          Value v = softmaxNormalize(kb, state, fin[ob * 4 + 2 * r + i]);
          if (col0 + 8 <= K) {
            kb.store(v, out, {bi, row, col});
            continue;
          }
          kb.ifThen(kb.lt(col, kb.idx(K)), [&] {
            kb.store(v, out, {bi, row, col});
          });
        }
    });
  }
}

static void emitFlashTf32(GPUKernel &kernel, const FlashMixSpec &spec,
                          const FlashTf32Tile &tile) {
  const int64_t Dp = tile.depth, Kp = tile.experts, cols = tile.cols;
  const int64_t K = spec.numExperts;
  const int64_t keyBlocks = cols / 8, featSteps = Dp / 8, outBlocks = Kp / 8;
  GpuKernelBuilder &kb = kernel.kb;
  ImplicitLocOpBuilder &ib = kernel.b;
  Tf32 tc{ib, kb};
  Exp2SoftmaxBuilder exp2(ib);
  FlashMixArgs args(kernel, spec);
  Value q = args.q, keys = args.keys, e = args.e;
  const FlashLogitArgs &logit = args.logit;
  Value out = args.outs.out, lseOut = args.outs.lse;
  Value kBig = kernel.workgroup(0), kSmall = kernel.workgroup(1),
        vBig = kernel.workgroup(2), vSmall = kernel.workgroup(3);

  Value zero = kb.cF32(0.0);
  Value c0 = kb.idx(0);
  Type i32 = ib.getI32Type();
  Value tid = kb.threadId();
  Value warp = kb.divu(tid, kb.idx(kWarp));
  Value lane = kb.remu(tid, kb.idx(kWarp));
  Value g = kb.divu(lane, kb.idx(4)), t = kb.remu(lane, kb.idx(4));
  // The atoms' fragments, k in pair order (features or keys 2t and 2t + 1):
  // the keys' B values of a lane are one 8-byte load, and the C fragment of
  // S is the A operand of P·e.
  const TVLayout aLayout = atoms::mmaM16N8K8Tf32APairedK(),
                 bLayout = atoms::mmaM16N8K8Tf32BPairedK(),
                 cLayout = atoms::mmaM16N8C();
  LaneCoords lanes(kb, cLayout.map.mode(0).shape(), ArrayRef<Value>{t, g});
  FlashBlockPlace place = flashBlockPlace(
      kb, flashBlockOrder(spec.causal, spec.balanceCausal, /*byKey=*/false));
  Value bi = place.batchOf(kb);
  Value rowBase = kb.mul(place.tileOf(kb), kb.idx(kMmaRows));
  Value N = kb.dim(q, 1), D = kb.dim(q, 2), Nk = kb.dim(keys, 1);
  Value rowA = kb.add(kb.add(rowBase, kb.mul(warp, kb.idx(16))), g);
  Value rowB = kb.add(rowA, kb.idx(8));
  Value rows[2] = {rowA, rowB};

  // The query's A fragments of each 8 features, big and small; zeros past
  // N and D.
  SmallVector<SmallVector<Split>> qf(featSteps);
  for (int64_t s = 0; s < featSteps; ++s)
    for (int64_t r = 0; r < 4; ++r) {
      Value row = rows[r % 2];
      Value col =
          fragmentTileIndex(kb, lanes, aLayout, r, 8 * s, /*rows=*/false);
      Value ok = kb.andI(kb.lt(row, N), kb.lt(col, D));
      Value x =
          kb.loadF(q, {bi, kb.select(ok, row, c0), kb.select(ok, col, c0)});
      qf[s].push_back(tc.split(kb.select(ok, x, zero)));
    }

  Value keyEnd = Nk;
  if (spec.causal)
    keyEnd = kb.minu(Nk, kb.add(rowBase, kb.idx(kMmaRows)));
  Value vectors;
  {
    Value kAligned = f32StagedAligned(kb, ib, keys, D);
    vectors = kb.andI(kAligned, f32StagedAligned(kb, ib, e, kb.idx(K)));
  }
  F32Stage stage{kb, ib, tid, kMmaThreads, bi};
  // The tiles staged split: big and small halves into their own tiles, once
  // a block (not by each warp at each use).
  auto splitInto = [&](Value bigTile, Value smallTile) {
    return [&, bigTile, smallTile](Value x, Value r, Value c) {
      auto vec = dyn_cast<VectorType>(x.getType());
      if (!vec) {
        Split h = tc.split(x);
        kb.store(kb.bitcast(h.big, kb.f32()), bigTile, {r, c});
        kb.store(kb.bitcast(h.small, kb.f32()), smallTile, {r, c});
        return;
      }
      SmallVector<Value> bigs, smalls;
      for (int64_t i = 0; i < vec.getNumElements(); ++i) {
        Split h = tc.split(vector::ExtractOp::create(ib, x, i));
        bigs.push_back(kb.bitcast(h.big, kb.f32()));
        smalls.push_back(kb.bitcast(h.small, kb.f32()));
      }
      for (auto [tileBuf, parts] :
           {std::pair(bigTile, &bigs), std::pair(smallTile, &smalls)})
        vector::StoreOp::create(
            ib, vector::FromElementsOp::create(ib, vec, *parts), tileBuf,
            ValueRange{r, c}, /*nontemporal=*/false, llvm::MaybeAlign(16));
    };
  };
  auto putKeys = splitInto(kBig, kSmall);
  auto putValues = splitInto(vBig, vSmall);
  auto maskRow = [&](Value key) { return kb.load(logit.keyMask, {bi, key}); };

  SoftmaxState start = softmaxStart(kb);
  SmallVector<Value> init(outBlocks * 4, zero);
  for (int64_t r = 0; r < 2; ++r) {
    init.push_back(start.max);
    init.push_back(start.sum);
  }
  SmallVector<Value> fin = kb.forLoop(
      c0, keyEnd, kb.idx(cols), init,
      [&](Value j0, ValueRange carried) -> SmallVector<Value> {
        kb.barrier();
        auto stageTiles = [&](bool byVectors) {
          stage(keys, kBig, cols, Dp, j0, Nk, c0, D, byVectors, nullptr,
                putKeys);
          stage(e, vBig, cols, Kp, j0, Nk, c0, kb.idx(K), byVectors,
                logit.keyMask ? function_ref<Value(Value)>(maskRow) : nullptr,
                putValues);
        };
        kb.ifThenElse(
            vectors, [&] { stageTiles(true); }, [&] { stageTiles(false); });
        kb.barrier();

        // S = Q Kᵀ over the tile's key blocks: B (k x n) is (feature, key).
        SmallVector<SmallVector<Value>> S(keyBlocks,
                                          SmallVector<Value>(4, zero));
        for (int64_t s = 0; s < featSteps; ++s)
          for (int64_t nb = 0; nb < keyBlocks; ++nb) {
            Value key =
                fragmentTileIndex(kb, lanes, bLayout, 0, 8 * nb, false);
            Value f0 = fragmentTileIndex(kb, lanes, bLayout, 0, 8 * s, true);
            auto pair = [&](Value tileBuf) {
              Value v = vector::LoadOp::create(
                  ib, VectorType::get({2}, kb.f32()), tileBuf,
                  ValueRange{key, f0}, /*nontemporal=*/false,
                  llvm::MaybeAlign(8));
              return std::pair(
                  kb.bitcast(vector::ExtractOp::create(ib, v, 0), i32),
                  kb.bitcast(vector::ExtractOp::create(ib, v, 1), i32));
            };
            auto [big0, big1] = pair(kBig);
            auto [small0, small1] = pair(kSmall);
            S[nb] = tc.mma3(qf[s], {{big0, small0}, {big1, small1}}, S[nb]);
          }

        // The logits (C fragment value i: row rows[i / 2]) and each row's
        // online softmax step.
        SmallVector<Value> logits[2];
        for (int64_t nb = 0; nb < keyBlocks; ++nb)
          for (int64_t i = 0; i < 4; ++i) {
            Value j = kb.add(j0, fragmentTileIndex(kb, lanes, cLayout, i,
                                                   8 * nb, /*rows=*/false));
            logits[i / 2].push_back(flashPairLogit(
                kb, spec, logit, S[nb][i], bi, Value(), rows[i / 2], j, Nk));
          }
        SoftmaxTile steps[2];
        for (int64_t r = 0; r < 2; ++r)
          steps[r] = onlineSoftmaxStep(exp2,
                                       {carried[outBlocks * 4 + 2 * r],
                                        carried[outBlocks * 4 + 2 * r + 1]},
                                       logits[r], [&](Value v) {
                                         return subgroupReduce(
                                             kb, v, ReduceKind::Max, 4);
                                       });
        SmallVector<SmallVector<Value>> O(outBlocks);
        for (int64_t ob = 0; ob < outBlocks; ++ob)
          for (int64_t i = 0; i < 4; ++i)
            O[ob].push_back(kb.fmul(carried[ob * 4 + i], steps[i / 2].rescale));

        // P·e: the key block's probabilities (C value u: row u / 2) as the
        // A operand, the values' B (k x n) is (key, expert).
        for (int64_t nb = 0; nb < keyBlocks; ++nb) {
          SmallVector<Split> pf;
          for (int64_t v = 0; v < 4; ++v) {
            int64_t u = sameElementValue(aLayout, v, cLayout);
            pf.push_back(tc.split(steps[u / 2].probs[2 * nb + u % 2]));
          }
          Value key0 = fragmentTileIndex(kb, lanes, bLayout, 0, 8 * nb, true);
          Value key1 = fragmentTileIndex(kb, lanes, bLayout, 1, 8 * nb, true);
          for (int64_t ob = 0; ob < outBlocks; ++ob) {
            Value col =
                fragmentTileIndex(kb, lanes, bLayout, 0, 8 * ob, false);
            auto half = [&](Value tileBuf, Value key) {
              return kb.bitcast(kb.load(tileBuf, {key, col}), i32);
            };
            Split b0 = {half(vBig, key0), half(vSmall, key0)};
            Split b1 = {half(vBig, key1), half(vSmall, key1)};
            O[ob] = tc.mma3(pf, {b0, b1}, O[ob]);
          }
        }
        SmallVector<Value> next;
        for (int64_t ob = 0; ob < outBlocks; ++ob)
          next.append(O[ob]);
        for (int64_t r = 0; r < 2; ++r) {
          next.push_back(steps[r].next.max);
          next.push_back(steps[r].next.sum);
        }
        return next;
      });

  // The rows' sums over their quads, then p = O / l and the lse.
  storeTf32Rows(kb, lanes, fin, outBlocks, K, rows, N, t, bi, out, lseOut);
}

void mlir::moe::gpu_lowering::launchFlashTf32(HostCode &h, StringRef name,
                                              const FlashMixSpec &spec,
                                              const FlashTf32Tile &tile,
                                              Value q, ValueRange args,
                                              Location loc) {
  Type f32 = h.b.getF32Type();
  SmallVector<Type> workgroup = {
      workgroupMemRef({tile.cols, keyStride(tile.depth)}, f32), // keys: big
      workgroupMemRef({tile.cols, keyStride(tile.depth)}, f32), // small
      workgroupMemRef({tile.cols, tile.experts + kPad}, f32),   // values
      workgroupMemRef({tile.cols, tile.experts + kPad}, f32),
  };
  GPUKernel kernel(h, name, args, workgroup, {kMmaThreads, 1, 1}, loc);
  alignWorkgroupBuffers(kernel.func);
  // The query's fragments (2 x D registers), the logits (4 a key block) and
  // the accumulators (4 an expert block) beside the loads and splits: 3
  // blocks (168 registers; 12 warps a multiprocessor) up to 16 experts (D =
  // 64, K = 16: 166, no spill; 176 and 2 blocks without the bound on
  // sm_90), else what 2 leave (255).
  kernel.func->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                       kernel.b.getI32IntegerAttr(tile.experts <= 16 ? 3 : 2));
  emitFlashTf32(kernel, spec, tile);
  GpuKernelBuilder &kb = h.kb;
  Value grid = kb.ceilDiv(kb.dim(q, 1), kb.idx(kMmaRows));
  kernel.launch({grid, kb.dim(q, 0), kb.idx(1)});
}
