//===- Autograd.cpp - The autograd of the differentiable torch.ops.moe -----===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The AutogradCPU and AutogradCUDA kernels of topk_renorm, similarity_inform,
// similarity_inform_topk, attention_posterior, attention_posterior_topk and
// hyper_router: one torch::autograd::Function per op, in C++, so that a
// training step pays no Python per call (python/moe_mlir/ops/ keeps its
// Python autograd only for when this extension is not loaded).
//
// * No input requires grad (or grad mode is off): the op's kernel below
//   autograd, no graph node.
// * Else the Function's forward calls the op below autograd (the CPU or CUDA
//   kernel, or the eager reference the op registers for other devices) and
//   saves what the backward reads: the operands, and the forward's choice
//   (top-k indices, the chosen head), which are outputs without gradient
//   (mark_non_differentiable).
// * The backward calls the backward ops (torch.ops.moe.*_backward, GradOps.cpp
//   on the CPU) through the dispatcher, below autograd: AOTAutograd records
//   them as graph nodes, CUDA tensors take what CUDA registers. It returns a
//   gradient only for the inputs that need one (ctx->needs_input_grad), cast
//   to the input's dtype; an undefined output gradient is no gradient. The
//   fused forms recompute p with the mixing op's forward kernel (O(N) memory)
//   and chain topk_renorm_backward on the saved choice.
// * The backward ops are differentiable once: under create_graph the
//   gradients carry an error node, so differentiating them again raises a
//   clear error (as Python's once_differentiable).
//
// Dtypes: the ops take f32/f16/bf16 (the dialect's MoE_FloatTensor); float64
// raises the forward's TypeError before any graph is built.
//
//===----------------------------------------------------------------------===//

#include "AutogradOps.h"
#include "TorchOps.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>

namespace {

using at::Tensor;
using moe_torch::castLike;
using moe_torch::differentiableOnce;
using moe_torch::needsGraph;
using moe_torch::Op;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<Tensor>;

// The ops' schemas (python/moe_mlir/ops/) as C++ signatures: `SymInt` ->
// c10::SymInt, `str` -> c10::string_view, `Tensor?` -> const
// std::optional<Tensor> &.
using TopkSig = std::tuple<Tensor, Tensor>(const Tensor &, c10::SymInt,
                                           c10::string_view, bool,
                                           std::optional<at::ScalarType>);
using TopkBwdSig = Tensor(const Tensor &, const Tensor &, const Tensor &,
                          c10::string_view, bool);
using SimSig = Tensor(const Tensor &, const Tensor &, const OptTensor &,
                      const OptTensor &, double, bool);
using SimTopkSig = std::tuple<Tensor, Tensor>(
    const Tensor &, const Tensor &, c10::SymInt, const OptTensor &,
    const OptTensor &, double, bool, bool);
using SimFwdSig = std::tuple<Tensor, Tensor>(const Tensor &, const Tensor &,
                                             const OptTensor &,
                                             const OptTensor &, double, bool);
using SimBwdSig = std::tuple<Tensor, Tensor, Tensor>(
    const Tensor &, const Tensor &, const Tensor &, const OptTensor &,
    const OptTensor &, double, bool, const OptTensor &, const OptTensor &);
using PostSig = std::tuple<Tensor, Tensor>(
    const Tensor &, const Tensor &, const Tensor &, const Tensor &,
    const Tensor &, double, c10::string_view, std::optional<double>);
using PostTopkSig = std::tuple<Tensor, Tensor, Tensor>(
    const Tensor &, const Tensor &, const Tensor &, const Tensor &,
    const Tensor &, c10::SymInt, double, c10::string_view,
    std::optional<double>, bool);
using PostBwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor &, const Tensor &, const Tensor &, const Tensor &,
    const Tensor &, const Tensor &, const OptTensor &, double,
    c10::string_view, std::optional<double>);
using HyperSig = std::tuple<Tensor, Tensor>(const Tensor &, const Tensor &,
                                            const Tensor &, const Tensor &,
                                            const Tensor &, c10::SymInt);
using HyperBwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor &, const Tensor &, const Tensor &, const Tensor &,
    const Tensor &, const Tensor &, const Tensor &, c10::SymInt, bool);

#define MOE_OP(var, Sig, name)                                                 \
  static const Op<Sig> var { "moe::" name }

Tensor orUndefined(const OptTensor &t) { return t ? *t : Tensor(); }
OptTensor present(const Tensor &t) {
  return t.defined() ? OptTensor(t) : std::nullopt;
}

