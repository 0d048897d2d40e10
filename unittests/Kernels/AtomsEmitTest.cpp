//===- AtomsEmitTest.cpp - The emitted lane arithmetic is the layout ------===//
//
// Part of the MoE-MLIR project.
//
// lib/Conversion/MoEToGPU/Atoms.h turns a layout into index arithmetic on
// the lane id; here that arithmetic is emitted for each lane as a constant
// and evaluated, and must give what the layout gives, for every lane and
// value of every atom and of the flash kernels' ldmatrix placements.
//
//===----------------------------------------------------------------------===//

#include "Atoms.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using kernels::Layout;
using kernels::TileCoord;
using kernels::TVLayout;

namespace {

/// The value of the index arithmetic (constants, add, mul, divu, remu) that
/// defines `v`.
int64_t evaluate(Value v) {
  Operation *op = v.getDefiningOp();
  if (auto c = dyn_cast<arith::ConstantIndexOp>(op))
    return c.value();
  int64_t x = evaluate(op->getOperand(0)), y = evaluate(op->getOperand(1));
  if (isa<arith::AddIOp>(op))
    return x + y;
  if (isa<arith::MulIOp>(op))
    return x * y;
  if (isa<arith::DivUIOp>(op))
    return x / y;
  if (isa<arith::RemUIOp>(op))
    return x % y;
  ADD_FAILURE() << "unexpected op in the lane arithmetic";
  return -1;
}

class AtomsEmit : public ::testing::Test {
protected:
  AtomsEmit() : module(ModuleOp::create(UnknownLoc::get(&ctx))) {
    ctx.loadDialect<arith::ArithDialect>();
  }
  /// A builder at the end of the module (the ops are only evaluated).
  ImplicitLocOpBuilder builder() {
    return ImplicitLocOpBuilder::atBlockEnd(module->getLoc(),
                                            module->getBody());
  }
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module;
};

TEST_F(AtomsEmit, LdmatrixPlacementsGiveTheLayoutsRows) {
  // The flash kernels' placements (MmaFragments.h): quadrants by row, by
  // column (.x4), by column repeated (.x2), in a 16 x 16 window at (32, 48).
  for (Layout placement : {Layout({2, 2}, {128, 8}), Layout({2, 2}, {8, 128}),
                           Layout({2, 2}, {8, 0})}) {
    Layout lanes = kernels::atoms::ldmatrixRows(placement, 16);
    ImplicitLocOpBuilder b = builder();
    kernels::KernelBuilder kb(b);
    for (int64_t lane = 0; lane < 32; ++lane) {
      // As the kernels call it: lane % 8 and lane / 8 already at hand.
      LaneCoords fromTop(kb, lanes.shape(),
                         {kb.idx(lane % 8), kb.idx(lane / 8)});
      LaneCoords fromLane(kb, lanes.shape(), kb.idx(lane));
      TileCoord want = kernels::tileStride(lanes(lane), 16);
      for (LaneCoords *coords : {&fromTop, &fromLane}) {
        IndexPair at =
            laneTileCoord(kb, *coords, lanes, 16, kb.idx(32), kb.idx(48));
        EXPECT_EQ(evaluate(at.row), 32 + want.row) << lanes.str() << lane;
        EXPECT_EQ(evaluate(at.col), 48 + want.col) << lanes.str() << lane;
      }
    }
  }
}

TEST_F(AtomsEmit, FragmentsGiveTheAtomsElements) {
  namespace atoms = kernels::atoms;
  for (const TVLayout &tv :
       {atoms::mmaM16N8K16A(), atoms::mmaM16N8K16B(), atoms::mmaM16N8C(),
        atoms::mmaM16N8K8Tf32A(), atoms::mmaM16N8K8Tf32B(),
        atoms::ldmatrix(4, false), atoms::ldmatrix(2, true)}) {
    ImplicitLocOpBuilder b = builder();
    kernels::KernelBuilder kb(b);
    for (int64_t lane = 0; lane < 32; ++lane) {
      LaneCoords coords(kb, tv.map.mode(0).shape(), kb.idx(lane));
      for (int64_t v = 0; v < tv.values(); ++v) {
        IndexPair at = fragmentTileCoord(kb, coords, tv, v, 16, 8);
        TileCoord want = tv(lane, v);
        EXPECT_EQ(evaluate(at.row), 16 + want.row) << tv.map.str() << lane;
        EXPECT_EQ(evaluate(at.col), 8 + want.col) << tv.map.str() << lane;
      }
    }
  }
}

TEST_F(AtomsEmit, LaneCoordinatesAreEmittedOnce) {
  // The C fragment's 4 values share the lane's two coordinates: one remu
  // (threadID_in_group) and the rest (groupID, the last mode) as one divu.
  ImplicitLocOpBuilder b = builder();
  kernels::KernelBuilder kb(b);
  TVLayout c = kernels::atoms::mmaM16N8C();
  LaneCoords coords(kb, c.map.mode(0).shape(), kb.idx(5));
  for (int64_t v = 0; v < 4; ++v)
    fragmentTileCoord(kb, coords, c, v, 0, 0);
  int64_t remu = 0, divu = 0;
  module->walk([&](Operation *op) {
    remu += isa<arith::RemUIOp>(op);
    divu += isa<arith::DivUIOp>(op);
  });
  EXPECT_EQ(remu, 1);
  EXPECT_EQ(divu, 1);
}

} // namespace
