//===- FlashMma.cpp - The flash mixing kernel on tensor cores -------------===//
//
// Part of the MoE-MLIR project.
//
// The tensor-core form of the flash mixing kernel (launchFlashMix,
// FlashMix.cpp) for f16 and bf16 operands: the two products of each
// key tile, the logits Q·Kᵀ and the mixing P·E, run on warp-level MMA
// (mma.sync m16n8k16, f32 accumulation), FlashAttention-2 style:
//
//  * a block of 4 warps owns 64 query rows, a warp 16 of them; a thread holds
//    its rows' query fragments (the A operand of Q·Kᵀ) in registers for the
//    whole kernel, loaded once from global memory;
//  * key tiles of `cols` keys (64, or 32 / 16 when the tiles would not fit the
//    shared memory) are staged in workgroup memory: keys [cols x D] and
//    values e [cols x K], rows padded by 8 elements (16 bytes: ldmatrix's
//    row addresses then fall in distinct banks); keys past Nk, masked keys
//    and features past D or experts past K are zeros;
//  * the B operands come from workgroup memory through ldmatrix (x4: two
//    8-wide blocks at a time; the values' with .trans), the logits' C
//    fragments become the mixing's A fragments in registers (no trip through
//    memory);
//  * the online softmax (MoE/Kernels/OnlineSoftmax.h) runs in f32 on the C
//    fragments: a row's 16 values of a tile are spread over the 4 lanes of a
//    quad, so the tile max and sum are 4-lane reductions;
//  * f16: nvgpu.ldmatrix + nvgpu.mma.sync; bf16: nvgpu.ldmatrix and
//    nvvm.mma.sync on the bitcast 32-bit registers (MLIR 22's NVGPU-to-NVVM
//    conversion does not map bf16 mma.sync).
//
// The probabilities enter the second product rounded to the operand type
// (f16/bf16), as in FlashAttention; the sums are f32. One difference from the
// scalar kernel remains: a non-finite e value of a key that causal masking
// hides from some of the tile's rows (the diagonal tiles) reaches those rows
// (0 · inf = NaN), where the scalar kernel skips the key. Masked keys and
// padding are zeros in the staged tile and cannot. The lowering uses this
// kernel only with the flash-mma option (off by default until a GPU run has
// checked it).
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"
#include "Lowerings.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

static constexpr int64_t kWarps = 4;
static constexpr int64_t kRows = 16 * kWarps;
static constexpr int64_t kThreads = kWarp * kWarps;
/// Elements of padding per workgroup row (16 bytes).
static constexpr int64_t kPad = 8;

std::optional<FlashMmaTile>
mlir::moe::gpu_lowering::flashMmaTile(const FlashMixSpec &spec, Type qElt,
                                      Type keyElt, Type eElt, int64_t depth,
                                      int64_t sharedMemoryBytes) {
  if (spec.topk || spec.hasBias || spec.hasAddScores)
    return std::nullopt;
  if (!(qElt.isF16() || qElt.isBF16()) || keyElt != qElt || eElt != qElt)
    return std::nullopt;
  if (ShapedType::isDynamic(depth) || depth < 1 || depth > kFlashMmaMaxDepth ||
      spec.numExperts < 1 || spec.numExperts > kFlashMaxExperts)
    return std::nullopt;
  FlashMmaTile tile;
  tile.depth = llvm::alignTo(depth, 16);
  tile.experts = llvm::alignTo(spec.numExperts, 8);
  for (int64_t cols : {64, 32, 16}) {
    int64_t bytes = cols * (tile.depth + kPad + tile.experts + kPad) * 2;
    if (bytes <= sharedMemoryBytes) {
      tile.cols = cols;
      // A thread's fragments (4 registers per 16x8 tile: the query's chunks,
      // the logits, the accumulator) plus about 40 of addresses and state.
      int64_t regs = 4 * (tile.depth / 16 + cols / 8 + tile.experts / 8) + 40;
      tile.blocksPerSM = regs <= 128 ? 4 : 2;
      return tile;
    }
  }
  return std::nullopt;
}

