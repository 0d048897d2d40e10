//===- TorchCuda.h - The CUDA launch of the torch ops' kernels --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What TorchCudaOps.cpp (built when the CUDA runtime, lib/Runtime/CUDA, is;
// then MOE_TORCH_CUDA is defined) shares with the rest of the extension: the
// registration of the CUDA kernels after load (Registration.cpp, from the op
// table TorchOps.def), and the CUDA launch: a kernel call on CUDA tensors runs
// on PyTorch's current stream of their device, with no host wait. The kernel
// ABI is the CPU one (`_mlir_ciface_kernel(inputs..., outputs...)`, one memref
// descriptor pointer each, outputs allocated by torch); the kernel's host code
// launches on the runtime's ambient stream and returns with the work in flight
// (moe-lower-to-nvvm wait-at-return=false).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_TORCHCUDA_H
#define MOE_LIB_RUNTIME_TORCH_TORCHCUDA_H

#include <c10/core/Device.h>

#include <functional>

namespace moe_torch {

/// Runs `call` (the kernel call) with PyTorch's current stream of `device` as
/// the CUDA runtime's ambient stream and `device` as its default device; a
/// driver error of the call (e.g. a failed launch) becomes a RuntimeError.
/// Index errors are not read here (that would wait for the stream): the
/// kernels record them in the device error word, read by
/// moeTorchCudaCheckErrors / moe_mlir.runtime.cuda.check_errors().
void launchOnCurrentStream(c10::Device device,
                           const std::function<void()> &call);

/// Registers the CUDA kernels of the ops whose Cuda column (TorchOps.def) is
/// CudaKernels (once; called from Python when the CUDA kernels are usable: the
/// runtime loads and a compiler or prebuilt kernels are there).
void registerCudaKernels();

} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_TORCHCUDA_H
