//===- GpuKernelBuilder.h - One GPU thread's code --------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The kernels of convert-moe-to-gpu are written one thread at a time with the
// project's kernel builder (MoE/Kernels/Builder.h), shared with the CPU
// kernels; this is its GPU instance, the one place that knows thread and block
// ids, barriers and warp shuffles, with the few device-side accesses the
// kernel families share (workgroup buffers, 16-byte read-only loads, the
// runtime's error word). Reductions.h, RegisterTopk.h and HostCode.h build on it.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_GPUKERNELBUILDER_H
#define MOE_LIB_CONVERSION_MOETOGPU_GPUKERNELBUILDER_H

#include "MoE/Kernels/Builder.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

namespace mlir::moe::gpu_lowering {

/// Threads of a warp.
constexpr int64_t kWarp = 32;
/// Threads of a block of the kernels whose block size is fixed rather than
/// the pass's block-size option: 4 warps.
constexpr int64_t kKernelThreads = 128;

/// The GPU instance of the kernel builder (MoE/Kernels/Builder.h): one
/// thread's scalars, plus thread/block ids, barriers and warp shuffles.
class GpuKernelBuilder : public kernels::KernelBuilder {
public:
  explicit GpuKernelBuilder(ImplicitLocOpBuilder &b)
      : kernels::KernelBuilder(b) {}

  // GPU ids (index).
  Value threadId(gpu::Dimension d = gpu::Dimension::x);
  Value blockId(gpu::Dimension d = gpu::Dimension::x);
  Value gridDim(gpu::Dimension d = gpu::Dimension::x);
  void barrier();
  /// One butterfly step: the value of lane `lane ^ offset` (i32 or f32).
  Value shuffleXor(Value v, int64_t offset);
  /// Lane `srcLane` (an i32 lane in the warp) of `v`.
  Value shuffleIdx(Value v, Value srcLane);
};

/// scf.while from `init`: `before(args)` returns the condition and the values
/// it forwards (of `forwarded` types: the after region's arguments while it
/// holds, the loop's results once it fails), `after(args)` the next state.
/// (The kernel builder's loops are scf.for; the flash kernel's lazy loops and
/// the list top-k's refills run while a warp-uniform condition holds.)
SmallVector<Value>
whileLoop(ImplicitLocOpBuilder &b, ValueRange init, TypeRange forwarded,
          function_ref<std::pair<Value, SmallVector<Value>>(ValueRange)> before,
          function_ref<SmallVector<Value>(ValueRange)> after);

/// memref<shape x elt, #gpu.address_space<workgroup>>.
MemRefType workgroupMemRef(ArrayRef<int64_t> shape, Type elementType);

/// The 16 bytes at `address` (an index: a generic address of global memory,
/// 16-byte aligned, read-only in the kernel) as the f32 values of its
/// 16 / sizeof(elt) elements of type `elt` (f32, f16, bf16): one
/// ld.global.nc.v4.b32.
SmallVector<Value> loadGlobal16(GpuKernelBuilder &kb, Value address, Type elt);

/// 2^x on the SFU: ex2.approx.ftz.f32, one MUFU.EX2 (math.exp2 becomes
/// libdevice's __nv_exp2f, which without FTZ scales subnormal inputs and
/// results around it: 4 instructions).
Value exp2Approx(ImplicitLocOpBuilder &b, Value x);

/// A kernel builder whose softmax weights exp(d) (KernelBuilder::
/// softmaxWeight, d <= 0) are 2^(d log2 e) on the SFU: one FMUL and one
/// MUFU.EX2 (exp2Approx: 2 ulp; a subnormal weight is 0, as the CPU kernels
/// flush them) where math.exp's expansion takes about 8 instructions. The
/// f32 tensor-core flash kernel's online softmax (FlashTf32.cpp).
class Exp2SoftmaxBuilder : public GpuKernelBuilder {
public:
  using GpuKernelBuilder::GpuKernelBuilder;
  Value softmaxWeight(Value d) override;
};

/// A kernel builder whose softmax weights are 2^d on the SFU (exp2Approx),
/// for logits in log2 units: the tensor-core flash kernel's online softmax,
/// its dot products scaled by log2(e) / tau in the exponent's FMA
/// (FlashMma.cpp).
class Log2SoftmaxBuilder : public GpuKernelBuilder {
public:
  using GpuKernelBuilder::GpuKernelBuilder;
  Value softmaxWeight(Value d) override { return exp2Approx(b, d); }
};

/// Records, from a kernel, that element `position` of the index operand of op
/// `opCode` (MoE/Kernels/IndexErrors.h) holds `value`, outside [0, bound): the
/// first error wins the flag (cmpxchg) and writes the details. `word` is the
/// i64 device address from HostCode::errorWord().
void emitRecordIndexError(GpuKernelBuilder &kb, Value word, int64_t opCode,
                          Value position, Value value, Value bound);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_GPUKERNELBUILDER_H
