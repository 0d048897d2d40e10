//===- TorchKernels.cpp - The torch extension's shared plumbing -----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What every file of the torch extension calls (TorchKernels.h): memref
// descriptors of torch tensors, the in-memory kernel map and the Python
// kernel cache behind it (the loader that moeTorchSetLoader registers), the
// kernel call (on torch's OpenMP team on the CPU, on torch's current stream
// on CUDA), the index errors a kernel reports, and the checks worded as
// python/moe_mlir/ops/ words them. The ops (TorchOps.cpp, RoutingOps.cpp,
// GradOps.cpp, ...) call this file and it calls none of them.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/ErrorReporting.h"
#include "MoE/Runtime/KernelThreads.h"

#include "PythonCalls.h"
#include "TorchCuda.h"
#include "TorchKernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>


#include <atomic>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <pthread.h>

using at::Tensor;

namespace moe_torch {
//===----------------------------------------------------------------------===//
// Memref descriptors
//===----------------------------------------------------------------------===//

// MemRef: lib/Runtime/Torch/TorchKernels.h

/// The descriptor of contiguous `t` viewed with `sizes` (same element count).
MemRef describe(const Tensor &t, c10::IntArrayRef sizes) {
  checkElements(nullptr, "a kernel argument", sizes);
  MemRef d{};
  void *data = t.data_ptr();
  d.allocated = data;
  d.aligned = data;
  d.elements = c10::multiply_integers(sizes);
  int64_t rank = static_cast<int64_t>(sizes.size());
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    d.sizesStrides[i] = sizes[i];
    d.sizesStrides[rank + i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return d;
}
MemRef describe(const Tensor &t) { return describe(t, t.sizes()); }


namespace {
constexpr size_t kMaxKernelArgs = 12;

/// fn(p[0], .., p[N-1]): `_mlir_ciface_kernel` takes one descriptor pointer
/// per memref.
template <size_t... I>
void callWith(KernelFn fn, MemRef *const *p, std::index_sequence<I...>) {
  using M = MemRef *;
  reinterpret_cast<void (*)(decltype((void)I, M())...)>(fn)(p[I]...);
}

template <size_t... N>
constexpr auto makeCallers(std::index_sequence<N...>) {
  using Caller = void (*)(KernelFn, MemRef *const *);
  return std::array<Caller, sizeof...(N)>{
      +[](KernelFn fn, MemRef *const *p) {
        callWith(fn, p, std::make_index_sequence<N>());
      }...};
}
} // namespace

void callKernel(KernelFn fn, std::vector<MemRef> &args) {
  static constexpr auto callers =
      makeCallers(std::make_index_sequence<kMaxKernelArgs + 1>());
  TORCH_CHECK(args.size() >= 1 && args.size() <= kMaxKernelArgs,
              "moe: internal error: a kernel with ", args.size(),
              " memref arguments");
  std::array<MemRef *, kMaxKernelArgs> p{};
  for (size_t i = 0; i < args.size(); ++i)
    p[i] = &args[i];
  callers[args.size()](fn, p.data());
}

namespace {
#if AT_PARALLEL_OPENMP && defined(_OPENMP)
// libgomp's team does not survive fork(): a parallel region in a forked child
// waits for the parent's threads forever (torch's own ops too), so a child
// keeps to the kernel runtime's pool, which starts afresh there. Registered
// when the extension loads, before any fork it must see.
std::atomic<bool> forkedChild{false};
const bool forkHandlerRegistered = [] {
  pthread_atfork(nullptr, nullptr,
                 [] { forkedChild.store(true, std::memory_order_relaxed); });
  return true;
}();
#endif

/// callKernel for a CPU kernel: its tasks run on torch's OpenMP team
/// (KernelThreads.h). The caller (the team's master) runs the kernel, so its
/// error reports stay on its thread; the other members serve the runtime's
/// queue until it is done. (A CUDA kernel's host code has no tasks: it is
/// called plainly, without a team spinning meanwhile.)
///
/// A region costs its master the wait for every member at its end, and on a
/// loaded machine a member waits for a core first: ~24 ms for a one-token
/// call that takes 0.4-0.8 ms alone. So the team is asked for as ATen asks
/// for it (at::parallel_for over the call's `work` with ATen's grain): a call
/// of no more than GRAIN_SIZE runs on the caller alone, which then runs every
/// task of the kernel itself (helpers registered: no runtime thread is
/// woken). The kernels give each worker fixed items (MoEToCPU.cpp), so the
/// results are the same bits whichever thread runs a worker.
void callCpuKernel(KernelFn fn, std::vector<MemRef> &args, int64_t work) {
  auto run = [&] { callKernel(fn, args); };
#if AT_PARALLEL_OPENMP && defined(_OPENMP)
  int threads = at::get_num_threads();
  if (threads > 1 && !at::in_parallel_region() &&
      !forkedChild.load(std::memory_order_relaxed)) {
    int32_t done = 0;
    const std::thread::id caller = std::this_thread::get_id();
    struct Helpers {
      Helpers() { moeKernelRuntimeHelpersBegin(); }
      ~Helpers() { moeKernelRuntimeHelpersEnd(); }
    } helpers;
    // ATen's rule: a team when work > GRAIN_SIZE, else f(0, work) here.
    at::parallel_for(0, std::max<int64_t>(work, 1), at::internal::GRAIN_SIZE,
                     [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != caller)
        return moeKernelRuntimeServe(&done);
      // Released even when the call throws: the team waits for its members.
      struct Release {
        int32_t *flag;
        ~Release() { __atomic_store_n(flag, 1, __ATOMIC_RELEASE); }
      } release{&done};
      run();
    });
    return;
  }
#endif
  run();
}
} // namespace

//===----------------------------------------------------------------------===//
// The kernel cache (C++ side) and the Python loader
//===----------------------------------------------------------------------===//

PyObject *loader = nullptr; // loader(key: str, shapes: str) -> int address
std::mutex cacheMutex;
std::unordered_map<std::string, KernelFn> kernels;

const char *dtypeName(at::ScalarType t) {
  // The element types a kernel takes, named as in moe_mlir.runtime.abi.MLIR_ELEM.
  static constexpr std::pair<at::ScalarType, const char *> kNames[] = {
      {at::kFloat, "f32"}, {at::kHalf, "f16"}, {at::kBFloat16, "bf16"},
      {at::kInt, "i32"},   {at::kLong, "i64"}, {at::kBool, "i1"},
      {at::kDouble, "f64"}};
  for (const auto &[type, name] : kNames)
    if (type == t)
      return name;
  return c10::toString(t); // no kernel takes it: the validators say so
}

// Key: lib/Runtime/Torch/TorchKernels.h

// ValueError and TypeError keep their type: torch maps them back on the way
// out.
void rethrowPython() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string msg = "moe: the kernel cache failed";
  if (value) {
    if (PyObject *s = PyObject_Str(value)) {
      if (const char *c = PyUnicode_AsUTF8(s))
        msg = c;
      Py_DECREF(s);
    }
  }
  bool isValue = type && PyErr_GivenExceptionMatches(type, PyExc_ValueError);
  bool isType = type && PyErr_GivenExceptionMatches(type, PyExc_TypeError);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (isType)
    TORCH_CHECK_TYPE(false, msg);
  if (isValue)
    TORCH_CHECK_VALUE(false, msg);
  TORCH_CHECK(false, msg);
}

