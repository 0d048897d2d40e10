//===- Layout.cpp - Layouts, swizzles and the atoms' thread maps ----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Layout.h"

#include <algorithm>
#include <cassert>
#include <limits>

using namespace mlir::moe::kernels;

//===----------------------------------------------------------------------===//
// IntTuple
//===----------------------------------------------------------------------===//

IntTuple IntTuple::tuple(std::vector<IntTuple> elems) {
  IntTuple t{};
  t.elems = std::move(elems);
  return t;
}

int64_t IntTuple::value() const {
  assert(leaf && "value() of a tuple");
  return leafValue;
}

const IntTuple &IntTuple::operator[](size_t i) const {
  if (leaf) {
    assert(i == 0 && "a leaf has one element");
    return *this;
  }
  return elems.at(i);
}

int64_t IntTuple::product() const {
  int64_t p = 1;
  for (int64_t v : flatten())
    p *= v;
  return p;
}

std::vector<int64_t> IntTuple::flatten() const {
  if (leaf)
    return {leafValue};
  std::vector<int64_t> out;
  for (const IntTuple &e : elems) {
    std::vector<int64_t> sub = e.flatten();
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

bool IntTuple::congruent(const IntTuple &other) const {
  if (leaf || other.leaf)
    return leaf == other.leaf;
  if (elems.size() != other.elems.size())
    return false;
  for (size_t i = 0; i < elems.size(); ++i)
    if (!elems[i].congruent(other.elems[i]))
      return false;
  return true;
}

bool IntTuple::operator==(const IntTuple &other) const {
  return congruent(other) && flatten() == other.flatten();
}

std::string IntTuple::str() const {
  if (leaf)
    return std::to_string(leafValue);
  std::string s = "(";
  for (size_t i = 0; i < elems.size(); ++i)
    s += (i ? "," : "") + elems[i].str();
  return s + ")";
}

//===----------------------------------------------------------------------===//
// Layout
//===----------------------------------------------------------------------===//

Layout::Layout(IntTuple shape, IntTuple stride)
    : shp(std::move(shape)), strd(std::move(stride)) {
  assert(shp.congruent(strd) && "a layout's stride is congruent to its shape");
}

/// `shape` with its leaves replaced by `leaves` in order (consumed from
/// `next`).
static IntTuple withLeaves(const IntTuple &shape,
                           const std::vector<int64_t> &leaves, size_t &next) {
  if (shape.isLeaf())
    return IntTuple(leaves[next++]);
  std::vector<IntTuple> elems;
  for (size_t i = 0; i < shape.rank(); ++i)
    elems.push_back(withLeaves(shape[i], leaves, next));
  return IntTuple::tuple(std::move(elems));
}

Layout Layout::colMajor(const IntTuple &shape) {
  std::vector<int64_t> strides;
  int64_t s = 1;
  for (int64_t extent : shape.flatten()) {
    strides.push_back(s);
    s *= extent;
  }
  size_t next = 0;
  return Layout(shape, withLeaves(shape, strides, next));
}

std::vector<std::pair<int64_t, int64_t>> Layout::leaves() const {
  std::vector<int64_t> s = shp.flatten(), d = strd.flatten();
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < s.size(); ++i)
    out.push_back({s[i], d[i]});
  return out;
}

int64_t Layout::cosize() const {
  int64_t last = 0;
  for (auto [s, d] : leaves())
    last += (s - 1) * d;
  return last + 1;
}

int64_t Layout::operator()(int64_t index) const {
  assert(index >= 0 && "a coordinate is non-negative");
  int64_t offset = 0;
  std::vector<std::pair<int64_t, int64_t>> modes = leaves();
  for (size_t i = 0; i < modes.size(); ++i) {
    auto [s, d] = modes[i];
    // The last mode takes the rest, as CuTe's: a layout evaluated past its
    // size continues its last mode.
    int64_t c = i + 1 == modes.size() ? index : index % s;
    offset += c * d;
    index /= s;
  }
  return offset;
}

int64_t Layout::operator()(std::initializer_list<int64_t> coord) const {
  assert(coord.size() == rank() && "one coordinate per top-level mode");
  int64_t offset = 0;
  size_t i = 0;
  for (int64_t c : coord) {
    assert(c < mode(i).size() && "a mode's coordinate within its size");
    offset += mode(i++)(c);
  }
  return offset;
}

std::string Layout::str() const { return shp.str() + ":" + strd.str(); }

//===----------------------------------------------------------------------===//
// Composition
//===----------------------------------------------------------------------===//

namespace {
/// The modes of `a` that one leaf s:d of the right operand walks.
struct LeafImage {
  std::vector<int64_t> shape, stride;
};
} // namespace

/// a o (s:d) for a's leaves `a`: skip the first d elements' worth of modes
/// (divide a's shape by d), then take s elements of what remains; a's last
/// mode is unbounded.
static LeafImage composeLeaf(std::vector<std::pair<int64_t, int64_t>> a,
                             int64_t s, int64_t d) {
  LeafImage out;
  if (d == 0 || s == 1) {
    out.shape = {s};
    out.stride = {d == 0 || a.empty() ? 0 : a.front().second * d};
    return out;
  }
  size_t i = 0;
  for (int64_t rest = d; rest > 1; ++i) {
    auto &[si, di] = a[i];
    bool last = i + 1 == a.size();
    if (!last && rest % si == 0) {
      rest /= si;
      continue;
    }
    assert((last || si % rest == 0) && "composition: stride divides a mode");
    si = last ? std::numeric_limits<int64_t>::max() : si / rest;
    di *= rest;
    break;
  }
  for (; s > 1 && i < a.size(); ++i) {
    auto [si, di] = a[i];
    bool last = i + 1 == a.size();
    if (si == 1)
      continue;
    if (last || s <= si) {
      assert((last || si % s == 0) && "composition: shape divides a mode");
      out.shape.push_back(s);
      out.stride.push_back(di);
      s = 1;
      break;
    }
    assert(s % si == 0 && "composition: a mode divides the shape");
    out.shape.push_back(si);
    out.stride.push_back(di);
    s /= si;
  }
  return out;
}

static std::pair<IntTuple, IntTuple>
composeTree(const std::vector<std::pair<int64_t, int64_t>> &a,
            const IntTuple &bShape, const IntTuple &bStride) {
  if (bShape.isLeaf()) {
    LeafImage img = composeLeaf(a, bShape.value(), bStride.value());
    if (img.shape.size() == 1)
      return {IntTuple(img.shape[0]), IntTuple(img.stride[0])};
    std::vector<IntTuple> sh(img.shape.begin(), img.shape.end()),
        st(img.stride.begin(), img.stride.end());
    return {IntTuple::tuple(sh), IntTuple::tuple(st)};
  }
  std::vector<IntTuple> sh, st;
  for (size_t i = 0; i < bShape.rank(); ++i) {
    auto [s, d] = composeTree(a, bShape[i], bStride[i]);
    sh.push_back(s);
    st.push_back(d);
  }
  return {IntTuple::tuple(sh), IntTuple::tuple(st)};
}

Layout mlir::moe::kernels::composition(const Layout &a, const Layout &b) {
  auto [shape, stride] = composeTree(a.leaves(), b.shape(), b.stride());
  return Layout(shape, stride);
}

//===----------------------------------------------------------------------===//
// Swizzle and TV layouts
//===----------------------------------------------------------------------===//

int64_t Swizzle::operator()(int64_t offset) const {
  assert(shift > 0 && "a swizzle XORs higher bits into lower ones");
  int64_t mask = ((int64_t(1) << bits) - 1) << base;
  return offset ^ ((offset >> shift) & mask);
}

TileCoord TVLayout::operator()(int64_t thread, int64_t value) const {
  return tileStride(map({thread, value}), rows);
}

TileCoord TVLayout::threadPart(int64_t thread) const {
  return tileStride(map.mode(0)(thread), rows);
}

TileCoord TVLayout::valuePart(int64_t value) const {
  return tileStride(map.mode(1)(value), rows);
}

int64_t mlir::moe::kernels::sameElementValue(const TVLayout &from, int64_t v,
                                             const TVLayout &to) {
  assert(from.map.mode(0) == to.map.mode(0) && from.rows == to.rows &&
         "the same element in every thread: the same thread part");
  for (int64_t u = 0; u < to.values(); ++u)
    if (to.valuePart(u) == from.valuePart(v))
      return u;
  assert(false && "no value of `to` holds the element");
  return -1;
}

//===----------------------------------------------------------------------===//
// Atoms
//===----------------------------------------------------------------------===//

// Each map is ((threadID_in_group, groupID), (value modes)) : strides in the
// tile's column-major offsets (row + rows * col); lane = 4 * groupID +
// threadID_in_group, the ISA's decomposition, is the thread mode's
// colexicographic order.

TVLayout atoms::mmaM16N8K16A() {
  // a0,a1: (g, 2t + x); a2,a3: row + 8; a4..a7: column + 8. Tile 16 x 16.
  return {Layout({{4, 8}, {2, 2, 2}}, {{32, 1}, {16, 8, 128}}), 16, 16};
}

TVLayout atoms::mmaM16N8K16B() {
  // b0,b1: (k, n) = (2t + x, g); b2,b3: k + 8. Tile 16 x 8 (k x n).
  return {Layout({{4, 8}, {2, 2}}, {{2, 16}, {1, 8}}), 16, 8};
}

TVLayout atoms::mmaM16N8C() {
  // c0,c1: (g, 2t + x); c2,c3: row + 8. Tile 16 x 8.
  return {Layout({{4, 8}, {2, 2}}, {{32, 1}, {16, 8}}), 16, 8};
}

TVLayout atoms::mmaM16N8K8Tf32A() {
  // a0: (g, t); a1: row + 8; a2: column + 4; a3: both. Tile 16 x 8.
  return {Layout({{4, 8}, {2, 2}}, {{16, 1}, {8, 64}}), 16, 8};
}

TVLayout atoms::mmaM16N8K8Tf32B() {
  // b0: (k, n) = (t, g); b1: k + 4. Tile 8 x 8 (k x n).
  return {Layout({{4, 8}, 2}, {{1, 8}, 4}), 8, 8};
}

TVLayout atoms::mmaM16N8K8Tf32APairedK() {
  // Columns k = t + 4h of the 16 x 8 tile taken to 2t + h.
  Layout pairs({16, {4, 2}}, {1, {32, 16}});
  return {composition(pairs, mmaM16N8K8Tf32A().map), 16, 8};
}

TVLayout atoms::mmaM16N8K8Tf32BPairedK() {
  // Rows k = t + 4h of the 8 x 8 tile taken to 2t + h.
  Layout pairs({{4, 2}, 8}, {{2, 1}, 8});
  return {composition(pairs, mmaM16N8K8Tf32B().map), 8, 8};
}

Layout atoms::ldmatrixAddresses(int64_t count) {
  assert((count == 1 || count == 2 || count == 4) && "ldmatrix .x1/.x2/.x4");
  // Row r of matrix i starts at (r, 8i): offset r + 8 * 8i.
  return Layout({8, count}, {1, 64});
}

TVLayout atoms::ldmatrix(int64_t count, bool transpose) {
  assert((count == 1 || count == 2 || count == 4) && "ldmatrix .x1/.x2/.x4");
  // Register i holds matrix i (columns 8i..): its half x is (g, 2t + x), or
  // transposed (2t + x, g).
  if (transpose)
    return {Layout({{4, 8}, {2, count}}, {{2, 8}, {1, 64}}), 8, 8 * count};
  return {Layout({{4, 8}, {2, count}}, {{16, 1}, {8, 64}}), 8, 8 * count};
}

Layout atoms::ldmatrixRows(const Layout &placement, int64_t tileRows) {
  // The embedding of the 8 x 8count matrices in the kernel's tile: a row
  // stride 1, a column stride tileRows, matrix i at placement(i).
  Layout embed(IntTuple::tuple({8, 8, placement.shape()}),
               IntTuple::tuple({1, tileRows, placement.stride()}));
  Layout rows = composition(embed, ldmatrixAddresses(4));
  // ldmatrixAddresses(4)'s matrix mode became the placement's modes (x1 and
  // x2 are placements with repeated, zero-stride matrices: their upper
  // lanes' addresses, which the instruction ignores, stay in the tile).
  assert(rows.size() == 32 && "a placement of 4 matrices, one per 8 lanes");
  return rows;
}