/// `g` cast to `like`'s dtype where `need`, else undefined (no gradient).
Tensor gradAs(bool need, const Tensor &g, const Tensor &like) {
  if (!need || !like.defined())
    return Tensor();
  return castLike(g, like);
}

/// ctx->needs_input_grad for the tensor inputs in forward order: the context
/// numbers the tensors that were passed (an absent optional has no edge).
class Needs {
public:
  Needs(AutogradContext *ctx, std::initializer_list<bool> passed) {
    size_t edge = 0;
    for (bool p : passed)
      need.push_back(p && ctx->needs_input_grad(edge++));
  }
  bool operator[](size_t i) const { return need[i]; }
  bool any() const {
    return std::find(need.begin(), need.end(), true) != need.end();
  }

private:
  std::vector<bool> need;
};

//===----------------------------------------------------------------------===//
// topk_renorm
//===----------------------------------------------------------------------===//

struct TopkRenorm : torch::autograd::Function<TopkRenorm> {
  static variable_list forward(AutogradContext *ctx, const Tensor &scores,
                               c10::SymInt k, c10::string_view mode,
                               bool renormalize,
                               std::optional<at::ScalarType> indicesDtype) {
    MOE_OP(op, TopkSig, "topk_renorm");
    auto [w, idx] = op(scores, std::move(k), mode, renormalize, indicesDtype);
    ctx->mark_non_differentiable({idx});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({scores, idx});
    ctx->saved_data["mode"] = std::string(mode);
    ctx->saved_data["renormalize"] = renormalize;
    return {w, idx};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    MOE_OP(op, TopkBwdSig, "topk_renorm_backward");
    variable_list saved = ctx->get_saved_variables();
    const Tensor &gradW = grads[0];
    variable_list out(5);
    if (!gradW.defined() || !ctx->needs_input_grad(0))
      return out;
    Tensor g = op(gradW, saved[0], saved[1],
                  ctx->saved_data["mode"].toStringRef(),
                  ctx->saved_data["renormalize"].toBool());
    out[0] = gradAs(true, g, saved[0]);
    return differentiableOnce(std::move(out), "moe.topk_renorm");
  }
};

} // namespace

std::tuple<Tensor, Tensor>
moe_torch::topkRenormAutograd(const Tensor &scores, c10::SymInt k,
                              c10::string_view mode, bool renormalize,
                              std::optional<at::ScalarType> indicesDtype) {
  if (!needsGraph(scores)) {
    MOE_OP(op, TopkSig, "topk_renorm");
    return op(scores, std::move(k), mode, renormalize, indicesDtype);
  }
  variable_list r = TopkRenorm::apply(scores, std::move(k), mode, renormalize,
                                      indicesDtype);
  return {r[0], r[1]};
}

namespace {

//===----------------------------------------------------------------------===//
// similarity_inform, similarity_inform_topk
//===----------------------------------------------------------------------===//

/// Saves the Similarity-Inform operands and attributes (u, e, ws, key_mask,
/// then `extra`: the fused form's indices; then the forward's p and lse when
/// it saved them).
void saveSimilarity(AutogradContext *ctx, const Tensor &u, const Tensor &e,
                    const OptTensor &ws, const OptTensor &mask, double tau,
                    bool causal, const Tensor &extra = Tensor(),
                    const Tensor &p = Tensor(), const Tensor &lse = Tensor()) {
  ctx->set_materialize_grads(false);
  ctx->save_for_backward(
      {u, e, orUndefined(ws), orUndefined(mask), extra, p, lse});
  ctx->saved_data["tau"] = tau;
  ctx->saved_data["causal"] = causal;
}

/// (p, lse) of the training forward.
std::tuple<Tensor, Tensor> similarityForward(const Tensor &u, const Tensor &e,
                                             const OptTensor &ws,
                                             const OptTensor &mask, double tau,
                                             bool causal) {
  MOE_OP(op, SimFwdSig, "similarity_inform_fwd");
  return op(u, e, ws, mask, tau, causal);
}

/// (du, de, dws) of `gradP` on the saved operands, as the input list of
/// similarity_inform's positions (u, e, ws), only where `need`.
std::array<Tensor, 3> similarityGrads(AutogradContext *ctx,
                                      const variable_list &saved,
                                      const Tensor &gradP,
                                      std::array<bool, 3> need) {
  MOE_OP(op, SimBwdSig, "similarity_inform_backward");
  const Tensor &u = saved[0], &e = saved[1], &ws = saved[2];
  auto [du, de, dws] =
      op(gradP, u, e, present(ws), present(saved[3]),
         ctx->saved_data["tau"].toDouble(), ctx->saved_data["causal"].toBool(),
         present(saved[5]), present(saved[6]));
  return {gradAs(need[0], du, u), gradAs(need[1], de, e),
          gradAs(need[2], dws, ws)};
}

struct SimilarityInform : torch::autograd::Function<SimilarityInform> {
  static Tensor forward(AutogradContext *ctx, const Tensor &u, const Tensor &e,
                        const OptTensor &ws, const OptTensor &mask,
                        double tau, bool causal) {
    // p and its row log-sum-exp saved, so that the backward does not run
    // the forward again.
    auto [p, lse] = similarityForward(u, e, ws, mask, tau, causal);
    saveSimilarity(ctx, u, e, ws, mask, tau, causal, Tensor(), p, lse);
    return p;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    Needs n(ctx, {true, true, saved[2].defined(), saved[3].defined()});
    variable_list out(6);
    if (!grads[0].defined() || !(n[0] || n[1] || n[2]))
      return out;
    auto g = similarityGrads(ctx, saved, grads[0], {n[0], n[1], n[2]});
    std::copy(g.begin(), g.end(), out.begin());
    return differentiableOnce(std::move(out), "moe.similarity_inform");
  }
};

} // namespace