/// Holds the GIL for its scope (released on exceptions too).
PyObject *callPython(PyObject *fn, PyObject *args) {
  TORCH_CHECK(fn != nullptr,
              "moe: the kernel cache is not registered (import moe_mlir first)");
  PyObject *r = PyObject_CallObject(fn, args);
  Py_DECREF(args);
  if (!r)
    rethrowPython();
  return r;
}

/// Runs the Python validators on the call (no kernel): for shapes that no
/// kernel serves.
std::string Key::verifiedKey() const {
  c10::SmallVector<int64_t, 24> sizes{0, 1};
  for (const Input &i : inputs)
    sizes.append(i.sizes.begin(), i.sizes.end());
  c10::SmallVector<int64_t, 24> distinct(sizes);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()),
                 distinct.end());
  std::string out = key;
  out += '#';
  for (size_t s = 2; s < sizes.size(); ++s) {
    appendInt(out, std::lower_bound(distinct.begin(), distinct.end(),
                                    sizes[s]) -
                       distinct.begin());
    out += ',';
  }
  return out;
}

namespace {
/// The calls validateOnly verified (Key::verifiedKey).
std::unordered_set<std::string> verifiedCalls;
} // namespace

void validateOnly(const Key &k) {
  std::string verified = k.verifiedKey();
  {
    std::lock_guard<std::mutex> l(cacheMutex);
    if (verifiedCalls.count(verified))
      return;
  }
  {
    Gil gil;
    Py_DECREF(callPython(loader,
                         Py_BuildValue("(ssis)", k.key.c_str(),
                                       k.shapes().c_str(), 1, k.errorName())));
  }
  std::lock_guard<std::mutex> l(cacheMutex);
  verifiedCalls.insert(std::move(verified));
}

