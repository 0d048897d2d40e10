//===- MmaFragments.h - mma.sync m16n8k16 fragments -------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The warp-level tensor-core helpers of the flash kernels on f16/bf16
// operands (FlashMma.cpp, FlashMmaGrad.cpp): fragments of two-element
// registers, ldmatrix, and mma.sync m16n8k16 with f32 accumulators (f16:
// nvgpu.mma.sync; bf16: nvvm.mma.sync on the packed 32-bit registers, which
// MLIR 22's NVGPU-to-NVVM conversion does not map), and 2^x on the SFU.
//
// Fragment layouts (PTX ISA, mma.m16n8k16): a thread of a warp is lane =
// 4g + tig; the A operand [16 x 16] holds (g, 2tig + {0,1}), (g + 8, ...),
// (g, 8 + 2tig + {0,1}), (g + 8, 8 + ...); the B operand [16 x 8] (k x n)
// holds (2tig + {0,1}, g) and (8 + 2tig + {0,1}, g); the C/D fragment
// [16 x 8] f32 holds (g, 2tig + {0,1}) and (g + 8, 2tig + {0,1}). These
// are MoE/Kernels/Layout.h's atoms (checked there against the ISA's tables);
// the ldmatrix addressing below is emitted from their layouts (Atoms.h).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_MMAFRAGMENTS_H
#define MOE_LIB_CONVERSION_MOETOGPU_MMAFRAGMENTS_H

#include "Atoms.h"
#include "GpuKernelBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

