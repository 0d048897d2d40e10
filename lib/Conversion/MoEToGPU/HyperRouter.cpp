//===- HyperRouter.cpp - moe.hyper_router on the GPU ----------------------===//
//
// Part of the MoE-MLIR project.
//
// The GEMV chain out = w2 · relu(w1 · emb + b1) + b2 as two warp-per-row
// kernels (lanes stride the row, coalesced; a butterfly sum), the second
// writing straight into w [E, D] and b [E]. With constant operands the
// dialect folder has already replaced the op by constants.
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"
#include "Lowerings.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

static constexpr int64_t kThreads = 128;
static constexpr int64_t kRowsPerBlock = kThreads / kWarp;

/// Warp-per-row GEMV: row r gets Σ_c m[r, c] · vec[c] + bias[r]; `store`
/// writes it (lane 0 of the warp).
static gpu::GPUFuncOp
createGemvKernel(HostCode &host, StringRef name, TypeRange argTypes,
                 Location loc,
                 function_ref<void(KB &, Block &, Value row, Value v)> store) {
  ImplicitLocOpBuilder kb(loc, host.b.getContext());
  auto kernel = createKernel(host, name, argTypes, {}, {kThreads, 1, 1}, kb);
  KB k(kb);
  Block &entry = kernel.getBody().front();
  Value m = entry.getArgument(0), vec = entry.getArgument(1),
        bias = entry.getArgument(2);
  Value warp = k.divu(k.threadId(), k.idx(kWarp));
  Value lane = k.remu(k.threadId(), k.idx(kWarp));
  Value row = k.add(k.mul(k.blockId(), k.idx(kRowsPerBlock)), warp);
  Value rows = k.dim(m, 0), cols = k.dim(m, 1);
  Value active = k.lt(row, rows);
  Value safe = k.select(active, row, k.sub(rows, k.idx(1)));
  Value part = k.forLoop(lane, cols, k.idx(kWarp), {k.cF32(0.0)},
                         [&](Value c, ValueRange acc) -> SmallVector<Value> {
                           return {k.fadd(acc[0], k.fmul(k.loadF(m, {safe, c}),
                                                         k.loadF(vec, {c})))};
                         })[0];
  Value sum = subgroupReduce(k, part, ReduceKind::Sum, kWarp);
  k.ifThen(k.andI(active, k.eq(lane, k.idx(0))),
           [&] { store(k, entry, row, k.fadd(sum, k.loadF(bias, {row}))); });
  return kernel;
}

LogicalResult
HyperRouterToGPU::lower(HyperRouterOp op, OpAdaptor adaptor,
                        ConversionPatternRewriter &rewriter) const {
  const int64_t E = op.getNumExperts();
  HostCode h(rewriter, op);
  KB &k = h.k;
  Value emb = h.buffer(adaptor.getEmb()), w1 = h.buffer(adaptor.getW1()),
        b1 = h.buffer(adaptor.getB1()), w2 = h.buffer(adaptor.getW2()),
        b2 = h.buffer(adaptor.getB2());
  auto wType = cast<RankedTensorType>(op.getW().getType());
  auto bType = cast<RankedTensorType>(op.getB().getType());
  Value rows2 = k.dim(w2, 0);
  Value D = k.sub(k.divu(rows2, k.idx(E)), k.idx(1));
  SmallVector<Value> wSizes;
  if (wType.isDynamicDim(1))
    wSizes.push_back(D);
  Value w = h.allocLike(wType, wSizes);
  Value bias = h.allocLike(bType, {});
  Value Dh = k.dim(w1, 0);
  Value hidden =
      h.alloc(MemRefType::get({ShapedType::kDynamic}, h.b.getF32Type()), {Dh});

  auto first = createGemvKernel(
      h, "hyper_router_hidden",
      {w1.getType(), emb.getType(), b1.getType(), hidden.getType()},
      op.getLoc(), [](KB &k, Block &entry, Value row, Value v) {
        k.store(k.fmax(v, k.cF32(0.0)), entry.getArgument(3), {row});
      });
  h.launch(first, {k.ceilDiv(Dh, k.idx(kRowsPerBlock)), k.idx(1), k.idx(1)},
           {kThreads, 1, 1}, {w1, emb, b1, hidden});
  auto second = createGemvKernel(
      h, "hyper_router_out",
      {w2.getType(), hidden.getType(), b2.getType(), w.getType(),
       bias.getType()},
      op.getLoc(), [](KB &k, Block &entry, Value row, Value v) {
        Value wOut = entry.getArgument(3), bOut = entry.getArgument(4);
        Value width = k.add(k.dim(wOut, 1), k.idx(1));
        Value e = k.divu(row, width), c = k.remu(row, width);
        Value isBias = k.eq(c, k.dim(wOut, 1));
        k.ifThen(isBias, [&] { k.store(v, bOut, {e}); });
        k.ifThen(k.notI1(isBias), [&] { k.store(v, wOut, {e, c}); });
      });
  h.launch(second, {k.ceilDiv(rows2, k.idx(kRowsPerBlock)), k.idx(1), k.idx(1)},
           {kThreads, 1, 1}, {w2, hidden, b2, w, bias});
  h.release(hidden);
  h.finish();
  h.replace(op, {w, bias});
  return success();
}
