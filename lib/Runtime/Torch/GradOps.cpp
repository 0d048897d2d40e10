//===- GradOps.cpp - The backward torch ops on the compiled CPU kernels ---===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CPU kernels of torch.ops.moe.<op>_backward (python/moe_mlir/ops/
// defines their schemas and fake kernels, and the autograd of the forward ops
// that calls them), which are also their CUDA kernels where they have a GPU
// lowering (TorchOps.def: the same functions, their keys naming the device:
// similarity_inform_fwd and _backward, topk_renorm_backward,
// hyper_router_backward, attention_posterior_backward; the latter's
// head_select = all runs its eager reference on CUDA tensors, as the forward
// does). Each lowers the backward op of the dialect
// (include/MoE/IR/MoEGradOps.td) through the same kernel cache as the forward
// ops (TorchKernels.h): token-like dimensions dynamic, one kernel per static
// signature.
//
//===----------------------------------------------------------------------===//

#include "TorchKernels.h"
#include "TorchOps.h"

#include <array>

using namespace moe_torch;

/// Similarity-Inform backward with a zero-sized feature dimension D: every
/// logit is 0, so S is uniform over the keys a row mixes. No kernel takes a
/// static zero size (the dialect's lowerings assume none); this is the
/// degenerate case, computed with ATen (N x N, but D = 0).
static Tensor similarityDegenerateDe(const Tensor &dp, const Tensor &u,
                                     const std::optional<Tensor> &mask,
                                     bool causal) {
  int64_t B = u.size(0), N = u.size(1);
  Tensor valid = at::ones({B, N, N}, u.options().dtype(at::kBool));
  if (causal)
    valid = valid & at::ones({N, N}, valid.options()).tril();
  if (mask)
    valid = valid & mask->to(at::kBool).unsqueeze(1);
  Tensor s = valid.to(at::kFloat);
  s = s / s.sum(-1, /*keepdim=*/true).clamp_min(1);
  return at::bmm(s.transpose(1, 2), dp.to(at::kFloat));
}

std::tuple<Tensor, Tensor, Tensor> moe_torch::similarityInformBackward(
    const Tensor &dp, const Tensor &u, const Tensor &e,
    const std::optional<Tensor> &ws, const std::optional<Tensor> &mask,
    double tau, bool causal, const std::optional<Tensor> &p,
    const std::optional<Tensor> &lse) {
  const char *op = "similarity_inform_backward";
  similarityDevices(op, u, e, ws, mask);
  checkDevice(op, {&u, &dp});
  if (p)
    checkDevice(op, {&u, &*p});
  if (lse)
    checkDevice(op, {&u, &*lse});
  Key key("similarity_inform_backward");
  key.attr("tau", tau).attr("causal", causal);
  similarityKey(key, u, e, ws, mask);
  // The cotangent autograd hands over may be of another dtype or strided:
  // the kernel reads it as f32.
  key.in("grad_p", at::kFloat, dp.sizes(), {0, 1}, dp.device());
  if (p)
    key.in("p", *p, {0, 1});
  if (lse)
    key.in("lse", *lse, {0, 1});
  validateOnly(key); // the op verifier, before the sizes are read

  int64_t B = u.size(0), N = u.size(1), D = u.size(2), K = e.size(2);
  auto results = [&] {
    return std::array<Tensor, 3>{
        at::empty({B, N, D}, f32(u)), at::empty({B, N, K}, f32(e)),
        ws ? at::empty({D, D}, f32(u)) : at::empty({0}, f32(u))};
  };
  if (B == 0 || N == 0 || D == 0 || K == 0) {
    auto [du, de, dws] = results();
    du.zero_();
    dws.zero_();
    // K = 0: no cotangent, no gradient. D = 0: uniform S, de = S^T dp.
    if (D == 0 && B * N * K != 0)
      de.copy_(similarityDegenerateDe(dp, u, mask, causal));
    else
      de.zero_();
    return {du, de, dws};
  }
  KernelFn fn = lookup(key);
  std::vector<Tensor> keep;
  std::vector<MemRef> args = similarityArgs(u, e, ws, mask, keep);
  keep.push_back(contig(dp.to(at::kFloat)));
  if (p) {
    keep.push_back(contig(*p));
    keep.push_back(contig(*lse));
  }
  for (size_t n = args.size(); n < keep.size(); ++n)
    args.push_back(describe(keep[n]));
  auto [du, de, dws] = results();
  args.push_back(describe(du));
  args.push_back(describe(de));
  if (ws)
    args.push_back(describe(dws));
  launch(fn, args, key.device, similarityWork(u, e));
  return {du, de, dws};
}

