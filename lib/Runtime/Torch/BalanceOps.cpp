//===- BalanceOps.cpp - torch.ops.moe load-balancing losses on our kernels
//-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CPU kernels and the C++ autograd of the load-balancing ops
// (python/moe_mlir/ops/balance.py; the dialect ops of MoEBalanceOps.td):
//
// * router_stats_fwd (moe.router_stats: counts, mean_probs, weight_sum), and
//   on it router_stats and load_balancing_loss (the E-long reduction
//   E · Σ (counts / W) · P in torch, as transformers writes it);
// * router_z_loss, sequence_balance_loss;
// * the backward ops router_stats_backward, router_z_loss_backward and
//   sequence_balance_loss_backward (the *_grad ops).
//
// The token dimension T (B and S for the sequence loss) is dynamic in the
// kernel key: one compiled kernel per (E, k, dtypes). f64 inputs run in f32
// (the kernels' dtypes; the results are f32 and the gradients are cast back).
// Autograd (AutogradCPU): the forward saves what the backward reads (the
// logits and the statistics counts and W, so the backward is one pass over
// the logits, not a recompute of the forward), the backward calls the
// backward ops through the dispatcher.
//
//===----------------------------------------------------------------------===//

#include "AutogradOps.h"
#include "TorchKernels.h"
#include "TorchOps.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include <limits>
#include <optional>
#include <tuple>

using namespace moe_torch;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<Tensor>;

/// f64 operands run in f32 (the kernels take f32/f16/bf16).
static Tensor kernelFloat(const Tensor &t) {
  return t.scalar_type() == at::kDouble ? t.to(at::kFloat) : t;
}

/// The token weights as f32 (any dtype multiplies, as transformers' mask).
static Tensor maskF32(const Tensor &m) {
  return m.scalar_type() == at::kFloat ? m : m.to(at::kFloat);
}

static void checkLogitDtype(const char *op, const char *name, const Tensor &t) {
  at::ScalarType d = t.scalar_type();
  TORCH_CHECK_TYPE(d == at::kFloat || d == at::kHalf || d == at::kBFloat16 ||
                       d == at::kDouble,
                   "moe.", op, ": '", name,
                   "' must be f32, f16, bf16 or f64, got ", d);
}

/// What the router ops take beyond their key's op, which the verifier
/// checks: f64 logits (computed in f32) and the operands on one device.
static void checkRouterOperands(const char *op, const Tensor &logits,
                                const OptTensor &mask) {
  checkDevice(op, {&logits});
  checkLogitDtype(op, "logits", logits);
  if (mask)
    checkDevice(op, {&logits, &*mask});
}

/// The key of router_stats_fwd on `logits` and `mask` as the kernel reads
/// them (f64 logits and a mask of any dtype as f32), errors naming `op`.
static Key routerStatsKey(const char *op, const Tensor &logits,
                          const OptTensor &mask, int64_t topK) {
  Key key("router_stats_fwd");
  key.namedAs(op).attr("top_k", topK);
  at::ScalarType x = logits.scalar_type() == at::kDouble ? at::kFloat
                                                         : logits.scalar_type();
  key.in("logits", x, logits.sizes(), {0}, logits.device());
  if (mask)
    key.in("token_mask", at::kFloat, mask->sizes(), {0}, mask->device());
  return key;
}

/// A one-value tensor the kernel reads as an f32 scalar (any shape of one
/// element: the torch op's, not the kernel's rank-0 operand).
static void checkOneValue(const char *op, const char *name, const Tensor &t) {
  TORCH_CHECK_VALUE(t.numel() == 1, "moe.", op, ": '", name,
                    "' must hold one value, got shape ", t.sizes());
}

/// A scalar cotangent or saved scalar as the kernels read it: f32, rank 0.
static Tensor scalarF32(const Tensor &t) {
  return contig(t.to(at::kFloat).reshape({}));
}

