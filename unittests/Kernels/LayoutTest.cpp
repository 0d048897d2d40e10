//===- LayoutTest.cpp - The layout algebra and the atoms' thread maps -----===//
//
// Part of the MoE-MLIR project.
//
// MoE/Kernels/Layout.h checked by enumeration: composition against
// evaluation, swizzles for bijectivity and bank conflicts, and every
// (lane, value) of every atom against the PTX ISA's fragment tables. The
// ISA's tables are written out here independently of the layouts, as the
// ISA states them ("Matrix Fragments for mma.m16n8k16 with floating point
// type", "... for mma.m16n8k8" (.tf32), and ldmatrix's description: lanes
// 8i..8i+7 address the rows of matrix i; lane l receives row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of each matrix, or with .trans that
// of the matrix transposed).
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Layout.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

using namespace mlir::moe::kernels;

namespace {

//===----------------------------------------------------------------------===//
// The algebra
//===----------------------------------------------------------------------===//

TEST(Layout, EvaluatesRowAndColumnMajorTiles) {
  Layout rowMajor({4, 8}, {8, 1});
  Layout colMajor = Layout::colMajor({4, 8});
  EXPECT_EQ(colMajor, Layout({4, 8}, {1, 4}));
  EXPECT_EQ(rowMajor.size(), 32);
  EXPECT_EQ(rowMajor.cosize(), 32);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(rowMajor({i, j}), 8 * i + j);
      EXPECT_EQ(colMajor({i, j}), i + 4 * j);
      // A linear coordinate runs over the modes colexicographically.
      EXPECT_EQ(rowMajor(i + 4 * j), 8 * i + j);
    }
  // Nested modes: a top-level coordinate is linear within its mode.
  Layout nested({{2, 2}, 3}, {{1, 6}, 2});
  EXPECT_EQ(nested.size(), 12);
  EXPECT_EQ(nested({3, 2}), 1 + 6 + 2 * 2);
  EXPECT_EQ(nested.cosize(), 1 + 6 + 4 + 1);
  EXPECT_EQ(nested.str(), "((2,2),3):((1,6),2)");
}

/// composition(a, b)(i) == a(b(i)) for every coordinate of b.
void expectComposes(const Layout &a, const Layout &b) {
  Layout c = composition(a, b);
  ASSERT_EQ(c.size(), b.size()) << a.str() << " o " << b.str();
  for (int64_t i = 0; i < b.size(); ++i)
    EXPECT_EQ(c(i), a(b(i)))
        << a.str() << " o " << b.str() << " = " << c.str() << " at " << i;
}

TEST(Layout, CompositionIsEvaluationInTurn) {
  // CuTe's documented example, shape and stride exactly.
  Layout c = composition(Layout({6, 2}, {8, 2}), Layout({4, 3}, {3, 1}));
  EXPECT_EQ(c, Layout({{2, 2}, 3}, {{24, 2}, 8})) << c.str();
  expectComposes(Layout({6, 2}, {8, 2}), Layout({4, 3}, {3, 1}));
  // A row-major tile read column-major (a transpose), tiles of tiles, a
  // broadcast (stride 0), and a right operand past the left's size (the
  // last mode continues).
  expectComposes(Layout({4, 8}, {8, 1}), Layout::colMajor({4, 8}));
  expectComposes(Layout({16, 16}, {16, 1}),
                 Layout({{8, 2}, {2, 8}}, {{1, 8}, {16, 32}}));
  expectComposes(Layout::colMajor({{4, 8}, {2, 2}}), Layout({32, 4}, {1, 0}));
  expectComposes(Layout({4}, {1}), Layout({2, 4}, {4, 1}));
  expectComposes(Layout({8, 8, 4}, {1, 16, 128}), Layout({8, 4}, {1, 64}));
}

TEST(Layout, CompositionWithColMajorIsIdentity) {
  Layout a({{4, 8}, {2, 2, 2}}, {{32, 1}, {16, 8, 128}});
  expectComposes(a, Layout::colMajor({256}));
  EXPECT_EQ(composition(Layout::colMajor({256}), a), a);
}

//===----------------------------------------------------------------------===//
// Swizzles
//===----------------------------------------------------------------------===//

