//===- HostCode.h - The host side of a GPU lowering ------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Every GPU lowering replaces an op by host code (a destination-style
// moe.kernel whose body allocates, fills and launches on one stream) and the
// gpu.funcs it launches. HostCode builds that body and GPUKernel defines a
// kernel and its launch in one place, so an op's lowering reads as its
// kernels and their launches, not as the bookkeeping of ins, outs, tokens and
// symbol names.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_HOSTCODE_H
#define MOE_LIB_CONVERSION_MOETOGPU_HOSTCODE_H

#include "GpuKernelBuilder.h"
#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/PatternMatch.h"

#include <array>

namespace mlir::moe::gpu_lowering {

class HostCode;

/// The gpu.module @moe_kernels of a module, created through `b` (a builder of
/// the pattern's rewriter) on first use; the pass marks the module
/// gpu.container_module once it has one.
gpu::GPUModuleOp getOrCreateKernelModule(ModuleOp module, OpBuilder &b);

/// Host code of one op, built inside a destination-style `moe.kernel`
/// (MoEKernelOp.td): the tensors it reads are the kernel's `ins`, its results
/// are `outs` whose destinations are `bufferization.alloc_tensor`, and the
/// body works on the block arguments, the buffers of both. One-shot
/// bufferization (moe-gpu-bufferize), not this code, turns the outs into
/// device allocations. The body's work runs on one stream (an async token
/// chain from gpu.wait async to a final gpu.wait); temporaries are gpu.alloc
/// on it. Every op goes through the pattern's rewriter (`b` shares its
/// listener): the kernel before `op`, GPU kernels and runtime declarations
/// in its module. The ins and outs are collected as the host code asks for
/// them; the moe.kernel with its results is made by the first tensor() or
/// replace(), after finish().
class HostCode {
public:
  HostCode(RewriterBase &rewriter, Operation *op);
  RewriterBase &rewriter;
  ImplicitLocOpBuilder b;
  ModuleOp module;
  GpuKernelBuilder kb;

  /// The buffer of a tensor operand (identity layout; read only): an in of
  /// the kernel.
  Value buffer(Value tensor);
  /// A temporary device allocation (gpu.alloc on the stream) of `type` with
  /// dynamic sizes; it must be released, or be a result (replace() then
  /// copies it into an out: use allocLike for results).
  Value alloc(MemRefType type, ValueRange dynamicSizes);
  /// The buffer of a result shaped like a tensor, dynamic sizes given: an
  /// out of the kernel. The sizes may be computed in the host code from the
  /// dims of buffer()s and outs (they are recomputed outside the kernel).
  Value allocLike(RankedTensorType type, ValueRange dynamicSizes);
  /// Fills a 32-bit buffer (f32 or i32) with a constant bit pattern.
  void fill32(Value buffer, Value value);
  /// Frees a temporary allocation once the stream reaches this point.
  void release(Value buffer);
  /// The device address of the runtime's error word (moeGpuErrorWord()).
  Value errorWord();
  /// Waits for the stream; with `checkErrors`, then calls moeGpuCheckErrors().
  void finish(bool checkErrors = false);
  /// The tensor of a result buffer (after finish()): the kernel's result of
  /// an out; any other buffer is first copied into a new out on the stream.
  /// The first call makes the moe.kernel; `b` then continues after it.
  Value tensor(Value buffer, RankedTensorType type);
  /// Replaces the results of `op` by the tensors of `buffers` (one each).
  void replace(Operation *op, ValueRange buffers);
  /// Replaces the results of several ops, in order, by the tensors of
  /// `buffers` (an op lowered together with its consumers).
  void replace(ArrayRef<Operation *> ops, ValueRange buffers);

private:
  friend class GPUKernel;
  /// Launches `kernel` on `args` on the stream (GPUKernel::launch).
  /// `dynamicSharedBytes` (an i32, or null: none) is the block's dynamic
  /// shared memory (gpu.dynamic_shared_memory in the kernel).
  void launch(gpu::GPUFuncOp kernel, std::array<Value, 3> grid,
              std::array<int64_t, 3> block, ValueRange args,
              Value dynamicSharedBytes = Value());
  /// The out whose buffer is `buffer`; one holding a copy of it if `buffer`
  /// is not an out.
  BlockArgument outFor(Value buffer, RankedTensorType type);
  /// The kernel's result of `out` as a `type` (making the kernel first).
  Value resultOf(BlockArgument out, RankedTensorType type);
  /// `v` (an index computed in the body) recomputed before the kernel.
  Value hoist(Value v);
  /// Makes the moe.kernel from the body built so far.
  void makeKernelOp();

