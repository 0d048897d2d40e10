//===- TorchOps.cpp - torch.ops.moe.* on the compiled CPU kernels ---------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CPU (and, with TorchCudaOps.cpp, CUDA) kernels of the torch ops that
// python/moe_mlir/ops/ defines (the schemas and fake kernels stay in Python;
// the autograd of the differentiable ops is Autograd.cpp; Registration.cpp
// registers them all from the op table, TorchOps.def). Each call:
//
// 1. checks what the kernel cache key does not pin down (the relations
//    between the token-like, dynamic dimensions; the messages of the Python
//    validators);
// 2. builds the key: op, attributes, the device (CUDA only: `device=cuda:N`),
//    input dtypes and shapes with the token-like dimensions as `?` (they are
//    dynamic in the kernel);
// 3. finds the kernel in an in-memory map; on a miss asks the Python kernel
//    cache (python/moe_mlir/runtime/cache.py, registered once through
//    moeTorchSetLoader) to validate the call with the Python validators and
//    to compile or load the kernel, and keeps its address; nothing is copied
//    or allocated before this (a size argument such as k = -1 or 2^40 gets
//    the op's message, not torch's allocation error);
// 4. allocates the outputs with torch and passes them, with the (contiguous)
//    inputs, as memref descriptors to `_mlir_ciface_kernel(inputs...,
//    outputs...)`: the kernels are lowered with results-to-out-params, so they
//    compute their results in torch's storage (no copy);
// 5. on the CPU, turns an index error reported by the kernel
//    (moeReportIndexError) into a Python ValueError; on CUDA the call runs on
//    torch's current stream without waiting (launch(); TorchCuda.h) and index
//    errors wait in the device error word for a poll.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/ErrorReporting.h"
#include "MoE/Runtime/KernelThreads.h"

#include "PythonCalls.h"
#include "TorchKernels.h"
#include "TorchOps.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <Python.h>

#include <array>
#include <utility>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <pthread.h>

using at::Tensor;

PyObject *toPython(const c10::IValue &v); // the autograd section below