TEST(Swizzle, IsABijectionOnItsBlock) {
  for (Swizzle sw : {Swizzle{3, 3, 3}, Swizzle{3, 4, 3}, Swizzle{2, 3, 3},
                     Swizzle{1, 4, 3}}) {
    int64_t block = int64_t(1) << (sw.bits + sw.base + sw.shift);
    std::set<int64_t> seen;
    for (int64_t o = 0; o < 2 * block; ++o) {
      int64_t s = sw(o);
      EXPECT_EQ(s / block, o / block) << "stays in its block";
      // The low `base` bits (one 16-byte chunk's elements) are untouched,
      // so a swizzled row stays a 16-byte vector.
      EXPECT_EQ(s % (int64_t(1) << sw.base), o % (int64_t(1) << sw.base));
      seen.insert(s);
    }
    EXPECT_EQ(int64_t(seen.size()), 2 * block);
  }
}

/// The largest number of distinct 4-byte words that one bank serves when 8
/// lanes read 16 bytes each at the byte addresses `rows` (one ldmatrix
/// phase: an 8x8 matrix of 16-bit elements): 1 is conflict-free.
int64_t bankWays(const std::vector<int64_t> &rowBytes) {
  std::vector<std::set<int64_t>> words(32);
  for (int64_t at : rowBytes)
    for (int64_t w = at / 4; w < at / 4 + 4; ++w)
      words[w % 32].insert(w);
  size_t ways = 0;
  for (const std::set<int64_t> &bank : words)
    ways = std::max(ways, bank.size());
  return int64_t(ways);
}

/// For every 8 consecutive rows and every 16-byte column chunk of a 64-row
/// tile of 64 f16 per row (128 bytes), the worst bank ways of ldmatrix's
/// phase reading those rows' chunk, offsets through `element`.
int64_t worstLdmatrixWays(const std::function<int64_t(int64_t)> &element) {
  Layout tile({64, 64}, {64, 1}); // row-major, 128-byte rows
  int64_t worst = 0;
  for (int64_t r0 = 0; r0 + 8 <= 64; ++r0)
    for (int64_t chunk = 0; chunk < 8; ++chunk) {
      std::vector<int64_t> rowBytes;
      for (int64_t r = r0; r < r0 + 8; ++r)
        rowBytes.push_back(2 * element(tile({r, 8 * chunk})));
      worst = std::max(worst, bankWays(rowBytes));
    }
  return worst;
}

TEST(Swizzle, The128ByteSwizzleMakesLdmatrixConflictFree) {
  // Unswizzled, the 8 rows of a chunk share its 4 banks: 8 ways.
  EXPECT_EQ(worstLdmatrixWays([](int64_t o) { return o; }), 8);
  // Swizzle<3,3,3> on f16 offsets (Swizzle<3,4,3> on bytes, CUTLASS's
  // 128-byte swizzle): row r's chunk c lands in chunk c ^ (r % 8).
  Swizzle sw{3, 3, 3};
  EXPECT_EQ(worstLdmatrixWays(sw), 1);
  // And it permutes the tile: every element keeps one place.
  SwizzledLayout swizzled{sw, Layout({64, 64}, {64, 1})};
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 64 * 64; ++i)
    seen.insert(swizzled(i));
  EXPECT_EQ(seen.size(), 64u * 64u);
  EXPECT_EQ(*seen.rbegin(), 64 * 64 - 1);
}

//===----------------------------------------------------------------------===//
// The atoms against the PTX ISA's tables
//===----------------------------------------------------------------------===//

int64_t groupId(int64_t lane) { return lane >> 2; }
int64_t threadInGroup(int64_t lane) { return lane % 4; }

