//===- Atoms.h - Layouts as index arithmetic on the lane id -----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The MLIR face of MoE/Kernels/Layout.h: a layout over the lanes of a warp
// (an ldmatrix's row addresses, a fragment's elements) becomes the index
// arithmetic on the lane id that the kernels used to write by hand (`lane /
// 4`, `lane % 4`, `2 * tig + x`). The layouts themselves, and that they
// match the PTX ISA's tables, are checked on the CPU (unittests/Kernels/
// LayoutTest.cpp); this file only emits them, term by term in mode order, so
// that a kernel rewritten over a layout emits the arithmetic it did before.
// Only the target-neutral kernel builder is needed, so that LayoutTest also
// evaluates what this emits, lane by lane, against the layouts.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_ATOMS_H
#define MOE_LIB_CONVERSION_MOETOGPU_ATOMS_H

#include "MoE/Kernels/Builder.h"
#include "MoE/Kernels/Layout.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::moe::gpu_lowering {

/// A lane's coordinates in the modes of a thread layout's shape, emitted on
/// first use and kept: within a tuple of modes s_0, s_1, .., the coordinate
/// of mode j is (p / (s_0 .. s_{j-1})) % s_j of the tuple's own coordinate p,
/// computed as a chain of divisions, the last mode taking the rest
/// unreduced. For the shape (8, (2, 2)) of a lane: lane % 8, lane / 8, then
/// (lane / 8) % 2 and (lane / 8) / 2.
class LaneCoords {
public:
  /// From the lane id (the coordinate of the whole shape).
  LaneCoords(kernels::KernelBuilder &kb, const kernels::IntTuple &shape,
             Value lane)
      : kb(kb) {
    addNode(shape, -1, 0);
    nodes[0].coord = lane;
  }
  /// From the coordinates of the shape's top-level modes, already emitted
  /// (a kernel's `lane % 8` and `lane / 8`, shared by its ldmatrix calls).
  LaneCoords(kernels::KernelBuilder &kb, const kernels::IntTuple &shape,
             ArrayRef<Value> top)
      : kb(kb) {
    addNode(shape, -1, 0);
    assert(top.size() == shape.rank() && "one coordinate per top-level mode");
    for (auto [kid, v] : llvm::zip(SmallVector<int>(nodes[0].kids), top))
      nodes[kid].coord = v;
  }

  /// The coordinate of leaf `i` of the shape (depth-first order).
  Value leaf(size_t i) { return coord(leaves[i]); }

private:
  struct Node {
    int64_t extent;
    int parent, position;
    SmallVector<int> kids;
    Value coord;
    /// rests[j] = coord / (extents of kids 0 .. j-1).
    SmallVector<Value> rests;
  };
  int addNode(const kernels::IntTuple &shape, int parent, int position) {
    int id = nodes.size();
    nodes.push_back({shape.product(), parent, position, {}, Value(), {}});
    if (shape.isLeaf()) {
      leaves.push_back(id);
      return id;
    }
    for (size_t i = 0; i < shape.rank(); ++i) {
      int kid = addNode(shape[i], id, i);
      nodes[id].kids.push_back(kid);
    }
    return id;
  }
  Value coord(int node) {
    if (nodes[node].coord)
      return nodes[node].coord;
    const Node &n = nodes[node];
    const Node &p = nodes[n.parent];
    Value r = rest(n.parent, n.position);
    // The last mode takes the rest: the layout's domain bounds it already.
    bool last = n.position + 1 == static_cast<int>(p.kids.size());
    Value c = last ? r : kb.remu(r, kb.idx(n.extent));
    return nodes[node].coord = c;
  }
  Value rest(int node, int j) {
    if (nodes[node].rests.empty())
      nodes[node].rests.push_back(coord(node));
    while (static_cast<int>(nodes[node].rests.size()) <= j) {
      size_t k = nodes[node].rests.size();
      Value prev = nodes[node].rests.back();
      int64_t extent = nodes[nodes[node].kids[k - 1]].extent;
      nodes[node].rests.push_back(kb.divu(prev, kb.idx(extent)));
    }
    return nodes[node].rests[j];
  }

  kernels::KernelBuilder &kb;
  SmallVector<Node> nodes;
  SmallVector<int> leaves;
};

/// A row and a column index.
struct IndexPair {
  Value row, col;
};

/// The sum, in mode order, of coordinate x stride over the modes of the
/// lane layout `lanes` (offsets in a column-major tile of `tileRows` rows)
/// whose stride moves along the rows (`rows`) or the columns; a stride of 1
/// is no multiplication. A null Value where no mode moves that way.
inline Value laneSum(kernels::KernelBuilder &kb, LaneCoords &coords,
                     const kernels::Layout &lanes, int64_t tileRows,
                     bool rows) {
  Value sum;
  for (auto [i, mode] : llvm::enumerate(lanes.leaves())) {
    kernels::TileCoord d = kernels::tileStride(mode.second, tileRows);
    int64_t stride = rows ? d.row : d.col;
    if (stride == 0 || mode.first == 1)
      continue;
    Value c = coords.leaf(i);
    Value term = stride == 1 ? c : kb.mul(c, kb.idx(stride));
    sum = sum ? kb.add(sum, term) : term;
  }
  return sum;
}

/// The (row, col) that the lane layout `lanes` gives this lane, offset by
/// (row0, col0): base + laneSum, the row first. `coords` decomposes the lane
/// by `lanes`'s shape.
inline IndexPair laneTileCoord(kernels::KernelBuilder &kb, LaneCoords &coords,
                               const kernels::Layout &lanes, int64_t tileRows,
                               Value row0, Value col0) {
  Value row = laneSum(kb, coords, lanes, tileRows, /*rows=*/true);
  row = row ? kb.add(row0, row) : row0;
  Value col = laneSum(kb, coords, lanes, tileRows, /*rows=*/false);
  return {row, col ? kb.add(col0, col) : col0};
}

/// The row (`rows`) or the column of value `value` of this lane in the
/// thread-value layout `tv`, offset by `base`: the lane's part (laneSum over
/// tv's thread mode) plus one index constant, the value's part and the base.
/// A kernel that needs one of the two (the columns of a C fragment's
/// elements) emits no arithmetic for the other.
inline Value fragmentTileIndex(kernels::KernelBuilder &kb, LaneCoords &coords,
                               const kernels::TVLayout &tv, int64_t value,
                               int64_t base, bool rows) {
  kernels::TileCoord v = tv.valuePart(value);
  Value lane = laneSum(kb, coords, tv.map.mode(0), tv.rows, rows);
  Value constant = kb.idx(base + (rows ? v.row : v.col));
  return lane ? kb.add(lane, constant) : constant;
}

/// The (row, col) of value `value` of this lane in the thread-value layout
/// `tv`, offset by (row0, col0): the lane's part (laneSum over tv's thread
/// mode) plus one index constant, the value's part and the base (the form
/// of the kernels' `2 * tig + (16 c + 8 half + x)`).
inline IndexPair fragmentTileCoord(kernels::KernelBuilder &kb,
                                   LaneCoords &coords,
                                   const kernels::TVLayout &tv, int64_t value,
                                   int64_t row0, int64_t col0) {
  Value row = fragmentTileIndex(kb, coords, tv, value, row0, /*rows=*/true);
  return {row, fragmentTileIndex(kb, coords, tv, value, col0, /*rows=*/false)};
}

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_ATOMS_H
