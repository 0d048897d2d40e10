//===- HyperRouter.cpp - moe.hyper_router on the GPU ----------------------===//
//
// Part of the MoE-MLIR project.
//
// The GEMV chain out = w2 · relu(w1 · emb + b1) + b2 as two warp-per-row
// kernels (Gemv.h: the row dot shared with the CPU kernel), the second
// writing straight into w [E, D] and b [E] (kernels::hyperSlot). With
// constant operands the dialect folder has already replaced the op by
// constants.
//
//===----------------------------------------------------------------------===//

#include "Gemv.h"
#include "HostCode.h"
#include "Lowerings.h"

#include "MoE/Kernels/Gemv.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

template <>
LogicalResult
GPULowering<HyperRouterOp>::lower(HyperRouterOp op, OpAdaptor adaptor,
                                  ConversionPatternRewriter &rewriter) const {
  const int64_t E = op.getNumExperts();
  HostCode h(rewriter, op);
  GpuKernelBuilder &kb = h.kb;
  Value emb = h.buffer(adaptor.getEmb()), w1 = h.buffer(adaptor.getW1()),
        b1 = h.buffer(adaptor.getB1()), w2 = h.buffer(adaptor.getW2()),
        b2 = h.buffer(adaptor.getB2());
  auto wType = cast<RankedTensorType>(op.getW().getType());
  auto bType = cast<RankedTensorType>(op.getB().getType());
  Value rows2 = kb.dim(w2, 0);
  Value D = kb.sub(kb.divu(rows2, kb.idx(E)), kb.idx(1));
  SmallVector<Value> wSizes;
  if (wType.isDynamicDim(1))
    wSizes.push_back(D);
  Value w = h.allocLike(wType, wSizes);
  Value bias = h.allocLike(bType, {});
  Value Dh = kb.dim(w1, 0);
  Value hidden =
      h.alloc(MemRefType::get({ShapedType::kDynamic}, h.b.getF32Type()), {Dh});

  launchGemv(h, "hyper_router_hidden", {w1, emb, b1, hidden}, op.getLoc(),
             /*relu=*/true, [](GPUKernel &kernel, Value row, Value v) {
               kernel.kb.store(v, kernel.arg(3), {row});
             });
  launchGemv(h, "hyper_router_out", {w2, hidden, b2, w, bias}, op.getLoc(),
             /*relu=*/false, [](GPUKernel &kernel, Value row, Value v) {
               GpuKernelBuilder &kb = kernel.kb;
               Value wOut = kernel.arg(3), bOut = kernel.arg(4);
               kernels::HyperSlot slot =
                   kernels::hyperSlot(kb, row, kb.dim(wOut, 1));
               kb.ifThen(slot.isBias, [&] { kb.store(v, bOut, {slot.expert}); });
               kb.ifThen(kb.notI1(slot.isBias), [&] {
                 kb.store(v, wOut, {slot.expert, slot.column});
               });
             });
  h.release(hidden);
  h.finish();
  h.replace(op, {w, bias});
  return success();
}