namespace mlir::moe::gpu_lowering {

/// The block of the tensor-core flash kernels: 4 warps, a warp 16 rows (one
/// MMA row tile) of the block's 64.
constexpr int64_t kMmaWarps = 4;
constexpr int64_t kMmaThreads = kWarp * kMmaWarps;
constexpr int64_t kMmaRows = 16 * kMmaWarps;
/// Elements of padding per workgroup row of f16/bf16 tiles that ldmatrix
/// reads (16 bytes: its row addresses then fall in distinct banks).
constexpr int64_t kLdmatrixPad = 8;

/// d = a · b + c on one warp-level tile of `shape` (m, n, k), row.col, with
/// f32 accumulators: nvvm.mma.sync on the operands' 32-bit registers `a` and
/// `bfrag` of PTX type `type` (bf16 pairs, tf32), c and d four f32 (rows g
/// and g + 8, columns 2·tig and 2·tig + 1).
inline SmallVector<Value> mmaSyncF32(ImplicitLocOpBuilder &b,
                                     NVVM::MMATypes type,
                                     ArrayRef<int64_t> shape, ValueRange a,
                                     ValueRange bfrag, ValueRange c) {
  Type f32 = b.getF32Type();
  auto structType = LLVM::LLVMStructType::getLiteral(b.getContext(),
                                                     SmallVector<Type>(4, f32));
  std::array<NVVM::MMATypes, 2> types = {type, type};
  std::array<NVVM::MMALayout, 2> layouts = {NVVM::MMALayout::row,
                                            NVVM::MMALayout::col};
  Value res = NVVM::MmaOp::create(b, structType, a, bfrag, c, shape,
                                  std::nullopt, std::nullopt, types, layouts);
  SmallVector<Value> d;
  for (int64_t i = 0; i < 4; ++i)
    d.push_back(LLVM::ExtractValueOp::create(b, res, i));
  return d;
}

/// The rows and columns of the window that an ldmatrix.x4 reads.
constexpr int64_t kWindow = 16;

/// The 4 matrices of an ldmatrix.x4 as the quadrants of a 16 x 16 window in
/// row-major order: matrix i at rows 8 (i / 2), columns 8 (i % 2) (offsets
/// column-major, kWindow rows).
inline kernels::Layout quadrantsByRow() {
  return kernels::Layout({2, 2}, {8 * kWindow, 8});
}

/// The quadrants in column-major order: matrix i at rows 8 (i % 2), columns
/// 8 (i / 2); an .x2 (`count` 2) reads the left two, which the upper 16
/// lanes repeat (their addresses are ignored; repeated, they stay in the
/// window).
inline kernels::Layout quadrantsByColumn(int64_t count) {
  return kernels::Layout({2, 2}, {8, count == 4 ? 8 * kWindow : 0});
}

/// The MMA helpers of one kernel on operands of `elt` (f16 or bf16).
struct Mma {
  ImplicitLocOpBuilder &b;
  GpuKernelBuilder &kb;
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
  /// A fragment from its rows, each a vector<2 x elt>.
  Value fragmentOfPairs(ArrayRef<Value> pairs) {
    Value frag = arith::ConstantOp::create(
        b, vec({static_cast<int64_t>(pairs.size()), 2}, elt),
        DenseElementsAttr::get(
            vec({static_cast<int64_t>(pairs.size()), 2}, elt),
            b.getFloatAttr(elt, 0.0)));
    for (auto [r, pair] : llvm::enumerate(pairs))
      frag = vector::InsertOp::create(b, pair, frag,
                                      ArrayRef<int64_t>{int64_t(r)});
    return frag;
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
  // The flash kernels' tiles in shared memory have a row per key (keys:
  // its features; values: its experts). ldmatrix's lanes give the addresses:
  // lane l row `ldRow` = l % 8 of matrix `ldSel` = l / 8.

  /// ldmatrix (x`count`, `transpose`) of the matrices that `placement` puts
  /// in the 16 x 16 window at (row0, col0) of `tile` (quadrantsByRow,
  /// quadrantsByColumn): each lane addresses the row that
  /// atoms::ldmatrixRows gives it, from its ldRow and ldSel.
  Value ldmatrixWindow(Value tile, const kernels::Layout &placement, Value row0,
                       Value col0, Value ldRow, Value ldSel, int64_t count,
                       bool transpose) {
    kernels::Layout lanes = kernels::atoms::ldmatrixRows(placement, kWindow);
    LaneCoords coords(kb, lanes.shape(), {ldRow, ldSel});
    IndexPair at = laneTileCoord(kb, coords, lanes, kWindow, row0, col0);
    return ldmatrix(tile, at.row, at.col, count, transpose);
  }

  /// The B operands of the logits S = Q K^T for the 16 keys at rows [key0,
  /// key0 + 16) of `tile` and the 16 features at columns [feat0, feat0 +
  /// 16): ldmatrix.x4 of the quadrants by row, (keys key0.., features lo),
  /// (key0.., hi), (key0 + 8.., lo), (key0 + 8.., hi). rows(f, 0, 2) is the
  /// first 8 keys' operand, rows(f, 2, 2) the next 8 keys'.
  Value keyFragments(Value tile, int64_t key0, int64_t feat0, Value ldRow,
                     Value ldSel) {
    return ldmatrixWindow(tile, quadrantsByRow(), kb.idx(key0), kb.idx(feat0),
                          ldRow, ldSel, 4, /*transpose=*/false);
  }
  /// The B operands of P V for the 16 keys at rows [key0, key0 + 16) of
  /// `tile` and the 8-column block at column 8·eb, with the block eb + 1
  /// too where `pair`: ldmatrix.trans, x4 (x2 without the pair) of the
  /// quadrants by column, (keys lo, eb), (keys hi, eb), then eb + 1's.
  /// rows(f, 0, 2) is block eb's operand, rows(f, 2, 2) block eb + 1's.
  Value valueFragments(Value tile, int64_t key0, int64_t eb, bool pair,
                       Value ldRow, Value ldSel) {
    int64_t count = pair ? 4 : 2;
    return ldmatrixWindow(tile, quadrantsByColumn(count), kb.idx(key0),
                          kb.idx(eb * 8), ldRow, ldSel, count,
                          /*transpose=*/true);
  }
  /// Two f32 values rounded as one pair of `elt` (an A operand's register:
  /// cvt.rn.{bf16x2,f16x2}.f32, one instruction for both).
  Value roundPair(Value lo, Value hi) {
    Value pair = vector::FromElementsOp::create(
        b, vec({2}, b.getF32Type()), ValueRange{lo, hi});
    return arith::TruncFOp::create(b, vec({2}, elt), pair);
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
    // bf16 stays on NVVM: MLIR 22's NVGPU-to-NVVM conversion maps
    // nvgpu.mma.sync for s8, s4, f16, f64 and tf32 only ("failed to deduce
    // operand PTX types" on bf16).
    SmallVector<Value> av, bv;
    for (int64_t r = 0; r < 4; ++r)
      av.push_back(packed(a, r));
    for (int64_t r = 0; r < 2; ++r)
      bv.push_back(packed(bfrag, r));
    return mmaSyncF32(b, NVVM::MMATypes::bf16, {16, 8, 16}, av, bv, c);
  }
  /// acc[at, at + 4) = a · bfrag + acc[at, at + 4): one accumulator block
  /// of a kernel's carried accumulators, in place.
  void mmaInto(SmallVector<Value> &acc, int64_t at, Value a, Value bfrag) {
    ArrayRef<Value> c(acc.data() + at, 4);
    SmallVector<Value> d = mma(a, bfrag, c);
    std::copy(d.begin(), d.end(), acc.begin() + at);
  }
  /// The products with the keys of a tile (Q·Kᵀ) for one 16-feature chunk
  /// at column `feat0` of `tile`: s[t · blocks + nb] += a[t] · (key block
  /// nb)ᵀ for every 8-key block nb < blocks, one ldmatrix.x4 (keyFragments)
  /// per 16 keys feeding the MMAs of every row tile t of `a`.
  void keyBlockProducts(SmallVector<SmallVector<Value>> &s, ArrayRef<Value> a,
                        Value tile, int64_t feat0, int64_t blocks, Value ldRow,
                        Value ldSel) {
    for (int64_t nb = 0; nb < blocks; nb += 2) {
      Value kf = keyFragments(tile, nb * 8, feat0, ldRow, ldSel);
      for (auto [t, frag] : llvm::enumerate(a)) {
        SmallVector<Value> &lo = s[t * blocks + nb];
        SmallVector<Value> &hi = s[t * blocks + nb + 1];
        lo = mma(frag, rows(kf, 0, 2), lo);
        hi = mma(frag, rows(kf, 2, 2), hi);
      }
    }
  }
  /// The products with the values of a tile (P·V) for the 16 keys at rows
  /// [key0, key0 + 16) of `tile`: the accumulator block of row tile t and
  /// 8-column block eb, acc[at + t · tileStride + 4 eb, + 4), += p[t] ·
  /// (value block eb) for every eb < blocks, one ldmatrix.trans
  /// (valueFragments) per two blocks feeding the MMAs of every row tile.
  void valueBlockProducts(SmallVector<Value> &acc, ArrayRef<Value> p,
                          int64_t at, int64_t tileStride, Value tile,
                          int64_t key0, int64_t blocks, Value ldRow,
                          Value ldSel) {
    for (int64_t eb = 0; eb < blocks; eb += 2) {
      bool pair = eb + 1 < blocks;
      Value vf = valueFragments(tile, key0, eb, pair, ldRow, ldSel);
      for (int64_t h = 0; h < (pair ? 2 : 1); ++h)
        for (auto [t, frag] : llvm::enumerate(p))
          mmaInto(acc, at + t * tileStride + 4 * (eb + h), frag,
                  rows(vf, 2 * h, 2));
    }
  }
};

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_MMAFRAGMENTS_H
