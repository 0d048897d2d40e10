//===- TorchKernels.h - Shared pieces of the torch.ops.moe CPU kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What the files of the torch extension share (TorchKernels.cpp defines it,
// but for the AutogradCPU kernel of TorchOps.cpp; every op file uses it):
// memref descriptors of torch tensors, the kernel cache key and lookup, the
// kernel call, the checks worded as python/moe_mlir/ops/ words them, and the
// AutogradCPU kernel.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H
#define MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H

#include "MoE/Support/ShortestDecimal.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <charconv>
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
  /// The element count (not part of the descriptor the kernel reads, which
  /// ends in `sizesStrides`): a call's work is counted from it (launch).
  int64_t elements = 0;
};

/// The descriptor of contiguous `t` viewed with `sizes` (same element count).
MemRef describe(const Tensor &t, c10::IntArrayRef sizes);
MemRef describe(const Tensor &t);

using KernelFn = void *;

/// Calls `_mlir_ciface_kernel` with 1 to 12 memref arguments.
void callKernel(KernelFn fn, std::vector<MemRef> &args);

/// The dtype's element name in kernel keys ("f32", "i32", ...).
const char *dtypeName(at::ScalarType t);

/// At most 2^31 - 1 elements (the kernels index with i32): a token-like
/// dimension is dynamic in the kernel, so its size is only checked at run time.
/// `op` null: the message names no op (contig, describe).
void checkElements(const char *op, const char *name, c10::IntArrayRef sizes);
/// The same limit for a result the call is about to allocate (worded as
/// ops/_checks.py's _check_result_elements): checked before any allocation,
/// for the results whose size the operands do not bound (a size argument, or sizes of
/// two operands multiplied).
void checkResultElements(const char *op, const char *name,
                         c10::IntArrayRef sizes);

/// Builds the cache key `op|attr=value|...|in:name:dtype:dims|...`. This is
/// the per-call path: one string reserved once, numbers written in place
/// (shortestDecimal: doubles in their shortest round-trip form), the inputs'
/// sizes kept on the stack; the call's concrete shapes (what Python validates)
/// are only formatted on a miss.
class Key {
public:
  explicit Key(const char *op) : op(op), userOp(op) {
    key.reserve(192);
    key += op;
  }

  /// The torch op the errors name where it is not the key's (the router
  /// statistics of load_balancing_loss, similarity_inform's training form).
  Key &namedAs(const char *name) {
    userOp = name;
    return *this;
  }
  const char *errorName() const { return userOp; }

  Key &attr(const char *name, int64_t v) {
    raw(name);
    appendInt(key, v);
    return *this;
  }
  Key &attr(const char *name, bool v) {
    raw(name);
    key += v ? '1' : '0';
    return *this;
  }
  Key &attr(const char *name, double v) {
    raw(name);
    key += mlir::moe::shortestDecimal(v);
    return *this;
  }
  Key &attr(const char *name, c10::string_view v) {
    raw(name);
    key.append(v.data(), v.size());
    return *this;
  }
  Key &attr(const char *name, std::optional<double> v) {
    if (v)
      return attr(name, *v);
    raw(name);
    key += "none";
    return *this;
  }

  /// A result of the element type `dtype` where the op's inferred one is
  /// not (indices as i64): `|out:<name>:<element type>`.
  Key &out(const char *name, at::ScalarType dtype) {
    key += "|out:";
    key += name;
    key += ':';
    key += dtypeName(dtype);
    return *this;
  }

  /// An input whose dimensions listed in `dynamic` are token-like. The first
  /// input's device is the call's (checkDevice checked the others).
  Key &in(const char *name, const Tensor &t,
          std::initializer_list<int> dynamic = {}) {
    return in(name, t.scalar_type(), t.sizes(), dynamic, t.device());
  }
  /// The same for an input on `device` viewed with `sizes`.
  Key &in(const char *name, at::ScalarType dtype, c10::IntArrayRef sizes,
          std::initializer_list<int> dynamic, c10::Device on) {
    checkElements(op, name, sizes);
    if (!hasInput && on.is_cuda()) {
      device = on;
      key += "|device=cuda:";
      appendInt(key, on.index());
    }
    hasInput = true;
    key += "|in:";
    key += name;
    key += ':';
    key += dtypeName(dtype);
    key += ':';
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (d)
        key += 'x';
      if (std::find(dynamic.begin(), dynamic.end(), int(d)) != dynamic.end())
        key += '?';
      else
        appendInt(key, sizes[d]);
    }
    if (sizes.empty())
      key += "scalar";
    inputs.push_back({name, dtype, c10::DimVector(sizes)});
    return *this;
  }

  /// The key and how the call's sizes compare: each size (every input's,
  /// static or token-like) as its rank among the distinct sizes of the call
  /// and 0 and 1. The op verifier's rules are comparisons of sizes (equal
  /// token counts, k <= K, a non-empty dimension), so two calls with the same
  /// ranks pass or fail it alike: a call is verified (by the kernel cache, in
  /// the words of the torch op) the first time its ranks are seen, and the
  /// extension checks nothing of an op's rules itself.
  std::string verifiedKey() const;

  /// The call's concrete shapes, `op|name:dtype:dims|...`.
  std::string shapes() const {
    std::string s = op;
    for (const Input &i : inputs) {
      s += '|';
      s += i.name;
      s += ':';
      s += dtypeName(i.dtype);
      s += ':';
      for (size_t d = 0; d < i.sizes.size(); ++d) {
        if (d)
          s += 'x';
        appendInt(s, i.sizes[d]);
      }
      if (i.sizes.empty())
        s += "scalar";
    }
    return s;
  }

  std::string key;
  c10::Device device{c10::kCPU};