// The kernels (TorchOps.h) and the helpers the other files of the extension
// share through TorchKernels.h (RoutingOps.cpp, GradOps.cpp).
namespace moe_torch {

//===----------------------------------------------------------------------===//
// The ops
//===----------------------------------------------------------------------===//

std::tuple<Tensor, Tensor>
topkRenorm(const Tensor &scores, int64_t k, c10::string_view mode,
           bool renormalize, std::optional<at::ScalarType> indicesDtype) {
  checkDevice("topk_renorm", {&scores});
  at::ScalarType indexType = indexDtype("topk_renorm", indicesDtype);
  Key key("topk_renorm");
  key.attr("k", k).attr("mode", mode).attr("renormalize", renormalize);
  indexResult(key, "indices", indexType);
  if (scores.dim() == 0) { // no [rows, K] view: the verifier's error
    key.in("scores", scores);
    lookup(key);
  }
  int64_t K = scores.size(-1);
  // [..., K] as [rows, K]: one kernel for every leading shape.
  int64_t rows = K == 0 ? 0 : scores.numel() / K;
  std::array<int64_t, 2> flatShape{rows, K};
  key.in("scores", scores.scalar_type(), flatShape, {0}, scores.device());
  KernelFn fn = lookup(key); // validates k against K before any allocation
  Tensor s = contig(scores);
  c10::DimVector shape(s.sizes());
  shape.back() = k;
  Tensor w = at::empty(shape, f32(s));
  Tensor i = at::empty(shape, s.options().dtype(indexType));
  std::array<int64_t, 2> outShape{rows, k};
  if (rows == 0)
    return {w, i};
  std::vector<MemRef> args{describe(s, flatShape), describe(w, outShape),
                           describe(i, outShape)};
  launch(fn, args, key.device);
  return {w, i};
}

/// The shared part of similarity_inform and its fused top-k form: the
/// operands on one device (the op verifier checks the rest).
void similarityDevices(const char *op, const Tensor &u, const Tensor &e,
                       const std::optional<Tensor> &ws,
                       const std::optional<Tensor> &mask) {
  checkDevice(op, {&u, &e});
  if (ws)
    checkDevice(op, {&u, &*ws});
  if (mask)
    checkDevice(op, {&u, &*mask});
}

void similarityKey(Key &key, const Tensor &u, const Tensor &e,
                   const std::optional<Tensor> &ws,
                   const std::optional<Tensor> &mask) {
  key.in("u", u, {0, 1}).in("e", e, {0, 1});
  if (ws)
    key.in("ws", *ws);
  if (mask)
    key.in("key_mask", *mask, {0, 1});
}

std::vector<MemRef> similarityArgs(const Tensor &u, const Tensor &e,
                                   const std::optional<Tensor> &ws,
                                   const std::optional<Tensor> &mask,
                                   std::vector<Tensor> &keep) {
  keep = {contig(u), contig(e)};
  if (ws)
    keep.push_back(contig(*ws));
  if (mask)
    keep.push_back(contig(*mask));
  return describeAll(keep);
}

int64_t similarityWork(const Tensor &u, const Tensor &e) {
  // Every (query, key) pair: a D-long dot product and a K-long mix.
  int64_t B = u.size(0), N = u.size(1);
  return B * N * N * std::max<int64_t>(u.size(2) + e.size(2), 1);
}

/// p of similarity_inform and, for its training form (`withLse`:
/// similarity_inform_fwd), the row log-sum-exp [B, N]. Errors name
/// similarity_inform either way: it is the op the user called.
static std::vector<Tensor>
similarityMix(bool withLse, const Tensor &u, const Tensor &e,
              const std::optional<Tensor> &ws,
              const std::optional<Tensor> &mask, double tau, bool causal) {
  similarityDevices("similarity_inform", u, e, ws, mask);
  Key key(withLse ? "similarity_inform_fwd" : "similarity_inform");
  key.namedAs("similarity_inform");
  key.attr("tau", tau).attr("causal", causal);
  similarityKey(key, u, e, ws, mask);
  KernelFn fn = lookup(key);
  std::array<int64_t, 2> lseShape{u.size(0), u.size(1)};
  if (withLse) // [B, N]: bounded by u's size only where D > 0
    checkResultElements("similarity_inform", "lse", lseShape);
  std::vector<Tensor> keep;
  std::vector<MemRef> args = similarityArgs(u, e, ws, mask, keep);
  std::vector<Tensor> out{at::empty(e.sizes(), f32(e))};
  if (withLse)
    out.push_back(at::empty(lseShape, f32(e)));
  for (const Tensor &t : out)
    args.push_back(describe(t));
  launch(fn, args, key.device, similarityWork(u, e));
  return out;
}

Tensor similarityInform(const Tensor &u, const Tensor &e,
                        const std::optional<Tensor> &ws,
                        const std::optional<Tensor> &mask, double tau,
                        bool causal) {
  return similarityMix(false, u, e, ws, mask, tau, causal)[0];
}

std::tuple<Tensor, Tensor>
similarityInformFwd(const Tensor &u, const Tensor &e,
                    const std::optional<Tensor> &ws,
                    const std::optional<Tensor> &mask, double tau,
                    bool causal) {
  std::vector<Tensor> r = similarityMix(true, u, e, ws, mask, tau, causal);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor>
similarityInformTopk(const Tensor &u, const Tensor &e, int64_t k,
                     const std::optional<Tensor> &ws,
                     const std::optional<Tensor> &mask, double tau, bool causal,
                     bool renormalize) {
  similarityDevices("similarity_inform_topk", u, e, ws, mask);
  Key key("similarity_inform_topk");
  key.attr("k", k).attr("renormalize", renormalize).attr("tau", tau).attr(
      "causal", causal);
  similarityKey(key, u, e, ws, mask);
  KernelFn fn = lookup(key); // validates k against K before any allocation
  std::vector<Tensor> keep;
  std::vector<MemRef> args = similarityArgs(u, e, ws, mask, keep);
  std::array<int64_t, 3> shape{u.size(0), u.size(1), k};
  Tensor w = at::empty(shape, f32(e)), i = at::empty(shape, i32(e));
  args.push_back(describe(w));
  args.push_back(describe(i));
  launch(fn, args, key.device, similarityWork(u, e));
  return {w, i};
}

/// `head_select="all"` has no GPU kernel (convert-moe-to-gpu lowers the
/// min-entropy head only): on CUDA tensors the call runs the eager reference
/// `moe_mlir.reference.<name>` on them.
std::vector<Tensor> allHeadsReference(const char *name,
                                      const std::vector<c10::IValue> &args) {
  Gil gil;
  PyObject *module = PyImport_ImportModule("moe_mlir.reference");
  if (!module)
    rethrowPython();
  PyObject *fn = PyObject_GetAttrString(module, name);
  Py_DECREF(module);
  if (!fn)
    rethrowPython();
  PyObject *tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  for (size_t i = 0; i < args.size(); ++i)
    PyTuple_SET_ITEM(tuple, i, toPython(args[i]));
  PyObject *result = PyObject_CallObject(fn, tuple);
  Py_DECREF(tuple);
  Py_DECREF(fn);
  if (!result)
    rethrowPython();
  std::vector<Tensor> out;
  for (Py_ssize_t i = 0; i < PyTuple_Size(result); ++i)
    out.push_back(THPVariable_Unpack(PyTuple_GET_ITEM(result, i)));
  Py_DECREF(result);
  return out;
}

void attentionKey(Key &key, const Tensor &scores, const Tensor &u,
                  const Tensor &v, const Tensor &wo, const Tensor &e) {
  key.in("scores", scores, {0, 2, 3})
      .in("u", u, {0, 1})
      .in("v", v, {0, 2})
      .in("wo", wo)
      .in("e", e, {0, 1});
}

std::vector<MemRef> attentionArgs(const Tensor &scores, const Tensor &u,
                                  const Tensor &v, const Tensor &wo,
                                  const Tensor &e, std::vector<Tensor> &keep) {
  keep = {contig(scores), contig(u), contig(v), contig(wo), contig(e)};
  return describeAll(keep);
}

std::tuple<Tensor, Tensor>
attentionPosterior(const Tensor &scores, const Tensor &u, const Tensor &v,
                   const Tensor &wo, const Tensor &e, double sigma,
                   c10::string_view headSelect,
                   std::optional<double> headScale) {
  const char *op = "attention_posterior";
  checkDevice(op, {&scores, &u, &v, &wo, &e});
  Key key(op);
  key.attr("sigma", sigma).attr("head_select", headSelect).attr("head_scale",
                                                               headScale);
  attentionKey(key, scores, u, v, wo, e);
  if (scores.is_cuda() && headSelect == "all") {
    validateOnly(key); // the reference does not validate
    std::vector<Tensor> r = allHeadsReference(
        op, {scores, u, v, wo, e, sigma, std::string(headSelect), headScale});
    return {r.at(0), r.at(1)};
  }
  KernelFn fn = lookup(key);
  // [B, N, K]: N from the scores, K from e, so neither bounds it (ops/mixing.py
  // checks it too, but a key in memory skips that for other B and N).
  std::array<int64_t, 3> pShape{scores.size(0), scores.size(2), e.size(2)};
  checkResultElements(op, "p", pShape);
  std::vector<Tensor> keep;
  std::vector<MemRef> args = attentionArgs(scores, u, v, wo, e, keep);
  Tensor p = at::empty(pShape, f32(e));
  Tensor head = at::empty({scores.size(0)}, i32(e));
  args.push_back(describe(p));
  args.push_back(describe(head));
  launch(fn, args, key.device);
  return {p, head};
}

std::tuple<Tensor, Tensor, Tensor>
attentionPosteriorTopk(const Tensor &scores, const Tensor &u, const Tensor &v,
                       const Tensor &wo, const Tensor &e, int64_t k,
                       double sigma, c10::string_view headSelect,
                       std::optional<double> headScale, bool renormalize) {
  const char *op = "attention_posterior_topk";
  checkDevice(op, {&scores, &u, &v, &wo, &e});
  Key key(op);
  key.attr("k", k)
      .attr("renormalize", renormalize)
      .attr("sigma", sigma)
      .attr("head_select", headSelect)
      .attr("head_scale", headScale);
  attentionKey(key, scores, u, v, wo, e);
  std::array<int64_t, 3> shape{scores.size(0), scores.size(2), k};
  if (scores.is_cuda() && headSelect == "all") {
    validateOnly(key); // the reference does not validate
    std::vector<Tensor> r = allHeadsReference(
        op, {scores, u, v, wo, e, k, renormalize, sigma,
             std::string(headSelect), headScale});
    return {r.at(0), r.at(1), r.at(2)};
  }
  KernelFn fn = lookup(key); // validates k against K before any allocation
  // [B, N, k]: N from the scores, k <= K from e, so neither bounds it.
  checkResultElements(op, "weights", shape);
  std::vector<Tensor> keep;
  std::vector<MemRef> args = attentionArgs(scores, u, v, wo, e, keep);
  Tensor w = at::empty(shape, f32(e)), i = at::empty(shape, i32(e));
  Tensor head = at::empty({scores.size(0)}, i32(e));
  args.push_back(describe(w));
  args.push_back(describe(i));
  args.push_back(describe(head));
  launch(fn, args, key.device);
  return {w, i, head};
}

std::tuple<Tensor, Tensor> madDispersion(const Tensor &tokens,
                                         const Tensor &assign,
                                         int64_t numExperts, double eps,
                                         double clip, c10::string_view normalize,
                                         c10::string_view measure,
                                         c10::string_view empty) {
  const char *op = "mad_dispersion";
  checkDevice(op, {&tokens, &assign});
  Key key(op);
  key.attr("num_experts", numExperts)
      .attr("eps", eps)
      .attr("clip", clip)
      .attr("normalize", normalize)
      .attr("measure", measure)
      .attr("empty", empty);
  key.in("tokens", tokens, {0}).in("assign", assign, {0});
  // Validates num_experts (and the size of the [E, D] result) first.
  KernelFn fn = lookup(key);
  Tensor x = contig(tokens), a = contig(assign);
  Tensor w = at::empty({numExperts, tokens.size(1)}, f32(tokens));
  Tensor counts = at::empty({numExperts}, i32(tokens));
  launch(fn, key.device, {x, a, w, counts});
  return {w, counts};
}

Tensor adjacencyUpdate(const Tensor &a, const Tensor &idx, double beta,
                       c10::string_view norm, bool includeSelf) {
  const char *op = "adjacency_update";
  checkDevice(op, {&a, &idx});
  Key key(op);
  key.attr("beta", beta).attr("norm", norm).attr("include_self", includeSelf);
  key.in("a", a).in("idx", idx, {0});
  KernelFn fn = lookup(key);
  Tensor ac = contig(a), ic = contig(idx);
  Tensor out = at::empty(a.sizes(), f32(a));
  launch(fn, key.device, {ac, ic, out});
  return out;
}

std::tuple<Tensor, Tensor> hyperRouter(const Tensor &emb, const Tensor &w1,
                                       const Tensor &b1, const Tensor &w2,
                                       const Tensor &b2, int64_t numExperts) {
  const char *op = "hyper_router";
  checkDevice(op, {&emb, &w1, &b1, &w2, &b2});
  Key key(op);
  key.attr("num_experts", numExperts);
  key.in("emb", emb).in("w1", w1).in("b1", b1).in("w2", w2).in("b2", b2);
  // The torch op allows D = 0 (a router of biases only), the dialect does
  // not: validate, then compute that degenerate case with ATen.
  if (numExperts >= 1 && w2.dim() == 2 && w2.size(0) == numExperts) {
    validateOnly(key);
    Tensor hidden = at::relu(at::matmul(w1.to(at::kFloat), emb.to(at::kFloat)) +
                             b1.to(at::kFloat));
    Tensor b = at::matmul(w2.to(at::kFloat), hidden) + b2.to(at::kFloat);
    return {at::empty({numExperts, 0}, f32(emb)), b};
  }
  KernelFn fn = lookup(key); // validates the shapes first
  int64_t d = w2.size(0) / numExperts - 1;
  Tensor w = at::empty({numExperts, d}, f32(emb));
  Tensor b = at::empty({numExperts}, f32(emb));
  launch(fn, key.device,
         {contig(emb), contig(w1), contig(b1), contig(w2), contig(b2), w, b});
  return {w, b};
}

} // namespace moe_torch

using namespace moe_torch;

//===----------------------------------------------------------------------===//
// Autograd of the stop-gradient ops and moe.route
//===----------------------------------------------------------------------===//
//
// The differentiable dialect ops have their autograd in C++ (Autograd.cpp).
// For the others the Python autograd of the custom op (a Python kernel at the
// Autograd key) would run on every call, gradients or not. This boxed kernel
// at AutogradCPU/AutogradCUDA takes the common case in C++: no input requires
// grad (or grad mode is off, or the op is stop-gradient) -> straight to the
// backend kernel. Otherwise (moe.route with gradients) it hands the call to
// Python (ops._autograd_call: the op's registered recompute backward).

PyObject *gradPath = nullptr; // gradPath(name, keyset, args: tuple) -> outputs

PyObject *toPython(const c10::IValue &v) {
  if (v.isTensor())
    return THPVariable_Wrap(v.toTensor());
  if (v.isNone())
    Py_RETURN_NONE;
  if (v.isBool())
    return PyBool_FromLong(v.toBool());
  if (v.isInt())
    return PyLong_FromLongLong(v.toInt());
  if (v.isDouble())
    return PyFloat_FromDouble(v.toDouble());
  if (v.isString())
    return PyUnicode_FromString(v.toStringRef().c_str());
  TORCH_CHECK(false, "moe: internal error: argument of type ", v.tagKind());
}

void gradThroughPython(const c10::OperatorHandle &op, c10::DispatchKeySet ks,
                       torch::jit::Stack *stack) {
  size_t n = op.schema().arguments().size();
  const std::string &full = op.schema().name();
  std::string name = full.substr(full.find("::") + 2);
  Gil gil;
  PyObject *args = PyTuple_New(static_cast<Py_ssize_t>(n));
  for (size_t i = 0; i < n; ++i)
    PyTuple_SET_ITEM(args, i, toPython((*stack)[stack->size() - n + i]));
  PyObject *keyset = pybind11::cast(ks).release().ptr();
  PyObject *result = callPython(
      gradPath, Py_BuildValue("(sNN)", name.c_str(), keyset, args));
  torch::jit::drop(*stack, n);
  if (THPVariable_Check(result)) {
    stack->emplace_back(THPVariable_Unpack(result));
  } else {
    for (Py_ssize_t i = 0; i < PyTuple_Size(result); ++i)
      stack->emplace_back(THPVariable_Unpack(PyTuple_GET_ITEM(result, i)));
  }
  Py_DECREF(result);
}

namespace {
template <bool Differentiable>
void autogradCpu(const c10::OperatorHandle &op, c10::DispatchKeySet ks,
                 torch::jit::Stack *stack) {
  if (Differentiable && at::GradMode::is_enabled()) {
    size_t n = op.schema().arguments().size();
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      const c10::IValue &v = (*stack)[i];
      if (v.isTensor() && v.toTensor().requires_grad())
        return gradThroughPython(op, ks, stack);
    }
  }
  // As the custom op's own autograd kernel does without gradients.
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}
} // namespace

torch::CppFunction moe_torch::autogradKernel(bool differentiable) {
  if (differentiable)
    return torch::CppFunction::makeFromBoxedFunction<&autogradCpu<true>>();
  return torch::CppFunction::makeFromBoxedFunction<&autogradCpu<false>>();
}

//===----------------------------------------------------------------------===//
// The entry points of python/moe_mlir/runtime/extension.py
//===----------------------------------------------------------------------===//

/// Called once by python/moe_mlir/runtime (through ctypes at import): the
/// kernel cache's `load(key: str, shapes: str) -> int`.
extern "C" __attribute__((visibility("default"))) void
moeTorchSetLoader(PyObject *fn, PyObject *grad) {
  moe_torch::setLoader(fn);
  Py_XINCREF(grad);
  Py_XDECREF(gradPath);
  gradPath = grad;
  moeSetErrorEcho(0);
}

/// Forgets the in-memory kernel addresses (tests: the next call asks the
/// Python cache again).
extern "C" __attribute__((visibility("default"))) void moeTorchClearKernels() {
  moe_torch::clearKernels();
}