Tensor moe_torch::similarityInformAutograd(const Tensor &u, const Tensor &e,
                                           const OptTensor &ws,
                                           const OptTensor &mask, double tau,
                                           bool causal) {
  if (!needsGraph(u, e, ws)) {
    MOE_OP(op, SimSig, "similarity_inform");
    return op(u, e, ws, mask, tau, causal);
  }
  return SimilarityInform::apply(u, e, ws, mask, tau, causal);
}

namespace {

struct SimilarityInformTopk : torch::autograd::Function<SimilarityInformTopk> {
  static variable_list forward(AutogradContext *ctx, const Tensor &u,
                               const Tensor &e, c10::SymInt k,
                               const OptTensor &ws, const OptTensor &mask,
                               double tau, bool causal, bool renormalize) {
    ctx->saved_data["renormalize"] = renormalize;
    // The fused kernel's top-k epilogue, unfused: p (and lse) are what the
    // backward needs, and the gate on p is the same algorithm (TopK.h), so
    // the weights and indices are the fused kernel's bits.
    MOE_OP(gate, TopkSig, "topk_renorm");
    auto [p, lse] = similarityForward(u, e, ws, mask, tau, causal);
    auto [w, idx] = gate(p, std::move(k), "probs", renormalize, std::nullopt);
    ctx->mark_non_differentiable({idx});
    saveSimilarity(ctx, u, e, ws, mask, tau, causal, idx, p, lse);
    return {w, idx};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    MOE_OP(gate, TopkBwdSig, "topk_renorm_backward");
    variable_list saved = ctx->get_saved_variables();
    Needs n(ctx, {true, true, saved[2].defined(), saved[3].defined()});
    variable_list out(8);
    if (!grads[0].defined() || !(n[0] || n[1] || n[2]))
      return out;
    // The gate's closed-form backward on the saved choice and p.
    Tensor gradP = gate(grads[0], saved[5], saved[4], "probs",
                        ctx->saved_data["renormalize"].toBool());
    auto g = similarityGrads(ctx, saved, gradP, {n[0], n[1], n[2]});
    out[0] = g[0];
    out[1] = g[1];
    out[3] = g[2];
    return differentiableOnce(std::move(out), "moe.similarity_inform_topk");
  }
};

} // namespace

std::tuple<Tensor, Tensor> moe_torch::similarityInformTopkAutograd(
    const Tensor &u, const Tensor &e, c10::SymInt k, const OptTensor &ws,
    const OptTensor &mask, double tau, bool causal, bool renormalize) {
  if (!needsGraph(u, e, ws)) {
    MOE_OP(op, SimTopkSig, "similarity_inform_topk");
    return op(u, e, std::move(k), ws, mask, tau, causal, renormalize);
  }
  variable_list r = SimilarityInformTopk::apply(u, e, std::move(k), ws, mask,
                                                tau, causal, renormalize);
  return {r[0], r[1]};
}