  Value token;
  /// The op the body is built in until makeKernelOp(): a moe.kernel without
  /// operands whose block arguments are added as ins and outs come.
  Operation *body;
  /// The kernel once made.
  Operation *kernel = nullptr;
  /// The ins (tensors) and outs (alloc_tensor results), in block argument
  /// order.
  SmallVector<Value> ins, outs;
  /// The closing gpu.wait of finish().
  Operation *closingWait = nullptr;
  /// Values of the body recomputed before the kernel (hoist()).
  IRMapping hoisted;
};

/// One kernel of an op's host code, defined and launched in one place: a new
/// gpu.func `<name>_<n>` in @moe_kernels of `h`'s module (built through `h`'s
/// rewriter) whose arguments take the types of `operands`, with the
/// workgroup buffers `workgroupTypes` and the known block size `blockSize`.
/// `b` (and `k` on it) builds the body, from its start (a gpu.return is
/// already there); launch() runs the kernel on `operands` on `h`'s stream.
/// The body and the host code are separate blocks: either may come first.
class GPUKernel {
public:
  GPUKernel(HostCode &h, StringRef name, ValueRange operands,
            TypeRange workgroupTypes, std::array<int64_t, 3> blockSize,
            Location loc);
  GPUKernel(const GPUKernel &) = delete;
  GPUKernel &operator=(const GPUKernel &) = delete;

  /// The builder of the body and the kernel builder on it.
  ImplicitLocOpBuilder b;
  GpuKernelBuilder kb;
  gpu::GPUFuncOp func;

  /// Argument `i`: operand `i` on the device.
  Value arg(unsigned i);
  /// Workgroup buffer `i`.
  Value workgroup(unsigned i);
  /// The thread's index in a 1-D grid: blockIdx.x · blockDim.x + threadIdx.x.
  Value globalId();
  /// A thread per item of [0, `count`) (launchOver): body(item) with the
  /// thread's item, globalId(), on the threads that have one.
  void forItem(Value count, function_ref<void(Value item)> body);

  /// A thread per column (globalId(), blocks along x), the rows strided over
  /// the blocks along y (gridDim.y is capped at 65535, kMaxGridDim of
  /// Limits.h; the row count is not): when `inRange` (the column exists),
  /// body(row) for the rows of [0, rows) that fall to this block. Launch with
  /// launchColumns.
  void forRowsOfColumn(Value inRange, Value rows,
                       function_ref<void(Value row)> body);

  /// Launches the kernel on its operands over `grid` blocks, with
  /// `dynamicSharedBytes` of dynamic shared memory (null: none).
  void launch(std::array<Value, 3> grid, Value dynamicSharedBytes = Value());
  /// Launches it over ceil(`count` / blockDim.x) blocks along x: a thread per
  /// item (globalId()), the last block's extra threads idle.
  void launchOver(Value count);
  /// Launches a forRowsOfColumn kernel: ceil(`cols` / blockDim.x) blocks
  /// along x, min(`rows`, 65535) along y.
  void launchColumns(Value cols, Value rows);

private:
  HostCode &host;
  SmallVector<Value> operands;
  std::array<int64_t, 3> blockSize;
};

/// Dynamic sizes of `type` taken from the dims of `like` at the same
/// positions (both of the same rank).
SmallVector<Value> dynamicSizesFrom(GpuKernelBuilder &kb, RankedTensorType type,
                                    Value like);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_HOSTCODE_H