/// The statistics kernel (moe.router_stats); `op` names the torch op in the
/// messages.
static std::tuple<Tensor, Tensor, Tensor> statsFwd(const char *op,
                                                   const Tensor &logits,
                                                   int64_t topK,
                                                   const OptTensor &mask) {
  checkRouterOperands(op, logits, mask);
  Key key = routerStatsKey(op, logits, mask, topK);
  validateOnly(key); // the op verifier, before the sizes are read
  Tensor x = kernelFloat(logits);
  OptTensor m = mask ? OptTensor(maskF32(*mask)) : std::nullopt;
  int64_t T = logits.size(0), E = logits.size(1);
  Tensor counts = at::zeros({E}, f32(x));
  Tensor weightSum = at::zeros({}, f32(x));
  if (T == 0) {
    // No token: W = 0 and P = 0/0, as transformers' mean of nothing.
    return {counts,
            at::full({E}, std::numeric_limits<float>::quiet_NaN(), f32(x)),
            weightSum};
  }
  KernelFn fn = lookup(key);
  Tensor probs = at::empty({E}, f32(x));
  std::vector<Tensor> keep{contig(x)};
  if (m)
    keep.push_back(contig(*m));
  keep.insert(keep.end(), {counts, probs, weightSum});
  launch(fn, key.device, keep);
  return {counts, probs, weightSum};
}

std::tuple<Tensor, Tensor, Tensor>
moe_torch::routerStatsFwd(const Tensor &logits, int64_t topK,
                          const OptTensor &mask) {
  return statsFwd("router_stats_fwd", logits, topK, mask);
}

/// transformers' E · Σ_e (counts_e / W) · P_e from the statistics.
static Tensor switchLoss(const Tensor &counts, const Tensor &probs,
                         const Tensor &weightSum) {
  return ((counts / weightSum) * probs).sum() * counts.size(0);
}

std::tuple<Tensor, Tensor> moe_torch::routerStats(const Tensor &logits,
                                                  int64_t topK,
                                                  const OptTensor &mask) {
  auto [counts, probs, w] = statsFwd("router_stats", logits, topK, mask);
  return {counts, probs};
}

Tensor moe_torch::loadBalancingLoss(const Tensor &logits, int64_t topK,
                                    const OptTensor &mask) {
  auto [counts, probs, w] = statsFwd("load_balancing_loss", logits, topK, mask);
  return switchLoss(counts, probs, w);
}

Tensor moe_torch::routerStatsBackward(const Tensor &gradProbs,
                                      const Tensor &logits,
                                      const OptTensor &mask,
                                      const Tensor &weightSum) {
  const char *op = "router_stats_backward";
  checkRouterOperands(op, logits, mask);
  checkDevice(op, {&logits, &gradProbs, &weightSum});
  checkOneValue(op, "weight_sum", weightSum);
  Tensor x = kernelFloat(logits);
  OptTensor m = mask ? OptTensor(maskF32(*mask)) : std::nullopt;
  Key key(op);
  key.in("logits", x, {0});
  if (m)
    key.in("token_mask", *m, {0});
  key.in("weight_sum", at::kFloat, {}, {}, x.device())
      .in("grad_mean_probs", at::kFloat, gradProbs.sizes(), {}, x.device());
  validateOnly(key); // the op verifier, before the sizes are read
  if (x.size(0) == 0) {
    return at::zeros(x.sizes(), f32(x));
  }
  KernelFn fn = lookup(key);
  std::vector<Tensor> keep{contig(x)};
  if (m)
    keep.push_back(contig(*m));
  keep.push_back(scalarF32(weightSum));
  keep.push_back(contig(gradProbs.to(at::kFloat)));
  Tensor out = at::empty(x.sizes(), f32(x));
  keep.push_back(out);
  launch(fn, key.device, keep);
  return out;
}