namespace {

//===----------------------------------------------------------------------===//
// attention_posterior, attention_posterior_topk
//===----------------------------------------------------------------------===//

/// Saves the five operands, then `choice` (the chosen head; the fused form's
/// indices before it), and the attributes.
void savePosterior(AutogradContext *ctx, variable_list operandsAndChoice,
                   double sigma, c10::string_view headSelect,
                   std::optional<double> headScale) {
  ctx->set_materialize_grads(false);
  ctx->save_for_backward(operandsAndChoice);
  ctx->saved_data["sigma"] = sigma;
  ctx->saved_data["head_select"] = std::string(headSelect);
  ctx->saved_data["head_scale"] = headScale;
}

/// The five operand gradients of `gradP` at the saved head, where `need`.
std::array<Tensor, 5> posteriorGrads(AutogradContext *ctx,
                                     const variable_list &saved,
                                     const Tensor &head, const Tensor &gradP,
                                     const Needs &need) {
  MOE_OP(op, PostBwdSig, "attention_posterior_backward");
  const std::string &headSelect = ctx->saved_data["head_select"].toStringRef();
  c10::IValue scale = ctx->saved_data["head_scale"];
  // The gradient mixes every head for "all": no head passed.
  OptTensor h = headSelect == "min_entropy" ? OptTensor(head) : std::nullopt;
  auto [ds, du, dv, dwo, de] =
      op(gradP, saved[0], saved[1], saved[2], saved[3], saved[4], h,
         ctx->saved_data["sigma"].toDouble(), headSelect,
         scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()));
  std::array<Tensor, 5> g{ds, du, dv, dwo, de};
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = gradAs(need[i], g[i], saved[i]);
  return g;
}

struct AttentionPosterior : torch::autograd::Function<AttentionPosterior> {
  static variable_list forward(AutogradContext *ctx, const Tensor &scores,
                               const Tensor &u, const Tensor &v,
                               const Tensor &wo, const Tensor &e, double sigma,
                               c10::string_view headSelect,
                               std::optional<double> headScale) {
    MOE_OP(op, PostSig, "attention_posterior");
    auto [p, head] = op(scores, u, v, wo, e, sigma, headSelect, headScale);
    ctx->mark_non_differentiable({head});
    savePosterior(ctx, {scores, u, v, wo, e, head}, sigma, headSelect,
                  headScale);
    return {p, head};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    Needs n(ctx, {true, true, true, true, true});
    variable_list out(8);
    if (!grads[0].defined() || !n.any())
      return out;
    auto g = posteriorGrads(ctx, saved, saved[5], grads[0], n);
    std::copy(g.begin(), g.end(), out.begin());
    return differentiableOnce(std::move(out), "moe.attention_posterior");
  }
};

} // namespace

std::tuple<Tensor, Tensor> moe_torch::attentionPosteriorAutograd(
    const Tensor &scores, const Tensor &u, const Tensor &v, const Tensor &wo,
    const Tensor &e, double sigma, c10::string_view headSelect,
    std::optional<double> headScale) {
  if (!needsGraph(scores, u, v, wo, e)) {
    MOE_OP(op, PostSig, "attention_posterior");
    return op(scores, u, v, wo, e, sigma, headSelect, headScale);
  }
  variable_list r = AttentionPosterior::apply(scores, u, v, wo, e, sigma,
                                              headSelect, headScale);
  return {r[0], r[1]};
}

namespace {

struct AttentionPosteriorTopk
    : torch::autograd::Function<AttentionPosteriorTopk> {
  static variable_list forward(AutogradContext *ctx, const Tensor &scores,
                               const Tensor &u, const Tensor &v,
                               const Tensor &wo, const Tensor &e,
                               c10::SymInt k, double sigma,
                               c10::string_view headSelect,
                               std::optional<double> headScale,
                               bool renormalize) {
    MOE_OP(op, PostTopkSig, "attention_posterior_topk");
    auto [w, idx, head] = op(scores, u, v, wo, e, std::move(k), sigma,
                             headSelect, headScale, renormalize);
    ctx->mark_non_differentiable({idx, head});
    savePosterior(ctx, {scores, u, v, wo, e, idx, head}, sigma, headSelect,
                  headScale);
    ctx->saved_data["renormalize"] = renormalize;
    return {w, idx, head};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    MOE_OP(post, PostSig, "attention_posterior");
    MOE_OP(gate, TopkBwdSig, "topk_renorm_backward");
    variable_list saved = ctx->get_saved_variables();
    Needs n(ctx, {true, true, true, true, true});
    variable_list out(10);
    if (!grads[0].defined() || !n.any())
      return out;
    // p recomputed by the forward kernel (O(N) memory), the gate's
    // closed-form backward on the saved choice, then the posterior's backward
    // at the saved head.
    c10::IValue scale = ctx->saved_data["head_scale"];
    Tensor p = std::get<0>(post(
        saved[0], saved[1], saved[2], saved[3], saved[4],
        ctx->saved_data["sigma"].toDouble(),
        ctx->saved_data["head_select"].toStringRef(),
        scale.isNone() ? std::nullopt
                       : std::optional<double>(scale.toDouble())));
    Tensor gradP = gate(grads[0], p, saved[5], "probs",
                        ctx->saved_data["renormalize"].toBool());
    auto g = posteriorGrads(ctx, saved, saved[6], gradP, n);
    std::copy(g.begin(), g.end(), out.begin());
    return differentiableOnce(std::move(out), "moe.attention_posterior_topk");
  }
};

} // namespace

