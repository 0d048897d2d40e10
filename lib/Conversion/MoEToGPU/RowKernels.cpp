//===- RowKernels.cpp - Layouts of the kernels over rows ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "RowKernels.h"
#include "Lowerings.h"

#include "MoE/Kernels/Balance.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

Value mlir::moe::gpu_lowering::allocResultLike(HostCode &h,
                                               RankedTensorType type,
                                               Value like) {
  return h.allocLike(type, dynamicSizesFrom(h.kb, type, like));
}

void mlir::moe::gpu_lowering::lowerWarpRowKernel(
    RewriterBase &rewriter, Operation *op, Value result, Value logits,
    ValueRange inputs, StringRef name, int64_t blockSize,
    function_ref<void(WarpRowKernel &k)> body) {
  HostCode h(rewriter, op);
  Value x = h.buffer(logits);
  SmallVector<Value> args = {x};
  for (Value input : inputs)
    if (input)
      args.push_back(h.buffer(input));
  Value out = allocResultLike(h, cast<RankedTensorType>(result.getType()), x);
  args.push_back(out);
  GPUKernel kernel(h, name, args, {}, {blockSize, 1, 1}, op->getLoc());
  GpuKernelBuilder &g = kernel.kb;
  Value xs = kernel.arg(0), outArg = kernel.arg(args.size() - 1);
  WarpRow w(g, blockSize);
  Value rows = g.dim(xs, 0);
  Value numExperts = g.dim(xs, 1);
  WarpRowKernel k{g, kernel, w, xs, outArg, rows, numExperts};
  g.ifThen(g.lt(w.row, rows), [&] { body(k); });
  GpuKernelBuilder &kb = h.kb;
  kernel.launch(
      {WarpRow::blocks(kb, kb.dim(x, 0), blockSize), kb.idx(1), kb.idx(1)});
  h.finish();
  h.replace(op, {out});
}

void mlir::moe::gpu_lowering::lowerPickGradKernel(
    RewriterBase &rewriter, Operation *op, ValueRange operands, StringRef name,
    function_ref<void(PickGradKernel &k)> body) {
  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  Value xs = h.buffer(operands[0]);
  auto type = cast<RankedTensorType>(op->getResult(0).getType());
  Value out = allocResultLike(h, type, xs);
  SmallVector<Value> args = {
      viewAs2D(b, xs), viewAs2D(b, h.buffer(operands[1])),
      viewAs2D(b, h.buffer(operands[2])), viewAs2D(b, out)};
  GPUKernel kernel(h, name, args, {}, {kKernelThreads, 1, 1}, op->getLoc());
  PickGradKernel k{kernel.kb,     kernel,        kernel.arg(0),
                   kernel.arg(1), kernel.arg(2), kernel.arg(3)};
  body(k);
  kernel.launchOver(h.kb.dim(args[0], 0));
  h.finish();
  h.replace(op, {out});
}

Value mlir::moe::gpu_lowering::allocReduced(HostCode &h, Value result,
                                            Value x) {
  auto type = cast<RankedTensorType>(result.getType());
  if (type.hasStaticShape())
    return h.allocLike(type, {});
  return h.allocLike(type, {h.kb.dim(x, 1)});
}

WarpRow::WarpRow(GpuKernelBuilder &g, int64_t blockSize) {
  Value tid = g.threadId();
  lane = g.remu(tid, g.idx(kWarp));
  Value warp = g.divu(tid, g.idx(kWarp));
  Value block = g.blockId();
  Value firstRow = g.mul(block, g.idx(blockSize / kWarp));
  row = g.add(firstRow, warp);
}

Value WarpRow::blocks(GpuKernelBuilder &kb, Value rows, int64_t blockSize) {
  return kb.ceilDiv(rows, kb.idx(blockSize / kWarp));
}

RowBlock::RowBlock(GpuKernelBuilder &g, Value x) : g(g) {
  tid = g.threadId();
  warp = g.divu(tid, g.idx(kWarp));
  lane = g.remu(tid, g.idx(kWarp));
  rows = g.dim(x, 0);
  block = g.blockId();
  first = g.mul(block, g.idx(kernels::kBalanceRowsPerBlock));
  Value left = g.sub(rows, first);
  count = g.minu(left, g.idx(kernels::kBalanceRowsPerBlock));
}

void RowBlock::forEachRowOfWarp(function_ref<void(Value r)> body) {
  g.forLoop(warp, count, g.idx(kRowBlockThreads / kWarp), body);
}

Value mlir::moe::gpu_lowering::rowBlockCount(GpuKernelBuilder &kb,
                                             Value rows) {
  return kb.ceilDiv(rows, kb.idx(kernels::kBalanceRowsPerBlock));
}

SmallVector<Value>
mlir::moe::gpu_lowering::sumInOrder(GpuKernelBuilder &g, Value n,
                                    ArrayRef<function_ref<Value(Value)>> terms) {
  SmallVector<Value> zeros;
  for (size_t j = 0; j < terms.size(); ++j)
    zeros.push_back(g.cF32(0.0));
  Value from = g.idx(0);
  Value step = g.idx(1);
  return g.forLoop(from, n, step, zeros,
                   [&](Value i, ValueRange acc) -> SmallVector<Value> {
                     SmallVector<Value> next;
                     for (auto [sum, term] : llvm::zip_equal(acc, terms))
                       next.push_back(g.fadd(sum, term(i)));
                     return next;
                   });
}

Value mlir::moe::gpu_lowering::sumInOrder(GpuKernelBuilder &g, Value n,
                                          function_ref<Value(Value)> term) {
  return sumInOrder(g, n, ArrayRef<function_ref<Value(Value)>>{term})[0];
}
