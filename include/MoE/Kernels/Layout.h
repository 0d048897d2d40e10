//===- Layout.h - Layouts, swizzles and the atoms' thread maps --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The index algebra under the GPU kernels' tiles, after CUTLASS's CuTe: a
// layout is a (possibly nested) shape with a stride of the same nesting, a
// function from a coordinate to an offset,
//
//   (4,8):(8,1)          a 4x8 row-major tile: (i, j) -> 8i + j
//   ((4,8),(2,2)):((32,1),(16,8))   mma.sync's C fragment, below
//
// A coordinate is a linear index too: it runs over the flattened modes
// colexicographically (the first mode fastest), so a layout is equally a map
// from [0, size) to offsets. Layouts compose (A o B)(i) = A(B(i)); a swizzle
// (an XOR of two bit ranges of the offset) is applied after a layout, which
// is how shared-memory tiles avoid bank conflicts.
//
// A thread-value layout (TV) gives the element of a tile that value v of
// thread t holds: a layout of two modes (thread, value) whose offsets are the
// tile's column-major offsets row + rows * col (CuTe's convention), so that
// composition with a tile's own layout is ordinary composition. The atoms
// below are the PTX instructions' fragment maps as data; the kernels index
// fragments through them (lib/Conversion/MoEToGPU/Atoms.h emits a layout as
// arithmetic on the lane id) and unittests/Kernels/LayoutTest.cpp checks each
// against the PTX ISA's fragment tables, lane by lane.
//
// Plain C++ (no MLIR): layouts are evaluated while the compiler builds a
// kernel; only what they give a lane becomes index arithmetic (Atoms.h).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_LAYOUT_H
#define MOE_KERNELS_LAYOUT_H

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace mlir::moe::kernels {

/// An integer or a tuple of IntTuples: a layout's shape or stride.
/// `IntTuple(4)` is a leaf, `{4, 8}` and `{{4, 8}, 2}` tuples (note: brace
/// initialisation always builds a tuple, `IntTuple{t}` is a 1-tuple of t).
class IntTuple {
public:
  IntTuple(int64_t v) : leafValue(v) {}
  IntTuple(int v) : leafValue(v) {}
  IntTuple(std::initializer_list<IntTuple> elems) : elems(elems), leaf(false) {}
  static IntTuple tuple(std::vector<IntTuple> elems);

  bool isLeaf() const { return leaf; }
  int64_t value() const;
  /// The number of top-level elements (1 for a leaf).
  size_t rank() const { return leaf ? 1 : elems.size(); }
  /// Element i (a leaf is its own element 0).
  const IntTuple &operator[](size_t i) const;
  /// The product of the leaves.
  int64_t product() const;
  /// The leaves in order (depth first).
  std::vector<int64_t> flatten() const;
  /// Whether `other` has the same nesting (leaf for leaf).
  bool congruent(const IntTuple &other) const;
  bool operator==(const IntTuple &other) const;
  std::string str() const;

private:
  int64_t leafValue = 0;
  std::vector<IntTuple> elems;
  bool leaf = true;
};

/// shape:stride, the stride congruent with the shape; strides are >= 0.
class Layout {
public:
  Layout(IntTuple shape, IntTuple stride);
  /// The compact column-major layout of `shape` (stride 1 for the first
  /// leaf, each next stride the product of the leaves before it).
  static Layout colMajor(const IntTuple &shape);

  const IntTuple &shape() const { return shp; }
  const IntTuple &stride() const { return strd; }
  size_t rank() const { return shp.rank(); }
  /// The top-level mode i as a layout of its own.
  Layout mode(size_t i) const { return Layout(shp[i], strd[i]); }
  /// The number of coordinates.
  int64_t size() const { return shp.product(); }
  /// One past the largest offset (the extent of memory the layout touches).
  int64_t cosize() const;

  /// The offset of the linear coordinate `index` in [0, size()).
  int64_t operator()(int64_t index) const;
  /// The offset of one linear coordinate per top-level mode: (thread, value)
  /// of a TV layout, (row, col) of a tile.
  int64_t operator()(std::initializer_list<int64_t> coord) const;
  /// The leaves as (shape, stride) pairs, in order.
  std::vector<std::pair<int64_t, int64_t>> leaves() const;
  bool operator==(const Layout &other) const {
    return shp == other.shp && strd == other.strd;
  }
  /// "shape:stride", e.g. "((4,8),(2,2)):((32,1),(16,8))".
  std::string str() const;

private:
  IntTuple shp, strd;
};

/// (a o b)(i) = a(b(i)) for i in [0, size(b)), with b's nesting (each leaf of
/// b becomes the modes of `a` it walks). Requires, as CuTe does, that each
/// leaf s:d of b divides evenly into a's modes (d divides the product of the
/// modes it skips or falls within one mode, and s takes whole modes or a
/// divisor of one); a's last mode is unbounded, so b may run past size(a).
/// Asserts otherwise.
Layout composition(const Layout &a, const Layout &b);

/// Swizzle<bits, base, shift>: offset ^ ((offset >> shift) & (mask << base))
/// with mask = 2^bits - 1, i.e. bits [base, base + bits) are XORed with bits
/// [base + shift, base + shift + bits). Applied to a tile's element offsets
/// (base = log2 of the elements of a 16-byte chunk) it permutes each row's
/// chunks by the row index, so the rows that one ldmatrix phase reads fall
/// in distinct banks. A bijection on every aligned block of 2^(base + shift
/// + bits) offsets.
struct Swizzle {
  int bits = 0, base = 0, shift = 0;
  int64_t operator()(int64_t offset) const;
};

/// A layout followed by a swizzle of its offsets (CuTe's ComposedLayout).
struct SwizzledLayout {
  Swizzle swizzle;
  Layout layout;
  int64_t operator()(int64_t index) const { return swizzle(layout(index)); }
};

/// (row, col) of an element of a tile.
struct TileCoord {
  int64_t row = 0, col = 0;
  bool operator==(const TileCoord &o) const {
    return row == o.row && col == o.col;
  }
};

/// A thread-value layout: `map` has two top-level modes (thread, value) and
/// gives the element's column-major offset in a rows x cols tile.
struct TVLayout {
  Layout map;
  int64_t rows = 0, cols = 0;

  int64_t threads() const { return map.mode(0).size(); }
  int64_t values() const { return map.mode(1).size(); }
  TileCoord operator()(int64_t thread, int64_t value) const;
  /// The element of the thread part alone (value 0's offset subtracted) and
  /// of the value part alone: map(t, v) = thread part + value part, which is
  /// how a kernel emits it (lane arithmetic plus a compile-time constant).
  TileCoord threadPart(int64_t thread) const;
  TileCoord valuePart(int64_t value) const;
};

/// The value of `to` that holds, in each thread, the element that value `v`
/// of `from` holds (CuTe's retiling: a C fragment read as the next MMA's A
/// operand). The two layouts give every thread the same part; asserts that
/// some value of `to` has v's element.
int64_t sameElementValue(const TVLayout &from, int64_t v, const TVLayout &to);

/// The row and column strides of a stride `d` in a column-major tile of
/// `rows` rows: row + rows * col.
inline TileCoord tileStride(int64_t d, int64_t rows) {
  return {d % rows, d / rows};
}

namespace atoms {

// mma.sync fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16" and
// "mma.m16n8k8"): thread = lane = 4 * groupID + threadID_in_group, value =
// the register element index (a0, a1, ... in the ISA's figures).

/// The A operand of mma.m16n8k16 (f16/bf16): a 16 x 16 (m x k) tile, 8 values.
TVLayout mmaM16N8K16A();
/// The B operand of mma.m16n8k16 (f16/bf16): a 16 x 8 (k x n) tile, 4 values.
TVLayout mmaM16N8K16B();
/// The C/D fragment of mma.m16n8k16 and mma.m16n8k8 (f32): 16 x 8 (m x n).
TVLayout mmaM16N8C();
/// The A operand of mma.m16n8k8 (tf32): 16 x 8 (m x k), 4 values.
TVLayout mmaM16N8K8Tf32A();
/// The B operand of mma.m16n8k8 (tf32): 8 x 8 (k x n), 2 values.
TVLayout mmaM16N8K8Tf32B();
/// The tf32 operands with k in pair order: k = t is column (A) or row (B)
/// 2t of the tile and k = t + 4 is 2t + 1, the atoms composed with that
/// permutation of k. Both operands permuted alike give the same product;
/// then a lane's two B values are adjacent (one 8-byte load of a key row)
/// and the C fragment of one product (columns 2t, 2t + 1) is the A operand
/// of the next without a shuffle (FlashTf32.cpp).
TVLayout mmaM16N8K8Tf32APairedK();
TVLayout mmaM16N8K8Tf32BPairedK();

// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: `count` 8x8
// matrices of 16-bit elements. Here they lie side by side in an 8 x 8count
// tile (matrix i at columns [8i, 8i + 8)); a kernel places them in its own
// tile by composing (ldmatrixRows).

/// Which row each lane addresses: lane l gives the address of row l % 8 of
/// matrix l / 8 (lanes from 8 * count on are ignored by the instruction:
/// this layout has 8 * count lanes); offsets in the 8 x 8count tile.
Layout ldmatrixAddresses(int64_t count);
/// What each lane receives: value 2i + x of lane l (register i, half x) is
/// element (l / 4, 2 (l % 4) + x) of matrix i, or with `transpose` element
/// (2 (l % 4) + x, l / 4): an 8 x 8count TV layout over 32 lanes.
TVLayout ldmatrix(int64_t count, bool transpose);
/// The lane layout of ldmatrix's row addresses in a kernel's tile of
/// `tileRows` rows (column-major offsets), for all 32 lanes: `placement` (of
/// size 4) gives the offset of matrix i's first row, its rows consecutive.
/// The composition of the placement's embedding with ldmatrixAddresses(4),
/// so shape (8, placement's shape), stride (1, placement's stride); .x1 and
/// .x2 take placements that repeat their matrices with a zero stride (the
/// instruction ignores the upper lanes' addresses; repeated, they stay in
/// the tile).
Layout ldmatrixRows(const Layout &placement, int64_t tileRows);

} // namespace atoms

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_LAYOUT_H