Tensor moe_torch::topkRenormBackward(const Tensor &gradW, const Tensor &scores,
                                     const Tensor &indices,
                                     c10::string_view mode, bool renormalize) {
  const char *op = "topk_renorm_backward";
  checkDevice(op, {&scores, &indices, &gradW});
  c10::Device on = scores.device();
  // The call as the user made it ([..., K] scores, [..., k] indices and
  // cotangent, which the kernel reads as i32 and f32), for the op verifier;
  // the kernel's key views them as [rows, K]: one kernel for every leading
  // shape.
  Key call(op);
  call.attr("mode", mode).attr("renormalize", renormalize);
  call.in("scores", scores)
      .in("indices", at::kInt, indices.sizes(), {}, on)
      .in("grad_w", at::kFloat, gradW.sizes(), {}, on);
  validateOnly(call);
  int64_t K = scores.size(-1), k = indices.size(-1);
  int64_t rows = K == 0 ? 0 : scores.numel() / K;
  std::array<int64_t, 2> shape{rows, K}, kShape{rows, k};
  Key key(op);
  key.attr("mode", mode).attr("renormalize", renormalize);
  key.in("scores", scores.scalar_type(), shape, {0}, on)
      .in("indices", at::kInt, kShape, {0}, on)
      .in("grad_w", at::kFloat, kShape, {0}, on);
  if (rows == 0)
    return at::empty(scores.sizes(), f32(scores));
  KernelFn fn = lookup(key);
  Tensor s2 = contig(scores).view(shape);
  Tensor i2 = contig(indices.to(at::kInt)).view(kShape);
  Tensor g2 = contig(gradW.to(at::kFloat)).view(kShape);
  Tensor out = at::empty(scores.sizes(), f32(scores));
  std::vector<MemRef> args{describe(s2), describe(i2), describe(g2),
                           describe(out, shape)};
  launch(fn, args, key.device);
  return out;
}

using HyperGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

/// HyperRouter backward with a zero-sized dimension (D = 0, which the torch
/// op allows and the dialect does not, or an empty De, Dh or E·(D+1)): the
/// closed form of moe.hyper_router_grad with ATen (no token dimension, so
/// small).
static HyperGrads hyperRouterDegenerate(const Tensor &gradW,
                                        const Tensor &gradB, const Tensor &emb,
                                        const Tensor &w1, const Tensor &b1,
                                        const Tensor &w2, int64_t numExperts) {
  Tensor embf = emb.to(at::kFloat), w1f = w1.to(at::kFloat);
  Tensor h = at::relu(at::matmul(w1f, embf) + b1.to(at::kFloat));
  Tensor dout =
      at::cat({gradW.to(at::kFloat).reshape({numExperts, -1}),
               gradB.to(at::kFloat).reshape({numExperts, 1})},
              1)
          .reshape({-1});
  Tensor da = at::matmul(dout, w2.to(at::kFloat)).masked_fill(h <= 0, 0);
  return {at::matmul(da, w1f), at::outer(da, embf), da, at::outer(dout, h),
          dout};
}