namespace {
/// The MMA helpers of one kernel on operands of `elt` (f16 or bf16).
struct Mma {
  ImplicitLocOpBuilder &b;
  GpuKernelBuilder &k;
  Type elt;

  VectorType vec(ArrayRef<int64_t> shape, Type t) {
    return VectorType::get(shape, t);
  }
  Value zeroElt() {
    return arith::ConstantOp::create(b, elt, b.getFloatAttr(elt, 0.0));
  }
  /// A fragment of `rows` registers of two elements, from scalars in order.
  Value fragment(ArrayRef<Value> elems) {
    return vector::FromElementsOp::create(
        b, vec({static_cast<int64_t>(elems.size() / 2), 2}, elt), elems);
  }
  /// Rows [first, first + count) of a [n x 2] fragment.
  Value rows(Value frag, int64_t first, int64_t count) {
    SmallVector<Value> elems;
    for (int64_t r = first; r < first + count; ++r)
      for (int64_t c = 0; c < 2; ++c)
        elems.push_back(vector::ExtractOp::create(b, frag, {r, c}));
    return fragment(elems);
  }
  Value ldmatrix(Value tile, Value row, Value col, int64_t tiles,
                 bool transpose) {
    return nvgpu::LdMatrixOp::create(b, vec({tiles, 2}, elt), tile,
                                     ValueRange{row, col}, transpose,
                                     static_cast<uint32_t>(tiles));
  }
  /// A 32-bit register of row `r` of a fragment (bf16: nvvm.mma.sync takes
  /// the packed pairs as i32).
  Value packed(Value frag, int64_t r) {
    Value pair = vector::ExtractOp::create(b, frag, ArrayRef<int64_t>{r});
    Value word =
        vector::BitCastOp::create(b, vec({1}, b.getI32Type()), pair);
    return vector::ExtractOp::create(b, word, ArrayRef<int64_t>{0});
  }
  /// d = a · bfrag + c on one 16x8x16 tile: a [4 x 2], bfrag [2 x 2] of
  /// `elt`, c and d four f32 (rows g and g + 8, columns 2·tig and 2·tig + 1).
  SmallVector<Value> mma(Value a, Value bfrag, ArrayRef<Value> c) {
    Type f32 = b.getF32Type();
    SmallVector<Value> d;
    if (elt.isF16()) {
      Value acc = vector::FromElementsOp::create(b, vec({2, 2}, f32), c);
      Value res = nvgpu::MmaSyncOp::create(b, a, bfrag, acc,
                                           ArrayRef<int64_t>{16, 8, 16});
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t cc = 0; cc < 2; ++cc)
          d.push_back(vector::ExtractOp::create(b, res, {r, cc}));
      return d;
    }
    SmallVector<Value> av, bv;
    for (int64_t r = 0; r < 4; ++r)
      av.push_back(packed(a, r));
    for (int64_t r = 0; r < 2; ++r)
      bv.push_back(packed(bfrag, r));
    auto structType = LLVM::LLVMStructType::getLiteral(
        b.getContext(), SmallVector<Type>(4, f32));
    std::array<NVVM::MMATypes, 2> types = {NVVM::MMATypes::bf16,
                                           NVVM::MMATypes::bf16};
    std::array<NVVM::MMALayout, 2> layouts = {NVVM::MMALayout::row,
                                              NVVM::MMALayout::col};
    Value res = NVVM::MmaOp::create(b, structType, av, bv, c,
                                    ArrayRef<int64_t>{16, 8, 16}, std::nullopt,
                                    std::nullopt, types, layouts);
    for (int64_t i = 0; i < 4; ++i)
      d.push_back(LLVM::ExtractValueOp::create(b, res, i));
    return d;
  }
};
} // namespace