Tensor moe_torch::routerZLoss(const Tensor &logits) {
  const char *op = "router_z_loss";
  checkRouterOperands(op, logits, std::nullopt);
  Tensor x = kernelFloat(logits);
  Key key(op);
  key.in("logits", x, {0});
  validateOnly(key); // the op verifier, before the sizes are read
  if (x.size(0) == 0) {
    return at::full({}, std::numeric_limits<float>::quiet_NaN(), f32(x));
  }
  KernelFn fn = lookup(key);
  Tensor xc = contig(x);
  Tensor out = at::empty({}, f32(x));
  launch(fn, key.device, {xc, out});
  return out;
}

Tensor moe_torch::routerZLossBackward(const Tensor &grad,
                                      const Tensor &logits) {
  const char *op = "router_z_loss_backward";
  checkRouterOperands(op, logits, std::nullopt);
  checkDevice(op, {&logits, &grad});
  checkOneValue(op, "grad", grad);
  Tensor x = kernelFloat(logits);
  Key key(op);
  key.in("logits", x, {0}).in("grad", at::kFloat, {}, {}, x.device());
  validateOnly(key); // the op verifier, before the sizes are read
  if (x.size(0) == 0) {
    return at::zeros(x.sizes(), f32(x));
  }
  KernelFn fn = lookup(key);
  Tensor xc = contig(x), g = scalarF32(grad);
  Tensor out = at::empty(x.sizes(), f32(x));
  launch(fn, key.device, {xc, g, out});
  return out;
}

/// After the op verifier (`key`): what the torch op takes beyond the key's
/// op, whose k is the last size of the indices: `top_k` equal to it, and
/// (data-dependent, as the eager reference) every index in [0, E).
static void checkSequenceOperands(const char *op, const Key &key,
                                  const Tensor &scores, const Tensor &indices,
                                  int64_t topK) {
  validateOnly(key);
  checkDim(op, "indices", indices, 2, topK, "'top_k'");
  int64_t E = scores.size(2);
  if (indices.numel() == 0)
    return;
  // Data-dependent: an index outside [0, E) selects no expert (the kernel
  // would skip it); the op rejects it, as the eager reference does.
  auto [lo, hi] = at::aminmax(indices);
  int64_t l = lo.item<int64_t>(), h = hi.item<int64_t>();
  TORCH_CHECK_VALUE(l >= 0 && h < E, "moe.", op, ": 'indices' holds ",
                    l < 0 ? l : h, ", outside [0, ", E,
                    "): the value indexes no expert");
}

Tensor moe_torch::sequenceBalanceLoss(const Tensor &scores,
                                      const Tensor &indices, int64_t topK) {
  const char *op = "sequence_balance_loss";
  checkDevice(op, {&scores, &indices});
  checkLogitDtype(op, "scores", scores);
  Tensor s = kernelFloat(scores);
  Key key(op);
  key.in("scores", s, {0, 1}).in("indices", indices, {0, 1});
  checkSequenceOperands(op, key, scores, indices, topK);
  if (s.size(0) == 0 || s.size(1) == 0) {
    return at::full({}, std::numeric_limits<float>::quiet_NaN(), f32(s));
  }
  KernelFn fn = lookup(key);
  Tensor sc = contig(s), ic = contig(indices);
  Tensor out = at::empty({}, f32(s));
  launch(fn, key.device, {sc, ic, out});
  return out;
}

Tensor moe_torch::sequenceBalanceLossBackward(const Tensor &grad,
                                              const Tensor &scores,
                                              const Tensor &indices,
                                              int64_t topK) {
  const char *op = "sequence_balance_loss_backward";
  checkDevice(op, {&scores, &indices, &grad});
  checkLogitDtype(op, "scores", scores);
  checkOneValue(op, "grad", grad);
  Tensor s = kernelFloat(scores);
  Key key(op);
  key.in("scores", s, {0, 1})
      .in("indices", indices, {0, 1})
      .in("grad", at::kFloat, {}, {}, s.device());
  checkSequenceOperands(op, key, scores, indices, topK);
  if (s.numel() == 0) {
    return at::zeros(s.sizes(), f32(s));
  }
  KernelFn fn = lookup(key);
  Tensor sc = contig(s), ic = contig(indices), g = scalarF32(grad);
  Tensor out = at::empty(s.sizes(), f32(s));
  launch(fn, key.device, {sc, ic, g, out});
  return out;
}

