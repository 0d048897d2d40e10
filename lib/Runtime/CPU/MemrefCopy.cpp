//===- MemrefCopy.cpp - memrefCopy for AOT-compiled kernels ---------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// `memref.copy` between memrefs that are not both contiguous lowers to a call
// of `memrefCopy(elemSize, UnrankedMemRef *src, UnrankedMemRef *dst)`
// (finalize-memref-to-llvm); upstream defines it in libmlir_c_runner_utils,
// which links libLLVM. An unranked memref is `{int64 rank, void *descriptor}`
// and a ranked descriptor `{allocated, aligned, offset, sizes[rank],
// strides[rank]}` (strides in elements).
//
//===----------------------------------------------------------------------===//

#include <cstdint>
#include <cstring>

namespace {
struct Unranked {
  int64_t rank;
  void *descriptor;
};

struct View {
  char *base;
  const int64_t *sizes;
  const int64_t *strides;
};

View view(const Unranked &m, int64_t elemSize) {
  auto *words = static_cast<int64_t *>(m.descriptor);
  char *aligned = reinterpret_cast<char *>(words[1]);
  return {aligned + words[2] * elemSize, words + 3, words + 3 + m.rank};
}

void copyDim(int64_t dim, int64_t rank, int64_t elemSize, const View &src,
             const View &dst, const char *s, char *d) {
  if (dim == rank) {
    std::memcpy(d, s, elemSize);
    return;
  }
  int64_t n = src.sizes[dim];
  int64_t ss = src.strides[dim] * elemSize, ds = dst.strides[dim] * elemSize;
  if (dim == rank - 1 && ss == elemSize && ds == elemSize) {
    std::memcpy(d, s, n * elemSize);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    copyDim(dim + 1, rank, elemSize, src, dst, s + i * ss, d + i * ds);
}
} // namespace

extern "C" void memrefCopy(int64_t elemSize, Unranked *src, Unranked *dst) {
  View s = view(*src, elemSize), d = view(*dst, elemSize);
  for (int64_t i = 0; i < src->rank; ++i)
    if (s.sizes[i] == 0)
      return;
  copyDim(0, src->rank, elemSize, s, d, s.base, d.base);
}