std::tuple<Tensor, Tensor, Tensor> moe_torch::attentionPosteriorTopkAutograd(
    const Tensor &scores, const Tensor &u, const Tensor &v, const Tensor &wo,
    const Tensor &e, c10::SymInt k, double sigma, c10::string_view headSelect,
    std::optional<double> headScale, bool renormalize) {
  if (!needsGraph(scores, u, v, wo, e)) {
    MOE_OP(op, PostTopkSig, "attention_posterior_topk");
    return op(scores, u, v, wo, e, std::move(k), sigma, headSelect, headScale,
              renormalize);
  }
  variable_list r =
      AttentionPosteriorTopk::apply(scores, u, v, wo, e, std::move(k), sigma,
                                    headSelect, headScale, renormalize);
  return {r[0], r[1], r[2]};
}

namespace {

//===----------------------------------------------------------------------===//
// hyper_router
//===----------------------------------------------------------------------===//

struct HyperRouter : torch::autograd::Function<HyperRouter> {
  static variable_list forward(AutogradContext *ctx, const Tensor &emb,
                               const Tensor &w1, const Tensor &b1,
                               const Tensor &w2, const Tensor &b2,
                               c10::SymInt numExperts) {
    MOE_OP(op, HyperSig, "hyper_router");
    auto [w, b] = op(emb, w1, b1, w2, b2, numExperts);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({emb, w1, b1, w2, b2});
    ctx->saved_data["num_experts"] = std::move(numExperts);
    return {w, b};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    MOE_OP(op, HyperBwdSig, "hyper_router_backward");
    variable_list s = ctx->get_saved_variables();
    Needs n(ctx, {true, true, true, true, true});
    variable_list out(6);
    Tensor gradW = grads[0], gradB = grads[1];
    if (!n.any() || (!gradW.defined() && !gradB.defined()))
      return out;
    c10::SymInt E = ctx->saved_data["num_experts"].toSymInt();
    // Every operand's gradient: a frozen hypernetwork (w1..b2 without grad)
    // still passes gradient to emb (002 §1.10).
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      at::TensorOptions f32 = s[0].options().dtype(at::kFloat);
      if (!gradW.defined())
        gradW = at::zeros_symint({E, s[3].sym_size(0) / E - 1}, f32);
      if (!gradB.defined())
        gradB = at::zeros_symint({E}, f32);
    }
    // The weight matrices' gradients (two outer products, the size of the
    // hypernetwork) only when one of them is trained, as eager autograd.
    bool weightGrads = n[1] || n[3];
    auto [de, dw1, db1, dw2, db2] = op(gradW, gradB, s[0], s[1], s[2], s[3],
                                       s[4], std::move(E), weightGrads);
    std::array<Tensor, 5> g{de, dw1, db1, dw2, db2};
    for (size_t i = 0; i < g.size(); ++i)
      out[i] = gradAs(n[i], g[i], s[i]);
    return differentiableOnce(std::move(out), "moe.hyper_router");
  }
};

} // namespace

std::tuple<Tensor, Tensor>
moe_torch::hyperRouterAutograd(const Tensor &emb, const Tensor &w1,
                               const Tensor &b1, const Tensor &w2,
                               const Tensor &b2, c10::SymInt numExperts) {
  if (!needsGraph(emb, w1, b1, w2, b2)) {
    MOE_OP(op, HyperSig, "hyper_router");
    return op(emb, w1, b1, w2, b2, std::move(numExperts));
  }
  variable_list r =
      HyperRouter::apply(emb, w1, b1, w2, b2, std::move(numExperts));
  return {r[0], r[1]};
}

variable_list moe_torch::differentiableOnce(variable_list grads,
                                            const char *op) {
  if (!at::GradMode::is_enabled())
    return grads;
  variable_list defined;
  for (const Tensor &g : grads)
    if (g.defined())
      defined.push_back(g.detach().requires_grad_(true));
  if (defined.empty())
    return grads;
  auto error = std::make_shared<torch::autograd::DelayedError>(
      std::string(op) +
          ": double backward is not supported (the gradient of its backward "
          "op is not implemented; the op is differentiable once)",
      static_cast<int64_t>(defined.size()));
  variable_list wrapped = error->apply(std::move(defined));
  size_t next = 0;
  for (Tensor &g : grads)
    if (g.defined())
      g = wrapped[next++];
  return grads;
}