/// Every (lane, value) of `atom` against `isa`, and every element of the
/// tile held exactly once.
void expectAtom(const TVLayout &atom, int64_t values,
                const std::function<TileCoord(int64_t, int64_t)> &isa) {
  ASSERT_EQ(atom.threads(), 32);
  ASSERT_EQ(atom.values(), values);
  std::set<std::pair<int64_t, int64_t>> held;
  for (int64_t lane = 0; lane < 32; ++lane)
    for (int64_t i = 0; i < values; ++i) {
      TileCoord got = atom(lane, i), want = isa(lane, i);
      EXPECT_EQ(got.row, want.row) << "lane " << lane << " value " << i;
      EXPECT_EQ(got.col, want.col) << "lane " << lane << " value " << i;
      // A kernel emits the lane's part and the value's part apart.
      TileCoord t = atom.threadPart(lane), v = atom.valuePart(i);
      EXPECT_EQ(t.row + v.row, got.row);
      EXPECT_EQ(t.col + v.col, got.col);
      held.insert({got.row, got.col});
    }
  EXPECT_EQ(int64_t(held.size()), atom.rows * atom.cols);
  EXPECT_EQ(32 * values, atom.rows * atom.cols);
}

TEST(Atoms, MmaM16N8K16F16MatchesTheIsa) {
  expectAtom(atoms::mmaM16N8K16A(), 8, [](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    int64_t row = (i < 2 || (4 <= i && i < 6)) ? g : g + 8;
    int64_t col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    return TileCoord{row, col};
  });
  expectAtom(atoms::mmaM16N8K16B(), 4, [](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    return TileCoord{t * 2 + (i & 1) + (i >= 2 ? 8 : 0), g};
  });
  expectAtom(atoms::mmaM16N8C(), 4, [](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    return TileCoord{i < 2 ? g : g + 8, t * 2 + (i & 1)};
  });
}

TEST(Atoms, MmaM16N8K8Tf32MatchesTheIsa) {
  expectAtom(atoms::mmaM16N8K8Tf32A(), 4, [](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    return TileCoord{(i == 0 || i == 2) ? g : g + 8, i < 2 ? t : t + 4};
  });
  expectAtom(atoms::mmaM16N8K8Tf32B(), 2, [](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    return TileCoord{i == 0 ? t : t + 4, g};
  });
}

TEST(Atoms, MmaM16N8K8Tf32PairedKIsTheIsaWithKPermuted) {
  // k = t + 4h is 2t + h: the ISA's (row, k) with k renamed.
  auto paired = [](int64_t k) { return 2 * (k % 4) + k / 4; };
  expectAtom(atoms::mmaM16N8K8Tf32APairedK(), 4, [&](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    return TileCoord{(i == 0 || i == 2) ? g : g + 8, paired(i < 2 ? t : t + 4)};
  });
  expectAtom(atoms::mmaM16N8K8Tf32BPairedK(), 2, [&](int64_t lane, int64_t i) {
    int64_t g = groupId(lane), t = threadInGroup(lane);
    return TileCoord{paired(i == 0 ? t : t + 4), g};
  });
  EXPECT_EQ(atoms::mmaM16N8K8Tf32APairedK().map.str(),
            "((4,8),(2,2)):((32,1),(8,16))");
  EXPECT_EQ(atoms::mmaM16N8K8Tf32BPairedK().map.str(), "((4,8),2):((2,8),1)");
}

/// ldmatrix run as the ISA describes it, on a column-major tile of
/// `tileRows` rows whose row addresses the lanes give by `laneRows` (lane
/// -> offset of the row's first element; lanes from 8 * count on ignored):
/// the tile element that half x of register i of each lane receives.
TileCoord ldmatrixIsa(const Layout &laneRows, int64_t tileRows, bool trans,
                      int64_t lane, int64_t i, int64_t x) {
  int64_t storedRow = trans ? 2 * threadInGroup(lane) + x : groupId(lane);
  int64_t storedCol = trans ? groupId(lane) : 2 * threadInGroup(lane) + x;
  int64_t rowStart = laneRows(8 * i + storedRow);
  return tileStride(rowStart + tileRows * storedCol, tileRows);
}

TEST(Atoms, LdmatrixMatchesTheIsa) {
  for (int64_t count : {1, 2, 4})
    for (bool trans : {false, true}) {
      Layout addresses = atoms::ldmatrixAddresses(count);
      ASSERT_EQ(addresses.size(), 8 * count);
      for (int64_t l = 0; l < 8 * count; ++l)
        EXPECT_EQ(tileStride(addresses(l), 8), (TileCoord{l % 8, 8 * (l / 8)}));
      expectAtom(atoms::ldmatrix(count, trans), 2 * count,
                 [&](int64_t lane, int64_t v) {
                   return ldmatrixIsa(addresses, 8, trans, lane, v / 2, v % 2);
                 });
    }
}