private:
  struct Input {
    const char *name;
    at::ScalarType dtype;
    c10::DimVector sizes;
  };
  const char *op;
  const char *userOp;
  c10::SmallVector<Input, 6> inputs;
  bool hasInput = false;

  void raw(const char *name) {
    key += '|';
    key += name;
    key += '=';
  }
  static void appendInt(std::string &out, int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
  }
};

// Validation before allocation: every op builds its Key from the operands as
// they are (the sizes and dtypes its kernel will see; no copy made yet), calls
// lookup (or validateOnly where no kernel runs), and only then makes operands
// contiguous and allocates its results. A key in memory passed the validators
// once; what they check that the key does not pin down (relations of the
// dynamic token-like sizes) is checked in C++ on every call.

/// Runs the Python validators on the call (no kernel).
void validateOnly(const Key &k);
/// The kernel of `k`: from memory, else from the Python kernel cache (which
/// validates the call first and raises the op's error).
KernelFn lookup(const Key &k);
/// After a kernel call: a reported index error becomes a ValueError.
void checkReportedError();
/// The ValueError of attention_posterior_backward's h* = `value` outside
/// [0, `heads`) (the wording of python/moe_mlir/ops/).
[[noreturn]] void failHeadOutOfRange(int64_t value, int64_t heads);
/// Calls kernel `fn` of a call on `device`: on the CPU, then raises a
/// reported index error; on CUDA, on torch's current stream, no wait.
/// `work`: the call's work in elements an elementwise op would touch, where
/// it is not linear in the arguments (similarity_inform: N x N pairs); by
/// default (-1) the elements of `args`. On the CPU a call of no more than
/// ATen's grain (at::internal::GRAIN_SIZE) of work runs on the calling thread
/// alone, as ATen's own ops do (callCpuKernel).
void launch(KernelFn fn, std::vector<MemRef> &args, c10::Device device,
            int64_t work = -1);
/// The memrefs of `tensors` (each with its own sizes), in order.
std::vector<MemRef> describeAll(c10::ArrayRef<Tensor> tensors);
/// launch() on `tensors`, the kernel's arguments in order, each described
/// with its own sizes: the end of most ops' kernels.
void launch(KernelFn fn, c10::Device device, c10::ArrayRef<Tensor> tensors,
            int64_t work = -1);

void checkDim(const char *op, const char *name, const Tensor &t, int64_t d,
              int64_t expected, const char *what);
/// `t` of rank `rank` whose leading dimensions are those of `like`, as many
/// as `whats` describes (checkDim's `what`): apply_capacity's weights, which
/// the torch op masks and the key's op reads only to drop by probability.
void checkShapedLike(const char *op, const char *name, const Tensor &t,
                     int64_t rank, const char *layout, const Tensor &like,
                     std::initializer_list<const char *> whats);
/// Every tensor on the CPU (the ops with CPU kernels only).
void checkCpu(const char *op, std::initializer_list<const Tensor *> ts);
/// Every tensor on the first one's device.
void checkDevice(const char *op, std::initializer_list<const Tensor *> ts);
/// The Similarity-Inform operands on one device (the op verifier checks the
/// rest).
void similarityDevices(const char *op, const Tensor &u, const Tensor &e,
                       const std::optional<Tensor> &ws,
                       const std::optional<Tensor> &mask);
/// Adds the Similarity-Inform operands to `key` (B, N dynamic).
void similarityKey(Key &key, const Tensor &u, const Tensor &e,
                   const std::optional<Tensor> &ws,
                   const std::optional<Tensor> &mask);
/// The descriptors of those operands (after lookup); `keep` holds the
/// contiguous tensors they describe.
std::vector<MemRef> similarityArgs(const Tensor &u, const Tensor &e,
                                   const std::optional<Tensor> &ws,
                                   const std::optional<Tensor> &mask,
                                   std::vector<Tensor> &keep);
/// Their kernels' work (launch): quadratic in N, unlike their operands.
int64_t similarityWork(const Tensor &u, const Tensor &e);
/// Calls `moe_mlir.reference.<name>(*args)` (holding the GIL) and returns its
/// tensors: the eager reference where no kernel applies.
std::vector<Tensor> allHeadsReference(const char *name,
                                      const std::vector<c10::IValue> &args);
/// Adds the Attention-Inform operands to `key` (B, N, Nk dynamic).
void attentionKey(Key &key, const Tensor &scores, const Tensor &u,
                  const Tensor &v, const Tensor &wo, const Tensor &e);
/// The descriptors of those operands (after lookup); `keep` holds the
/// contiguous tensors they describe.
std::vector<MemRef> attentionArgs(const Tensor &scores, const Tensor &u,
                                  const Tensor &v, const Tensor &wo,
                                  const Tensor &e, std::vector<Tensor> &keep);
/// `t`, contiguous (a copy when it is not), after checkElements.
Tensor contig(const Tensor &t);
at::TensorOptions f32(const Tensor &like);
at::TensorOptions i32(const Tensor &like);
/// The dtype of an op's index results: int32 (the default, the kernels' own)
/// or int64 (as torch.topk gives them); a TypeError for any other.
at::ScalarType indexDtype(const char *op,
                          std::optional<at::ScalarType> indicesDtype);
/// `key` with the index result `name` as i64 where `dtype` says so.
inline void indexResult(Key &key, const char *name, at::ScalarType dtype) {
  if (dtype == at::kLong)
    key.out(name, dtype);
}

} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_TORCHKERNELS_H
