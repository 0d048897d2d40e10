//===- CapacityOps.cpp - torch.ops.moe.apply_capacity / bias_update
//--------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CPU kernels of the capacity and bias-balancing ops
// (python/moe_mlir/ops/capacity.py), on the machinery of TorchKernels.cpp
// (TorchKernels.h):
//
// * apply_capacity runs moe.dispatch_plan with its capacity option (the kernel
//   returns only `inverse` and `dropped`: cache.py's _kept_results) and keeps
//   the weights whose assignment kept its place (inverse >= 0). T is dynamic
//   in the kernel. Its gradient (a mask on the weights) is the Python
//   recompute autograd's (TorchOps.def: PythonAutograd).
// * bias_update lowers moe.bias_update; `rate` enters the key rounded to f32,
//   the precision of the op's attribute, so that the kernel adds exactly the
//   u of PyTorch's f32 arithmetic.
//
//===----------------------------------------------------------------------===//

#include "TorchKernels.h"
#include "TorchOps.h"

#include <cmath>
#include <cstdint>

using namespace moe_torch;

std::tuple<Tensor, Tensor> moe_torch::applyCapacity(const Tensor &indices,
                                                    const Tensor &weights,
                                                    int64_t numExperts,
                                                    int64_t capacity,
                                                    c10::string_view drop) {
  const char *op = "apply_capacity";
  checkDevice(op, {&indices, &weights});
  checkCpu(op, {&indices, &weights});
  Key key(op);
  key.attr("num_experts", numExperts)
      .attr("capacity", capacity)
      .attr("drop", drop);
  key.in("indices", indices, {0}).in("weights", weights, {0});
  validateOnly(key); // the op verifier first
  // The op reads the weights only to drop by probability; the torch op masks
  // them either way: its own rule (ops/capacity.py words it the same).
  checkShapedLike(
      op, "weights", weights, 2, "[T, k]", indices,
      {"dimension 0 of 'indices' (T)", "dimension 1 of 'indices' (k)"});
  int64_t n = indices.numel();
  if (n == 0) {
    return {weights.clone(), at::zeros({numExperts}, indices.options().dtype(at::kLong))};
  }
  KernelFn fn = lookup(key);
  Tensor idx = contig(indices), w = contig(weights);
  Tensor inverse = at::empty({n}, i32(indices));
  Tensor dropped = at::empty({numExperts}, i32(indices));
  launch(fn, key.device, {idx, w, inverse, dropped});
  Tensor kept = inverse.view(indices.sizes()).ge(0);
  return {at::where(kept, weights, at::zeros({}, weights.options())),
          dropped.to(at::kLong)};
}

Tensor moe_torch::biasUpdate(const Tensor &bias, const Tensor &counts,
                             double rate) {
  const char *op = "bias_update";
  checkDevice(op, {&bias, &counts});
  checkCpu(op, {&bias, &counts});
  Key key(op);
  // The f32 attribute's value; a rate beyond f32 stays as given, for the
  // validator's message.
  double rate32 = static_cast<double>(static_cast<float>(rate));
  key.attr("rate", std::isfinite(rate32) ? rate32 : rate);
  key.in("bias", bias).in("counts", counts);
  validateOnly(key); // the op verifier, before the sizes are read
  if (bias.size(0) == 0)
    return at::empty({0}, f32(bias));
  KernelFn fn = lookup(key);
  Tensor b = contig(bias), c = contig(counts);
  Tensor out = at::empty({bias.size(0)}, f32(bias));
  launch(fn, key.device, {b, c, out});
  return out;
}
