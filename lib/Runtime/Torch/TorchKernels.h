//===- TorchKernels.h - Shared pieces of the torch.ops.moe CPU kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What the files of the torch extension share (TorchOps.cpp defines it; the
// routing ops of RoutingOps.cpp use it): memref descriptors of torch tensors,
// the kernel cache key and lookup, the kernel call, the checks worded as
// python/moe_mlir/ops.py words them, and the AutogradCPU kernel. Moved here
// from TorchOps.cpp's anonymous namespace unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H
#define MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

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

/// Calls `_mlir_ciface_kernel` with 2 to 8 memref arguments.
void callKernel(KernelFn fn, std::vector<MemRef> &args);

/// The dtype's element name in kernel keys ("f32", "i32", ...).
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

/// Runs the Python validators on the call (no kernel).
void validateOnly(const Key &k);
/// The kernel of `k`: from memory, else from the Python kernel cache (which
/// validates the call first and raises the op's error).
KernelFn lookup(const Key &k);
/// After a kernel call: a reported index error becomes a ValueError.
void checkReportedError();
/// lookup + call + checkReportedError.
void run(const Key &k, std::vector<MemRef> args);

void checkDim(const char *op, const char *name, const Tensor &t, int64_t d,
              int64_t expected, const char *what);
void checkRank(const char *op, const char *name, const Tensor &t,
               int64_t rank, const char *layout);
void checkCpu(const char *op, std::initializer_list<const Tensor *> ts);
Tensor contig(const Tensor &t);
at::TensorOptions f32(const Tensor &like);
at::TensorOptions i32(const Tensor &like);

} // namespace moe_torch

/// The boxed AutogradCPU kernel of the ops (TorchOps.cpp): straight to the CPU
/// kernel without gradients, else the op's Python autograd.
template <bool Differentiable>
void autogradCpu(const c10::OperatorHandle &op, c10::DispatchKeySet ks,
                 torch::jit::Stack *stack);

#endif // MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H