//===----------------------------------------------------------------------===//
// Autograd
//===----------------------------------------------------------------------===//

// The schemas of python/moe_mlir/ops/balance.py (`int` is SymInt there).
using StatsFwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor &,
                                                       c10::SymInt,
                                                       const OptTensor &);
using LbSig = Tensor(const Tensor &, c10::SymInt, const OptTensor &);
using StatsSig = std::tuple<Tensor, Tensor>(const Tensor &, c10::SymInt,
                                            const OptTensor &);
using StatsBwdSig = Tensor(const Tensor &, const Tensor &, const OptTensor &,
                           const Tensor &);
using ZSig = Tensor(const Tensor &);
using ZBwdSig = Tensor(const Tensor &, const Tensor &);
using SeqSig = Tensor(const Tensor &, const Tensor &, c10::SymInt);
using SeqBwdSig = Tensor(const Tensor &, const Tensor &, const Tensor &,
                         c10::SymInt);

static const Op<StatsFwdSig> &statsFwdOp() {
  static const Op<StatsFwdSig> op("moe::router_stats_fwd");
  return op;
}
static const Op<StatsBwdSig> &statsBwdOp() {
  static const Op<StatsBwdSig> op("moe::router_stats_backward");
  return op;
}

/// The gradient `g` cast to the dtype of `like`; under create_graph, the
/// output of an error node (the backward ops are differentiable once).
static Tensor gradFor(const Tensor &g, const Tensor &like, const char *op) {
  std::string name = std::string("moe.") + op;
  return differentiableOnce({castLike(g, like)}, name.c_str())[0];
}

/// The saved token mask (an undefined tensor when there is none).
static OptTensor savedMask(const Tensor &m) {
  return m.defined() ? OptTensor(m) : std::nullopt;
}

/// Saves the logits, the mask and the statistics the backward reads.
static void saveStats(AutogradContext *ctx, const Tensor &logits,
                      const OptTensor &mask, const Tensor &counts,
                      const Tensor &weightSum) {
  ctx->save_for_backward({logits, mask ? *mask : Tensor(), counts, weightSum});
}

namespace {

struct LoadBalancingLossFn : torch::autograd::Function<LoadBalancingLossFn> {
  static Tensor forward(AutogradContext *ctx, const Tensor &logits,
                        int64_t topK, const OptTensor &mask) {
    auto [counts, probs, w] = statsFwdOp()(logits, c10::SymInt(topK), mask);
    saveStats(ctx, logits, mask, counts, w);
    at::AutoDispatchBelowADInplaceOrView guard;
    return switchLoss(counts, probs, w);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list s = ctx->get_saved_variables();
    variable_list out(3);
    if (!grads[0].defined() || !ctx->needs_input_grad(0))
      return out;
    Tensor g;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      // d loss / d P_e = dloss · E · counts_e / W.
      g = grads[0].to(at::kFloat) * (s[2] * s[2].size(0) / s[3]);
    }
    out[0] = gradFor(statsBwdOp()(g, s[0], savedMask(s[1]), s[3]), s[0],
                     "load_balancing_loss");
    return out;
  }
};

struct RouterStatsFn : torch::autograd::Function<RouterStatsFn> {
  static variable_list forward(AutogradContext *ctx, const Tensor &logits,
                               int64_t topK, const OptTensor &mask) {
    auto [counts, probs, w] = statsFwdOp()(logits, c10::SymInt(topK), mask);
    ctx->mark_non_differentiable({counts});
    ctx->set_materialize_grads(false);
    saveStats(ctx, logits, mask, counts, w);
    return {counts, probs};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list s = ctx->get_saved_variables();
    variable_list out(3);
    if (!grads[1].defined() || !ctx->needs_input_grad(0))
      return out;
    out[0] = gradFor(statsBwdOp()(grads[1], s[0], savedMask(s[1]), s[3]), s[0],
                     "router_stats");
    return out;
  }
};

