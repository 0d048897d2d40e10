//===- AutogradOps.h - Shared pieces of the autograd kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What the AutogradCPU/AutogradCUDA kernels of Autograd.cpp (the mixing and
// routing ops), BalanceOps.cpp (the load-balancing ops) and GroupedMmEnds.cpp
// share: the typed call of an op below autograd, the test for whether a graph
// is needed, the cast of a gradient to its input's dtype, and the error node
// of a differentiable-once backward.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_AUTOGRADOPS_H
#define MOE_LIB_RUNTIME_TORCH_AUTOGRADOPS_H

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <utility>
#include <vector>

namespace moe_torch {

/// `moe::<name>` typed as `Sig`, looked up once per op.
template <typename Sig> struct Op {
  explicit Op(const char *name)
      : handle(c10::Dispatcher::singleton()
                   .findSchemaOrThrow(name, "")
                   .template typed<Sig>()) {}
  /// The call below autograd (the backend kernel; no graph).
  template <typename... Args> auto operator()(Args &&...args) const {
    at::AutoDispatchBelowADInplaceOrView guard;
    return handle.call(std::forward<Args>(args)...);
  }
  c10::TypedOperatorHandle<Sig> handle;
};

inline bool requiresGrad(const at::Tensor &t) { return t.requires_grad(); }
inline bool requiresGrad(const std::optional<at::Tensor> &t) {
  return t && t->requires_grad();
}
/// Grad mode is on and one of `ts` requires grad: the op builds a graph node.
template <typename... Ts> bool needsGraph(const Ts &...ts) {
  return at::GradMode::is_enabled() && (requiresGrad(ts) || ...);
}

/// `g` in `like`'s dtype (a gradient of the input `like`), cast below
/// autograd.
inline at::Tensor castLike(const at::Tensor &g, const at::Tensor &like) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return g.scalar_type() == like.scalar_type() ? g : g.to(like.scalar_type());
}

/// The gradients a backward returns. Under create_graph (grad mode on in the
/// backward) each defined one becomes an output of an error node: the backward
/// kernels are differentiable once, and differentiating again says so, naming
/// `op` ("moe.topk_renorm"). Defined in Autograd.cpp.
std::vector<at::Tensor> differentiableOnce(std::vector<at::Tensor> grads,
                                           const char *op);

} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_AUTOGRADOPS_H
