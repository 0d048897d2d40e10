//===- RoutingOps.cpp - torch.ops.moe.route / dispatch_plan on our kernels
//-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The kernels of the production routing ops (python/moe_mlir/ops/,
// section "Production routing"), on the machinery of TorchKernels.cpp
// (TorchKernels.h): the token dimension T is dynamic in the kernel, so one
// compiled kernel serves every token count; the Python kernel cache validates
// a call on a key miss. moe.route is differentiable w.r.t. the logits (its
// AutogradCPU kernel hands calls that need gradients to the op's Python
// autograd); moe.dispatch_plan is integer-valued (no autograd): TorchOps.def.
//
//===----------------------------------------------------------------------===//

#include "TorchKernels.h"
#include "TorchOps.h"

#include <array>
#include <cstdint>
#include <limits>

using namespace moe_torch;

/// The kernel key separates its fields with '|': a custom score region
/// (scoring = "custom:<region>") must not hold one.
static void checkScoring(const char *op, c10::string_view scoring) {
  TORCH_CHECK_VALUE(scoring.find('|') == c10::string_view::npos, "moe.", op,
                    ": the 'score' region text must not contain '|' (it "
                    "is part of the kernel key)");
}

std::tuple<Tensor, Tensor>
moe_torch::route(const Tensor &logits, const std::optional<Tensor> &bias,
                 int64_t k, c10::string_view scoring, c10::string_view order,
                 int64_t nGroup, int64_t topkGroup, c10::string_view groupScore,
                 bool renormalize, double routedScalingFactor,
                 const std::optional<Tensor> &replay,
                 std::optional<at::ScalarType> indicesDtype) {
  const char *op = "route";
  checkDevice(op, {&logits});
  at::ScalarType indexType = indexDtype(op, indicesDtype);
  if (bias)
    checkDevice(op, {&logits, &*bias});
  if (replay)
    checkDevice(op, {&logits, &*replay});
  checkScoring(op, scoring);
  Key key(op);
  key.attr("k", k)
      .attr("scoring", scoring)
      .attr("order", order)
      .attr("n_group", nGroup)
      .attr("topk_group", topkGroup)
      .attr("group_score", groupScore)
      .attr("renormalize", renormalize)
      .attr("routed_scaling_factor", routedScalingFactor);
  indexResult(key, "indices", indexType);
  key.in("logits", logits, {0});
  if (bias)
    key.in("bias", *bias);
  // The given choice (replay, i32 or i64 as it comes: an engine's or a
  // table's indices are often i64).
  if (replay)
    key.in("replay", *replay, {0});
  KernelFn fn = lookup(key); // the op verifier first
  std::vector<Tensor> keep{contig(logits)};
  if (bias)
    keep.push_back(contig(*bias));
  if (replay)
    keep.push_back(contig(*replay));
  int64_t rows = logits.size(0);
  Tensor w = at::empty({rows, k}, f32(logits));
  Tensor i = at::empty({rows, k}, logits.options().dtype(indexType));
  if (rows == 0)
    return {w, i};
  keep.insert(keep.end(), {w, i});
  launch(fn, key.device, keep);
  return {w, i};
}

/// route's backward for an elementwise score (moe.route_grad: a custom score
/// region differentiated symbolically), on CPU and CUDA tensors.
Tensor moe_torch::routeBackward(const Tensor &gradW, const Tensor &logits,
                                const Tensor &indices, c10::string_view scoring,
                                bool renormalize, double routedScalingFactor) {
  const char *op = "route_backward";
  checkDevice(op, {&logits, &indices, &gradW});
  checkScoring(op, scoring);
  Key key(op);
  key.attr("scoring", scoring)
      .attr("renormalize", renormalize)
      .attr("routed_scaling_factor", routedScalingFactor);
  // The kernel reads the indices as i32 and the cotangent as f32.
  c10::Device on = logits.device();
  key.in("logits", logits, {0})
      .in("indices", at::kInt, indices.sizes(), {0}, on)
      .in("grad_w", at::kFloat, gradW.sizes(), {0}, on);
  validateOnly(key); // the op verifier, before the sizes are read
  int64_t rows = logits.size(0), k = indices.size(1);
  if (rows == 0 || k == 0) {
    return at::zeros(logits.sizes(), f32(logits));
  }
  KernelFn fn = lookup(key); // validates the score region first
  Tensor x = contig(logits);
  Tensor i = contig(indices.to(at::kInt));
  Tensor g = contig(gradW.to(at::kFloat));
  Tensor out = at::empty(logits.sizes(), f32(logits));
  launch(fn, key.device, {x, i, g, out});
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
moe_torch::dispatchPlan(const Tensor &indices, int64_t numExperts,
                        int64_t blockSize) {
  const char *op = "dispatch_plan";
  checkDevice(op, {&indices});
  Key key(op);
  key.attr("num_experts", numExperts).attr("block_size", blockSize);
  key.in("indices", indices, {0});
  KernelFn fn = lookup(key); // the op verifier first
  // T is dynamic in the key: the padded size is checked on every call (the
  // validators check it too, for the T of the call that compiled the key).
  // No overflow: n < 2^31 (checkElements) and the validated key has
  // num_experts * (block_size - 1) < 2^31.
  int64_t n = indices.numel();
  int64_t padded = n + numExperts * (blockSize - 1);
  TORCH_CHECK_VALUE(padded <= std::numeric_limits<int32_t>::max(), "moe.",
                    op, ": the padded plan (T*k + num_experts*(block_size-1) = ",
                    padded, ") must fit in i32");
  int64_t blocks = (padded + blockSize - 1) / blockSize;
  Tensor idx = contig(indices);
  auto o = i32(indices);
  std::array<Tensor, 7> out{at::empty({numExperts}, o),
                            at::empty({numExperts + 1}, o),
                            at::empty({n}, o),
                            at::empty({n}, o),
                            at::empty({padded}, o),
                            at::empty({blocks}, o),
                            at::empty({1}, o)};
  std::vector<MemRef> args{describe(idx)};
  for (const Tensor &t : out)
    args.push_back(describe(t));
  // On CUDA an index error waits in the device error word
  // (moe_mlir.runtime.cuda.check_errors), as for mad_dispersion.
  launch(fn, args, key.device);
  return {out[0], out[1], out[2], out[3], out[4], out[5], out[6]};
}