/// The body of the kernel (launchFlashMixMma).
static void emitFlashMixMma(GPUKernel &kernel, const FlashMixSpec &spec,
                            const FlashMmaTile &tile, Type elt) {
  const int64_t K = spec.numExperts;
  const int64_t cols = tile.cols;
  const int64_t keyBlocks = cols / 8;      // n-blocks of the logits
  const int64_t chunks = tile.depth / 16;  // k-steps of the logits
  const int64_t expertBlocks = tile.experts / 8;
  GpuKernelBuilder &k = kernel.k;
  ImplicitLocOpBuilder &b = kernel.b;
  Mma m{b, k, elt};
  unsigned a = 0;
  Value q = kernel.arg(a++);
  Value keys = kernel.arg(a++);
  Value e = kernel.arg(a++);
  FlashLogitArgs logit(kernel, spec, a);
  Value keyMask = logit.keyMask;
  Value out = kernel.arg(a++);
  Value lseOut = spec.withLse ? kernel.arg(a++) : Value();
  Value ks = kernel.workgroup(0), vs = kernel.workgroup(1);

  Value c0 = k.idx(0), c1 = k.idx(1);
  Value tid = k.threadId();
  Value warp = k.divu(tid, k.idx(kWarp));
  Value lane = k.remu(tid, k.idx(kWarp));
  Value g = k.divu(lane, k.idx(4));   // the quad: rows g and g + 8
  Value tig = k.remu(lane, k.idx(4)); // the lane in the quad: columns
  Value bi = k.blockId(gpu::Dimension::y);
  Value rowBase = k.mul(k.blockId(), k.idx(kRows));
  Value N = k.dim(q, 1);
  Value D = k.dim(q, 2);
  Value Nk = k.dim(keys, 1);
  Value r0 = k.add(k.add(rowBase, k.mul(warp, k.idx(16))), g);
  std::array<Value, 2> rowsOf = {r0, k.add(r0, k.idx(8))};

  // The query fragments, once: chunk c's A operand holds (row, feature)
  // (g, 16c + 2tig + {0,1}), (g + 8, ...), (g, 16c + 8 + 2tig + {0,1}),
  // (g + 8, ...); zeros past N and D.
  Value zeroE = m.zeroElt();
  auto loadOrZero = [&](Value src, Value bIdx, Value row, Value rowLimit,
                        Value col, Value colLimit) {
    Value ok = k.andI(k.lt(row, rowLimit), k.lt(col, colLimit));
    Value v = k.load(src, {bIdx, k.select(ok, row, c0), k.select(ok, col, c0)});
    return k.select(ok, v, zeroE);
  };
  SmallVector<Value> qFrag;
  for (int64_t c = 0; c < chunks; ++c) {
    SmallVector<Value> elems;
    for (int64_t half = 0; half < 2; ++half)
      for (Value row : rowsOf)
        for (int64_t x = 0; x < 2; ++x) {
          Value d = k.add(k.mul(tig, k.idx(2)), k.idx(16 * c + 8 * half + x));
          elems.push_back(loadOrZero(q, bi, row, N, d, D));
        }
    qFrag.push_back(m.fragment(elems));
  }

  Value keyEnd = Nk;
  if (spec.causal)
    keyEnd = k.minu(Nk, k.add(rowBase, k.idx(kRows)));

  // Carried: the accumulator (expertBlocks x 4 f32), then per row the
  // running max and sum.
  SoftmaxState start = softmaxStart(k);
  SmallVector<Value> init(expertBlocks * 4, k.cF32(0.0));
  for (int r = 0; r < 2; ++r) {
    init.push_back(start.max);
    init.push_back(start.sum);
  }
  const int64_t accCount = expertBlocks * 4;
  SmallVector<Value> fin = k.forLoop(
      c0, keyEnd, k.idx(cols), init,
      [&](Value j0, ValueRange carried) -> SmallVector<Value> {
        // Stage the key and value tiles.
        k.barrier();
        k.forLoop(tid, k.idx(cols * tile.depth), k.idx(kThreads),
                  [&](Value flat) {
                    Value jj = k.divu(flat, k.idx(tile.depth));
                    Value dd = k.remu(flat, k.idx(tile.depth));
                    k.store(loadOrZero(keys, bi, k.add(j0, jj), Nk, dd, D), ks,
                            {jj, dd});
                  });
        k.forLoop(
            tid, k.idx(cols * tile.experts), k.idx(kThreads), [&](Value flat) {
              Value jj = k.divu(flat, k.idx(tile.experts));
              Value nn = k.remu(flat, k.idx(tile.experts));
              Value j = k.add(j0, jj);
              Value v = loadOrZero(e, bi, j, Nk, nn, k.idx(K));
              if (keyMask) { // a masked key adds nothing, not 0 · e
                Value js = k.select(k.lt(j, Nk), j, c0);
                v = k.select(k.load(keyMask, {bi, js}), v, zeroE);
              }
              k.store(v, vs, {jj, nn});
            });
        k.barrier();

        // Logits: keyBlocks tiles of 16 rows x 8 keys, over the chunks.
        SmallVector<SmallVector<Value>> s(keyBlocks,
                                          SmallVector<Value>(4, k.cF32(0.0)));
        Value ldRow = k.remu(lane, k.idx(8));
        Value ldSel = k.divu(lane, k.idx(8)); // which 8x8 matrix
        for (int64_t c = 0; c < chunks; ++c)
          for (int64_t nb = 0; nb < keyBlocks; nb += 2) {
            // Matrices: (keys nb, features lo), (nb, hi), (nb+1, lo),
            // (nb+1, hi).
            Value row = k.add(k.idx(nb * 8), k.add(ldRow, k.mul(k.divu(ldSel, k.idx(2)), k.idx(8))));
            Value col = k.add(k.idx(16 * c), k.mul(k.remu(ldSel, k.idx(2)), k.idx(8)));
            Value kf = m.ldmatrix(ks, row, col, 4, /*transpose=*/false);
            s[nb] = m.mma(qFrag[c], m.rows(kf, 0, 2), s[nb]);
            s[nb + 1] = m.mma(qFrag[c], m.rows(kf, 2, 2), s[nb + 1]);
          }

        // Masks and the online softmax of each of the thread's two rows.
        SmallVector<Value> acc(carried.begin(), carried.begin() + accCount);
        SmallVector<Value> next;
        std::array<SmallVector<Value>, 2> probs;
        std::array<Value, 2> rescale;
        for (int r = 0; r < 2; ++r) {
          SmallVector<Value> logits;
          for (int64_t nb = 0; nb < keyBlocks; ++nb)
            for (int64_t x = 0; x < 2; ++x) {
              Value j = k.add(j0, k.add(k.mul(tig, k.idx(2)),
                                        k.idx(nb * 8 + x)));
              logits.push_back(
                  flashLogit(k, spec, s[nb][2 * r + x], nullptr, nullptr, [&] {
                    Value inRange = k.lt(j, Nk);
                    return flashKeyKept(
                        k, spec, inRange,
                        [&] {
                          return keyMask
                                     ? k.load(keyMask,
                                              {bi, k.select(inRange, j, c0)})
                                     : Value();
                        },
                        [&] {
                          return k.cmpi(arith::CmpIPredicate::ule, j,
                                        rowsOf[r]);
                        });
                  }));
            }
          SoftmaxTile st = onlineSoftmaxStep(
              k, {carried[accCount + 2 * r], carried[accCount + 2 * r + 1]},
              logits,
              [&](Value v) { return subgroupReduce(k, v, ReduceKind::Max, 4); },
              [&](Value v) { return subgroupReduce(k, v, ReduceKind::Sum, 4); });
          probs[r] = st.probs;
          rescale[r] = st.rescale;
          next.push_back(st.next.max);
          next.push_back(st.next.sum);
        }
        for (int64_t eb = 0; eb < expertBlocks; ++eb)
          for (int64_t i = 0; i < 4; ++i)
            acc[eb * 4 + i] = k.fmul(acc[eb * 4 + i], rescale[i / 2]);

        // Mixing: per 16 keys, P's A operand from the logits' C fragments
        // of key blocks 2kc and 2kc + 1 (rounded to the operand type), the
        // values' B operands through ldmatrix.trans.
        auto toElt = [&](Value p) { return arith::TruncFOp::create(b, elt, p); };
        for (int64_t kc = 0; kc < keyBlocks / 2; ++kc) {
          SmallVector<Value> pe;
          for (int64_t half = 0; half < 2; ++half)
            for (int r = 0; r < 2; ++r)
              for (int64_t x = 0; x < 2; ++x)
                pe.push_back(toElt(probs[r][(2 * kc + half) * 2 + x]));
          Value pFrag = m.fragment(pe);
          for (int64_t eb = 0; eb < expertBlocks; eb += 2) {
            bool pair = eb + 1 < expertBlocks;
            // Matrices: (keys lo, experts eb), (keys hi, eb), then eb + 1.
            Value sel = pair ? ldSel : k.remu(ldSel, k.idx(2));
            Value row = k.add(k.idx(16 * kc),
                              k.add(ldRow, k.mul(k.remu(sel, k.idx(2)), k.idx(8))));
            Value col = k.add(k.idx(eb * 8), k.mul(k.divu(sel, k.idx(2)), k.idx(8)));
            Value vf = m.ldmatrix(vs, row, col, pair ? 4 : 2, /*transpose=*/true);
            for (int64_t h = 0; h < (pair ? 2 : 1); ++h) {
              ArrayRef<Value> c(acc.data() + (eb + h) * 4, 4);
              SmallVector<Value> d = m.mma(pFrag, m.rows(vf, 2 * h, 2), c);
              std::copy(d.begin(), d.end(), acc.begin() + (eb + h) * 4);
            }
          }
        }
        acc.append(next);
        return acc;
      });

  // Epilogue: normalize; a row without any key gets zeros.
  for (int r = 0; r < 2; ++r) {
    SoftmaxState state = {fin[accCount + 2 * r], fin[accCount + 2 * r + 1]};
    Value row = rowsOf[r];
    k.ifThen(k.lt(row, N), [&] {
      for (int64_t eb = 0; eb < expertBlocks; ++eb)
        for (int64_t x = 0; x < 2; ++x) {
          Value col = k.add(k.mul(tig, k.idx(2)), k.idx(eb * 8 + x));
          Value v = softmaxNormalize(k, state, fin[eb * 4 + 2 * r + x]);
          if ((eb + 1) * 8 <= K) {
            k.store(v, out, {bi, row, col});
            continue;
          }
          k.ifThen(k.lt(col, k.idx(K)), [&] { k.store(v, out, {bi, row, col}); });
        }
      if (lseOut)
        k.ifThen(k.eq(tig, c0), [&] {
          k.store(softmaxLogSumExp(k, state), lseOut, {bi, row});
        });
    });
  }
  (void)c1;
}

void mlir::moe::gpu_lowering::launchFlashMixMma(HostCode &h, StringRef name,
                                                const FlashMixSpec &spec,
                                                const FlashMmaTile &tile,
                                                Value q, ValueRange args,
                                                Location loc) {
  Type elt = cast<MemRefType>(q.getType()).getElementType();
  SmallVector<Type> workgroup = {
      workgroupMemRef({tile.cols, tile.depth + kPad}, elt),   // keys
      workgroupMemRef({tile.cols, tile.experts + kPad}, elt), // values
  };
  GPUKernel kernel(h, name, args, workgroup, {kThreads, 1, 1}, loc);
  kernel.func->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                       kernel.b.getI32IntegerAttr(tile.blocksPerSM));
  emitFlashMixMma(kernel, spec, tile, elt);
  GpuKernelBuilder &k = h.k;
  Value grid = k.ceilDiv(k.dim(q, 1), k.idx(kRows));
  kernel.launch({grid, k.dim(q, 0), k.idx(1)});
}
