//===- TorchKernels.h - What the torch op kernels share ---------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The pieces of TorchOps.cpp (the forward ops) that the backward ops of
// GradOps.cpp call too: memref descriptors over torch tensors, the kernel
// cache key, the lookup through the Python kernel cache, the call, and the
// shape checks with the messages of python/moe_mlir/ops.py. Defined in
// TorchOps.cpp; internal to libmoe_torch.so (hidden visibility).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H
#define MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace moe_torch {
using at::Tensor;

constexpr int kMaxRank = 4;

/// A ranked memref descriptor `{allocated, aligned, offset, sizes[R],
/// strides[R]}`; for rank R only the first 2R entries of `sizesStrides` are
/// part of the layout the kernel reads, so one struct serves every rank.
struct MemRef {
  void *allocated;
  void *aligned;
  int64_t offset;
  int64_t sizesStrides[2 * kMaxRank];
};

/// The descriptor of contiguous `t` viewed with `sizes` (same element count).
MemRef describe(const Tensor &t, c10::IntArrayRef sizes);
MemRef describe(const Tensor &t);

using KernelFn = void *;

/// Calls `_mlir_ciface_kernel` at `fn` with the descriptors (2 to 8).
void callKernel(KernelFn fn, std::vector<MemRef> &args);

/// The MLIR element type of a dtype (the c10 name for those no kernel takes).
const char *dtypeName(at::ScalarType t);

/// Builds the cache key `op|attr=value|...|in:name:dtype:dims|...` and, in
/// parallel, the call's concrete shapes (what Python validates on a miss).
class Key {
public:
  explicit Key(const char *op) : key(op), shapes(op) {}

  Key &attr(const char *name, int64_t v) {
    return raw(name, std::to_string(v));
  }
  Key &attr(const char *name, bool v) { return raw(name, v ? "1" : "0"); }
  Key &attr(const char *name, double v) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return raw(name, buf);
  }
  Key &attr(const char *name, c10::string_view v) {
    return raw(name, std::string(v));
  }
  Key &attr(const char *name, std::optional<double> v) {
    return v ? attr(name, *v) : raw(name, "none");
  }

  /// An input whose dimensions listed in `dynamic` are token-like.
  Key &in(const char *name, const Tensor &t,
          std::initializer_list<int> dynamic = {}) {
    key += "|in:";
    key += name;
    key += ':';
    key += dtypeName(t.scalar_type());
    key += ':';
    shapes += "|";
    shapes += name;
    shapes += ':';
    shapes += dtypeName(t.scalar_type());
    shapes += ':';
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) {
        key += 'x';
        shapes += 'x';
      }
      bool dyn = std::find(dynamic.begin(), dynamic.end(), d) != dynamic.end();
      key += dyn ? std::string("?") : std::to_string(t.size(d));
      shapes += std::to_string(t.size(d));
    }
    if (t.dim() == 0) {
      key += "scalar";
      shapes += "scalar";
    }
    return *this;
  }

  std::string key, shapes;

private:
  Key &raw(const char *name, const std::string &v) {
    key += '|';
    key += name;
    key += '=';
    key += v;
    return *this;
  }
};

/// The kernel of `k`: from the in-memory map, else from the Python kernel
/// cache (which validates the call first and compiles or loads the kernel).
KernelFn lookup(const Key &k);
/// Runs the Python validators on the call, without a kernel (for the shapes
/// that no kernel serves).
void validateOnly(const Key &k);
/// lookup + call + a reported index error as a ValueError.
void run(const Key &k, std::vector<MemRef> args);

// Checks with the messages of python/moe_mlir/ops.py.
void checkDim(const char *op, const char *name, const Tensor &t, int64_t d,
              int64_t expected, const char *what);
void checkRank(const char *op, const char *name, const Tensor &t,
               int64_t rank, const char *layout);
void checkCpu(const char *op, std::initializer_list<const Tensor *> ts);

/// The shared checks of similarity_inform, its fused top-k form and its
/// backward (what the kernel cache key does not pin down).
void similarityChecks(const char *op, const Tensor &u, const Tensor &e,
                      const std::optional<Tensor> &ws,
                      const std::optional<Tensor> &mask);

Tensor contig(const Tensor &t);
at::TensorOptions f32(const Tensor &like);
at::TensorOptions i32(const Tensor &like);
} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H
