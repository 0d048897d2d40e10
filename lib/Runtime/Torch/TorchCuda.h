//===- TorchCuda.h - The CUDA launch of the torch ops' kernels --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What TorchOps.cpp and TorchCudaOps.cpp (built when the CUDA runtime,
// lib/Runtime/CUDA, is; then MOE_TORCH_CUDA is defined) share: the
// registration of the kernels for a dispatch key, and the CUDA launch: a
// kernel call on CUDA tensors runs on PyTorch's
// current stream of their device, with no host wait. The kernel ABI is the
// CPU one (`_mlir_ciface_kernel(inputs..., outputs...)`, one memref
// descriptor pointer each, outputs allocated by torch); the kernel's host code
// launches on the runtime's ambient stream and returns with the work in flight
// (moe-lower-to-nvvm wait-at-return=false).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_TORCHCUDA_H
#define MOE_LIB_RUNTIME_TORCH_TORCHCUDA_H

#include <c10/core/Device.h>

#include <functional>

namespace torch {
class CppFunction;
class Library;
} // namespace torch

namespace moe_torch {

/// The kernels of every op (TorchOps.cpp), for one dispatch key: CPU, and
/// CUDA from registerCudaKernels.
void registerKernels(torch::Library &m);
/// The kernels of moe.route and moe.dispatch_plan (RoutingOps.cpp); called by
/// registerKernels.
void registerRoutingKernels(torch::Library &m);
/// The autograd kernels of every op, for AutogradCPU and AutogradCUDA (both
/// static: the forward calls whatever the device runs): the differentiable
/// ops' C++ autograd (registerDifferentiable) and the stop-gradient ops'.
void registerAutograd(torch::Library &m);
/// The C++ autograd (torch::autograd::Function) of topk_renorm,
/// similarity_inform(_topk), attention_posterior(_topk) and hyper_router
/// (Autograd.cpp).
void registerDifferentiable(torch::Library &m);

/// The kernels of the training ops that have a GPU lowering (GradOps.cpp:
/// similarity_inform_fwd and _backward, topk_renorm_backward,
/// hyper_router_backward, attention_posterior_backward), for one dispatch
/// key: CPU (GradOps.cpp), and CUDA from registerCudaKernels.
void registerGradKernels(torch::Library &m);

/// The kernels of the load-balancing ops with a GPU lowering (BalanceOps.cpp:
/// router_stats(_fwd, _backward), load_balancing_loss, router_z_loss(
/// _backward)) for one dispatch key, and their C++ autograd: CPU and
/// AutogradCPU always; CUDA and AutogradCUDA from registerCudaRouterLosses,
/// when asked for.
void registerBalanceKernels(torch::Library &m);
void registerBalanceAutograd(torch::Library &m);

/// The boxed Autograd kernel of an op without a C++ autograd (TorchOps.cpp):
/// straight to the op's backend kernel when no gradient is wanted, else, for
/// a `differentiable` op, the op's Python autograd; a stop-gradient op
/// (`differentiable` false) never records one.
torch::CppFunction autogradKernel(bool differentiable);

/// Runs `call` (the kernel call) with PyTorch's current stream of `device` as
/// the CUDA runtime's ambient stream and `device` as its default device; a
/// driver error of the call (e.g. a failed launch) becomes a RuntimeError.
/// Index errors are not read here (that would wait for the stream): the
/// kernels record them in the device error word, read by
/// moeTorchCudaCheckErrors / moe_mlir.runtime.cuda.check_errors().
void launchOnCurrentStream(c10::Device device,
                           const std::function<void()> &call);

/// Registers the CUDA kernels of the ops (once; called from
/// Python when the CUDA kernels are usable: the runtime loads and a compiler
/// or prebuilt kernels are there).
void registerCudaKernels();

/// Registers the load-balancing ops' CUDA kernels and their AutogradCUDA
/// kernels (once): until then CUDA tensors take their PyTorch references.
/// Python asks for it with MOE_CUDA_ROUTER_LOSSES=1 (their GPU lowerings
/// passed the MLIR harness on an H100; this glue has not run on a GPU yet).
void registerCudaRouterLosses();

} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_TORCHCUDA_H
