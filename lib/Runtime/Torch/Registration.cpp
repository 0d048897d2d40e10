//===- Registration.cpp - The torch ops' kernels at each dispatch key -----===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The op table (TorchOps.def) expanded into the registrations of every
// dispatch key:
//
// * at load (torch.ops.load_library): CPU, every op's kernel; AutogradCPU,
//   every Autograd kernel; AutogradCUDA, those of the CudaKernels ops, which
//   call whatever CUDA runs below them (our kernel once registered, the
//   op's eager reference before);
// * registerCudaKernels (moeTorchEnableCuda, TorchCudaOps.cpp; Python calls it
//   once the CUDA kernels are usable): CUDA, the kernels of the CudaKernels
//   ops.
//
// The CUDA registration is compiled in every build (it needs no CUDA header);
// only TorchCudaOps.cpp, built with the CUDA runtime, calls it.
//
//===----------------------------------------------------------------------===//

#include "TorchCuda.h"
#include "TorchOps.h"

#include <torch/library.h>

#include <memory>
#include <utility>

namespace {

/// TorchOps.def's Cuda column: what CUDA tensors run.
enum class Cuda { CpuOnly, CudaKernels };

/// The ops a registration takes, by their Cuda column.
using Selection = bool (*)(Cuda);

bool everyOp(Cuda) { return true; }
bool cudaKernels(Cuda c) { return c == Cuda::CudaKernels; }

/// The Autograd column's NoAutograd: nothing to register.
struct NoAutogradKernel {};

template <typename Kernel>
void implAutograd(torch::Library &m, const char *name, Kernel &&kernel) {
  m.impl(name, std::forward<Kernel>(kernel));
}
void implAutograd(torch::Library &, const char *, NoAutogradKernel) {}

// The Autograd column's kinds as kernels (pasted onto MOE_AUTOGRAD_).
#define MOE_AUTOGRAD_CppAutograd(Fn) TORCH_FN(moe_torch::Fn)
#define MOE_AUTOGRAD_PythonAutograd                                            \
  moe_torch::autogradKernel(/*differentiable=*/true)
#define MOE_AUTOGRAD_StopGradient                                              \
  moe_torch::autogradKernel(/*differentiable=*/false)
#define MOE_AUTOGRAD_NoAutograd NoAutogradKernel()

/// The backend kernels of the selected ops (CPU or CUDA).
void registerKernels(torch::Library &m, Selection selected) {
#define MOE_TORCH_OP(Name, Kernel, Autograd, CudaColumn)                       \
  if (selected(Cuda::CudaColumn))                                              \
    m.impl(#Name, &moe_torch::Kernel);
#include "TorchOps.def"
}

/// The Autograd kernels of the selected ops (AutogradCPU or AutogradCUDA).
void registerAutograd(torch::Library &m, Selection selected) {
#define MOE_TORCH_OP(Name, Kernel, Autograd, CudaColumn)                       \
  if (selected(Cuda::CudaColumn))                                              \
    implAutograd(m, #Name, MOE_AUTOGRAD_##Autograd);
#include "TorchOps.def"
}

/// A library of registrations at `key` made after load (kept for the life of
/// the process: destroying it would deregister them).
std::unique_ptr<torch::Library> implAt(c10::DispatchKey key) {
  return std::make_unique<torch::Library>(torch::Library::IMPL, "moe", key,
                                          __FILE__, __LINE__);
}

} // namespace

TORCH_LIBRARY_IMPL(moe, CPU, m) { registerKernels(m, everyOp); }
TORCH_LIBRARY_IMPL(moe, AutogradCPU, m) { registerAutograd(m, everyOp); }
TORCH_LIBRARY_IMPL(moe, AutogradCUDA, m) { registerAutograd(m, cudaKernels); }

void moe_torch::registerCudaKernels() {
  static std::unique_ptr<torch::Library> kernels;
  if (kernels)
    return;
  kernels = implAt(c10::DispatchKey::CUDA);
  registerKernels(*kernels, cudaKernels);
}