//===----------------------------------------------------------------------===//
// The flash kernels' ldmatrix placements (lib/Conversion/MoEToGPU/
// MmaFragments.h) feed mma.sync the operands it expects
//===----------------------------------------------------------------------===//

TEST(Atoms, LdmatrixRowsIsThePlacementsProduct) {
  Layout p({2, 2}, {128, 8});
  EXPECT_EQ(atoms::ldmatrixRows(p, 16), Layout({8, {2, 2}}, {1, {128, 8}}));
  Layout x2({2, 2}, {8, 0});
  EXPECT_EQ(atoms::ldmatrixRows(x2, 16), Layout({8, {2, 2}}, {1, {8, 0}}));
}

TEST(Atoms, KeyFragmentsAreTheLogitsBOperands) {
  // keyFragments: a [keys x features] tile, matrices (keys lo, features
  // lo), (lo, hi), (hi, lo), (hi, hi); registers 2nb, 2nb + 1 are key block
  // nb's B operand of Q K^T: (k, n) = (feature, key).
  const int64_t rows = 16;
  Layout lanes = atoms::ldmatrixRows(Layout({2, 2}, {8 * rows, 8}), rows);
  TVLayout b = atoms::mmaM16N8K16B();
  for (int64_t lane = 0; lane < 32; ++lane) {
    // The hand-written addressing this replaces: ldRow + 8 (ldSel / 2),
    // 8 (ldSel % 2).
    EXPECT_EQ(tileStride(lanes(lane), rows),
              (TileCoord{lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2)}));
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t x = 0; x < 2; ++x) {
        TileCoord got = ldmatrixIsa(lanes, rows, false, lane, i, x);
        TileCoord kn = b(lane, 2 * (i % 2) + x);
        EXPECT_EQ(got, (TileCoord{8 * (i / 2) + kn.col, kn.row}));
      }
  }
}

TEST(Atoms, ValueFragmentsAreTheMixingBOperands) {
  // valueFragments: a [keys x experts] tile read transposed, matrices (keys
  // lo, block eb), (keys hi, eb), then eb + 1's (x4) or repeated (x2):
  // registers 2j, 2j + 1 are block eb + j's B operand of P V: (k, n) = (key,
  // expert).
  const int64_t rows = 16;
  TVLayout b = atoms::mmaM16N8K16B();
  for (bool pair : {true, false}) {
    Layout lanes =
        atoms::ldmatrixRows(Layout({2, 2}, {8, pair ? 8 * rows : 0}), rows);
    for (int64_t lane = 0; lane < 32; ++lane) {
      int64_t sel = pair ? lane / 8 : (lane / 8) % 2;
      EXPECT_EQ(tileStride(lanes(lane), rows),
                (TileCoord{lane % 8 + 8 * (sel % 2), 8 * (sel / 2)}));
      for (int64_t i = 0; i < (pair ? 4 : 2); ++i)
        for (int64_t x = 0; x < 2; ++x) {
          TileCoord got = ldmatrixIsa(lanes, rows, true, lane, i, x);
          TileCoord kn = b(lane, 2 * (i % 2) + x);
          EXPECT_EQ(got, (TileCoord{kn.row, 8 * (i / 2) + kn.col}));
        }
    }
  }
}

TEST(Atoms, TransposedKeyPlacementIsAnAOperand) {
  // FlashSymmetric's A^T: a [rows x keys] tile read transposed through the
  // keys' placement gives the A operand of A^T V (m x k = key x row).
  const int64_t rows = 16;
  Layout lanes = atoms::ldmatrixRows(Layout({2, 2}, {8 * rows, 8}), rows);
  TVLayout a = atoms::mmaM16N8K16A();
  for (int64_t lane = 0; lane < 32; ++lane)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t x = 0; x < 2; ++x) {
        TileCoord got = ldmatrixIsa(lanes, rows, true, lane, i, x);
        TileCoord mk = a(lane, 2 * i + x);
        EXPECT_EQ(got, (TileCoord{mk.col, mk.row}));
      }
}

} // namespace