KernelFn lookup(const Key &k) {
  std::string verified = k.verifiedKey();
  {
    std::lock_guard<std::mutex> l(cacheMutex);
    auto it = kernels.find(verified);
    if (it != kernels.end())
      return it->second;
  }
  KernelFn fn = nullptr;
  {
    Gil gil;
    PyObject *r = callPython(loader, Py_BuildValue("(ssis)", k.key.c_str(),
                                                   k.shapes().c_str(), 0,
                                                   k.errorName()));
    fn = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
  }
  TORCH_CHECK(fn != nullptr, "moe: the kernel cache returned no kernel for ",
              k.key);
  std::lock_guard<std::mutex> l(cacheMutex);
  kernels.emplace(std::move(verified), fn);
  return fn;
}

// One wording for a bad h*, whether the kernel reported it or the zero-size
// path (which runs no kernel) found it.
void failHeadOutOfRange(int64_t value, int64_t heads) {
  TORCH_CHECK_VALUE(false, "moe.attention_posterior_backward: 'head' holds ",
                    value, ", outside [0, ", heads, "): it indexes no head");
  __builtin_unreachable();
}

/// After a kernel call: a reported index error becomes a ValueError, worded
/// as the eager ops word it. The runtime's message is
/// "moe.<op>: '<operand>' element <i> is <v>, outside [0, <n>); ...".
void checkReportedError() {
  char msg[512];
  // The process's one error slot (libmoe_cpu_runtime.so, which the kernel and
  // CUDA runtimes link), whichever runtime the kernel called.
  if (!moeTakeError(msg, sizeof(msg)))
    return;
  char op[128], operand[64];
  long long pos, value, bound;
  if (std::sscanf(msg, "moe.%127[^:]: '%63[^']' element %lld is %lld, outside [0, %lld)",
                  op, operand, &pos, &value, &bound) == 5) {
    // moe.attention_posterior_grad's h* (the only 'head' operand), checked
    // by the kernels of the torch op attention_posterior_backward.
    if (std::string_view(operand) == "head")
      failHeadOutOfRange(value, bound);
    TORCH_CHECK_VALUE(false, "moe.", op, ": '", operand, "' holds ", value,
                      ", outside [0, ", bound,
                      "): the value indexes no expert (element ", pos, ")");
  }
  TORCH_CHECK_VALUE(false, msg);
}

/// Calls kernel `fn` of a call on `device`: on the CPU, then raises a
/// reported index error; on CUDA, on torch's current stream, no wait.
void launch(KernelFn fn, std::vector<MemRef> &args, c10::Device device,
            int64_t work) {
  if (device.is_cuda()) {
#ifdef MOE_TORCH_CUDA
    moe_torch::launchOnCurrentStream(device, [&] { callKernel(fn, args); });
    return;
#else
    TORCH_CHECK(false, "moe: this build of libmoe_torch has no CUDA kernels");
#endif
  }
  if (work < 0) {
    work = 0;
    for (const MemRef &a : args)
      work += a.elements;
  }
  callCpuKernel(fn, args, work);
  checkReportedError();
}

std::vector<MemRef> describeAll(c10::ArrayRef<Tensor> tensors) {
  std::vector<MemRef> args;
  args.reserve(tensors.size());
  for (const Tensor &t : tensors)
    args.push_back(describe(t));
  return args;
}

void launch(KernelFn fn, c10::Device device, c10::ArrayRef<Tensor> tensors,
            int64_t work) {
  std::vector<MemRef> args = describeAll(tensors);
  launch(fn, args, device, work);
}