struct RouterZLossFn : torch::autograd::Function<RouterZLossFn> {
  static Tensor forward(AutogradContext *ctx, const Tensor &logits) {
    static const Op<ZSig> op("moe::router_z_loss");
    ctx->save_for_backward({logits});
    return op(logits);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static const Op<ZBwdSig> op("moe::router_z_loss_backward");
    variable_list s = ctx->get_saved_variables();
    if (!grads[0].defined() || !ctx->needs_input_grad(0))
      return {Tensor()};
    return {gradFor(op(grads[0], s[0]), s[0], "router_z_loss")};
  }
};

struct SequenceBalanceLossFn
    : torch::autograd::Function<SequenceBalanceLossFn> {
  static Tensor forward(AutogradContext *ctx, const Tensor &scores,
                        const Tensor &indices, int64_t topK) {
    static const Op<SeqSig> op("moe::sequence_balance_loss");
    ctx->save_for_backward({scores, indices});
    ctx->saved_data["top_k"] = topK;
    return op(scores, indices, c10::SymInt(topK));
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static const Op<SeqBwdSig> op("moe::sequence_balance_loss_backward");
    variable_list s = ctx->get_saved_variables();
    variable_list out(3);
    if (!grads[0].defined() || !ctx->needs_input_grad(0))
      return out;
    out[0] = gradFor(
        op(grads[0], s[0], s[1], c10::SymInt(ctx->saved_data["top_k"].toInt())),
        s[0], "sequence_balance_loss");
    return out;
  }
};

} // namespace

/// A Function's outputs as its op returns them.
static Tensor opResult(Tensor loss) { return loss; }
static std::tuple<Tensor, Tensor> opResult(const variable_list &stats) {
  return {stats[0], stats[1]};
}

/// The Autograd kernel of an op on the router statistics, `op`, whose backend
/// kernel is `kernel`: that kernel when no graph is needed; else the operands
/// are checked and verified first, in the words of `op` (the statistics'
/// forward would check them only inside the Function, after its node is
/// made), and `Fn` records the node.
template <typename Fn, typename Sig>
static auto statsAutograd(const char *op, const Op<Sig> &kernel,
                          const Tensor &logits, c10::SymInt symK,
                          const OptTensor &mask) {
  int64_t topK = symK.expect_int();
  if (!needsGraph(logits))
    return kernel(logits, c10::SymInt(topK), mask);
  checkRouterOperands(op, logits, mask);
  validateOnly(routerStatsKey(op, logits, mask, topK));
  return opResult(Fn::apply(logits, topK, mask));
}

Tensor moe_torch::loadBalancingLossAutograd(const Tensor &logits,
                                            c10::SymInt topK,
                                            const OptTensor &mask) {
  static const Op<LbSig> kernel("moe::load_balancing_loss");
  return statsAutograd<LoadBalancingLossFn>("load_balancing_loss", kernel,
                                            logits, std::move(topK), mask);
}

std::tuple<Tensor, Tensor>
moe_torch::routerStatsAutograd(const Tensor &logits, c10::SymInt topK,
                               const OptTensor &mask) {
  static const Op<StatsSig> kernel("moe::router_stats");
  return statsAutograd<RouterStatsFn>("router_stats", kernel, logits,
                                      std::move(topK), mask);
}

Tensor moe_torch::routerZLossAutograd(const Tensor &logits) {
  if (!needsGraph(logits)) {
    static const Op<ZSig> op("moe::router_z_loss");
    return op(logits);
  }
  return RouterZLossFn::apply(logits);
}

Tensor moe_torch::sequenceBalanceLossAutograd(const Tensor &scores,
                                              const Tensor &indices,
                                              c10::SymInt symK) {
  int64_t topK = symK.expect_int();
  if (!needsGraph(scores)) {
    static const Op<SeqSig> op("moe::sequence_balance_loss");
    return op(scores, indices, c10::SymInt(topK));
  }
  return SequenceBalanceLossFn::apply(scores, indices, topK);
}