HyperGrads moe_torch::hyperRouterBackward(const Tensor &gradW,
                                          const Tensor &gradB,
                                          const Tensor &emb, const Tensor &w1,
                                          const Tensor &b1, const Tensor &w2,
                                          const Tensor &b2, int64_t numExperts,
                                          bool weightGrads) {
  const char *op = "hyper_router_backward";
  // CPU or CUDA tensors (TorchOps.def): the key carries the device.
  checkDevice(op, {&gradW, &gradB, &emb, &w1, &b1, &w2, &b2});
  Key key(op);
  key.attr("num_experts", numExperts).attr("weight_grads", weightGrads);
  // The cotangents autograd hands over may be of another dtype or strided:
  // the kernel reads them as f32.
  key.in("grad_w", at::kFloat, gradW.sizes(), {}, gradW.device())
      .in("grad_b", at::kFloat, gradB.sizes(), {}, gradB.device())
      .in("emb", emb)
      .in("w1", w1)
      .in("b1", b1)
      .in("w2", w2)
      .in("b2", b2);
  // d_w1 and d_w2 (results 1 and 3) without weight_grads: empty, and not
  // results of the kernel, whose lowering then skips the outer products.
  auto skipped = [&](size_t n) { return !weightGrads && (n == 1 || n == 3); };
  if (gradW.numel() == 0 || emb.numel() == 0 || w1.numel() == 0 ||
      w2.numel() == 0) {
    validateOnly(key);
    auto [de, dw1, db1, dw2, db2] =
        hyperRouterDegenerate(gradW, gradB, emb, w1, b1, w2, numExperts);
    std::array<Tensor, 5> g{de, dw1, db1, dw2, db2};
    for (size_t n = 0; n < g.size(); ++n)
      if (skipped(n))
        g[n] = at::empty({0}, f32(emb));
    return {g[0], g[1], g[2], g[3], g[4]};
  }
  KernelFn fn = lookup(key);
  std::array<Tensor, 7> keep{contig(gradW.to(at::kFloat)),
                             contig(gradB.to(at::kFloat)),
                             contig(emb),
                             contig(w1),
                             contig(b1),
                             contig(w2),
                             contig(b2)};
  std::array<Tensor, 5> grads;
  std::vector<MemRef> args = describeAll(keep);
  const std::array<int64_t, 1> none{0};
  for (size_t n = 0; n < grads.size(); ++n) {
    grads[n] = at::empty(skipped(n) ? at::IntArrayRef(none) : keep[n + 2].sizes(),
                         f32(emb));
    if (!skipped(n))
      args.push_back(describe(grads[n]));
  }
  launch(fn, args, key.device);
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

using PosteriorGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

PosteriorGrads moe_torch::attentionPosteriorBackward(
    const Tensor &dp, const Tensor &scores, const Tensor &u, const Tensor &v,
    const Tensor &wo, const Tensor &e, const std::optional<Tensor> &head,
    double sigma, c10::string_view headSelect,
    std::optional<double> headScale) {
  const char *op = "attention_posterior_backward";
  checkDevice(op, {&scores, &u, &v, &wo, &e, &dp});
  if (head)
    checkDevice(op, {&scores, &*head});
  bool minEntropy = headSelect == "min_entropy";
  Key key(op);
  key.attr("sigma", sigma).attr("head_select", headSelect).attr("head_scale",
                                                               headScale);
  attentionKey(key, scores, u, v, wo, e);
  // h* indexes the heads: the kernels check that it lies in [0, H) (no host
  // sync on CUDA) and report a value outside as an index error, which
  // launch() raises on the CPU (checkReportedError) and the CUDA runtime's
  // deferred check raises later (moe_mlir.runtime.cuda.check_errors). The
  // kernel reads h* as i32 and the cotangent (which autograd may hand over
  // in another dtype, or strided) as f32.
  if (head)
    key.in("head", at::kInt, head->sizes(), {0}, head->device());
  key.in("grad_p", at::kFloat, dp.sizes(), {0, 1}, dp.device());
  validateOnly(key); // the op verifier, before the sizes are read
  int64_t B = scores.size(0), H = scores.size(1);
  if (scores.is_cuda() && !minEntropy) {
    // No GPU kernel for every head (convert-moe-to-gpu refuses it, as for
    // the forward): the eager closed form on the CUDA tensors.
    std::vector<Tensor> r =
        allHeadsReference("_attention_posterior_backward_ref",
                          {dp, scores, u, v, wo, e, c10::IValue(), sigma,
                           std::string(headSelect), headScale});
    return {r.at(0), r.at(1), r.at(2), r.at(3), r.at(4)};
  }
  if (scores.numel() == 0 || u.numel() == 0 || v.numel() == 0 ||
      wo.numel() == 0 || e.numel() == 0) {
    // A zero-sized dimension (no kernel takes a static zero size): the dense
    // closed form is as small as its operands. It gathers by h*, so h* is
    // checked here (on the host: the operands are empty or nearly).
    if (head && B > 0) {
      Tensor h = head->to(at::kLong);
      int64_t lo = h.min().item<int64_t>(), hi = h.max().item<int64_t>();
      if (lo < 0 || hi >= H)
        failHeadOutOfRange(lo < 0 ? lo : hi, H);
    }
    std::vector<Tensor> r = allHeadsReference(
        "_attention_posterior_backward_ref",
        {dp, scores, u, v, wo, e, head ? c10::IValue(*head) : c10::IValue(),
         sigma, std::string(headSelect), headScale});
    return {r.at(0), r.at(1), r.at(2), r.at(3), r.at(4)};
  }
  KernelFn fn = lookup(key);
  std::vector<Tensor> keep;
  std::vector<MemRef> args = attentionArgs(scores, u, v, wo, e, keep);
  if (head)
    keep.push_back(contig(head->to(at::kInt)));
  keep.push_back(contig(dp.to(at::kFloat)));
  for (size_t n = 5; n < keep.size(); ++n)
    args.push_back(describe(keep[n]));
  std::array<Tensor, 5> grads;
  for (size_t n = 0; n < grads.size(); ++n)
    grads[n] = at::empty(keep[n].sizes(), f32(scores));
  for (const Tensor &g : grads)
    args.push_back(describe(g));
  launch(fn, args, key.device);
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}