//===----------------------------------------------------------------------===//
// Checks of what a torch op takes beyond its key's op (the op verifier checks
// the op's rules: python/moe_mlir/runtime/verify.py), worded as ops/ words them
//===----------------------------------------------------------------------===//

void checkDim(const char *op, const char *name, const Tensor &t, int64_t d,
              int64_t expected, const char *what) {
  TORCH_CHECK_VALUE(t.size(d) == expected, "moe.", op, ": dimension ", d,
                    " of '", name, "' (", t.size(d), ") must equal ", what,
                    " (", expected, ")");
}

void checkShapedLike(const char *op, const char *name, const Tensor &t,
                     int64_t rank, const char *layout, const Tensor &like,
                     std::initializer_list<const char *> whats) {
  if (t.dim() != rank) {
    std::string shape = "[";
    for (int64_t d = 0; d < t.dim(); ++d)
      shape += (d ? ", " : "") + std::to_string(t.size(d));
    shape += "]";
    TORCH_CHECK_VALUE(false, "moe.", op, ": '", name, "' must have rank ",
                      rank, " (", layout, "), got shape ", shape);
  }
  int64_t d = 0;
  for (const char *what : whats) {
    checkDim(op, name, t, d, like.size(d), what);
    ++d;
  }
}

/// Every tensor on the first one's device.
void checkDevice(const char *op, std::initializer_list<const Tensor *> ts) {
  c10::Device device = (*ts.begin())->device();
  for (const Tensor *t : ts)
    TORCH_CHECK(t->device() == device, "moe.", op,
                ": every tensor must be on one device, got ", device, " and ",
                t->device());
}

void checkCpu(const char *op, std::initializer_list<const Tensor *> ts) {
  for (const Tensor *t : ts)
    TORCH_CHECK(t->device().is_cpu(), "moe.", op,
                ": the CPU kernels take CPU tensors, got one on ", t->device());
}

void checkElements(const char *op, const char *name, c10::IntArrayRef sizes) {
  constexpr int64_t kMaxElements = 2147483647; // moe::checkKernelLimits
  int64_t n = c10::multiply_integers(sizes);
  if (n <= kMaxElements)
    return;
  const char *q = op ? "'" : "";
  TORCH_CHECK_VALUE(false, "moe", op ? "." : "", op ? op : "", ": ", q, name,
                    q, " of shape ", sizes, " has ", n,
                    " elements, more than the compiled kernels support: at "
                    "most ",
                    kMaxElements,
                    " per tensor (2^31 - 1: the kernels index with i32)");
}

void checkResultElements(const char *op, const char *name,
                         c10::IntArrayRef sizes) {
  constexpr int64_t kMaxElements = 2147483647; // as checkElements
  int64_t n = 1;
  bool overflow = false;
  for (int64_t size : sizes)
    overflow |= __builtin_mul_overflow(n, size, &n);
  if (!overflow && n <= kMaxElements)
    return;
  std::string count = overflow ? "more than 2^63" : std::to_string(n);
  TORCH_CHECK_VALUE(false, "moe.", op, ": the result '", name, "' of shape ",
                    sizes, " would have ", count,
                    " elements, more than the kernels support: at most ",
                    kMaxElements,
                    " per tensor (2^31 - 1: the kernels index with i32)");
}

Tensor contig(const Tensor &t) {
  checkElements(nullptr, "a tensor", t.sizes()); // before any copy
  return t.is_contiguous() ? t : t.contiguous();
}

at::TensorOptions f32(const Tensor &like) {
  return like.options().dtype(at::kFloat);
}
at::TensorOptions i32(const Tensor &like) {
  return like.options().dtype(at::kInt);
}

at::ScalarType indexDtype(const char *op,
                          std::optional<at::ScalarType> indicesDtype) {
  at::ScalarType t = indicesDtype.value_or(at::kInt);
  TORCH_CHECK_TYPE(t == at::kInt || t == at::kLong, "moe.", op,
                   ": 'indices_dtype' must be torch.int32 or torch.int64, got ",
                   t);
  return t;
}

void setLoader(PyObject *fn) {
  Py_XINCREF(fn);
  Py_XDECREF(loader);
  loader = fn;
}

void clearKernels() {
  std::lock_guard<std::mutex> l(cacheMutex);
  kernels.clear();
  verifiedCalls.clear();
}

} // namespace moe_torch
