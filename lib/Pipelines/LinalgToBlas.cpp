//===- LinalgToBlas.cpp - Large matmuls on buffers -> cblas_sgemm ---------===//
//
// Part of the MoE-MLIR project.
//
// A function-call lowering only: the GEMM itself is the maintained BLAS of the
// system (OpenBLAS from Debian), called through the standard CBLAS ABI with
// the operands' aligned pointers, offsets and leading dimensions.
//
//===----------------------------------------------------------------------===//

#include "MoE/Pipelines/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_LINALGTOBLAS
#include "MoE/Pipelines/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

bool mlir::moe::isBlasCandidate(linalg::LinalgOp op, int64_t minFlops) {
  if (!isa<linalg::MatmulOp, linalg::BatchMatmulOp>(op.getOperation()))
    return false;
  if (isa<linalg::MatmulOp>(op.getOperation()))
    if (op.getIndexingMapsArray() !=
        linalg::MatmulOp::getDefaultIndexingMaps(op->getContext()))
      return false;
  if (isa<linalg::BatchMatmulOp>(op.getOperation()))
    if (op.getIndexingMapsArray() !=
        linalg::BatchMatmulOp::getDefaultIndexingMaps(op->getContext()))
      return false;
  for (OpOperand &operand : op->getOpOperands())
    if (!getElementTypeOrSelf(operand.get().getType()).isF32())
      return false;
  if (op.hasDynamicShape())
    return false;
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  int64_t n = ranges.size();
  // (batch,) m, n, k: the last three loops.
  return ranges[n - 3] * ranges[n - 2] * ranges[n - 1] >= minFlops;
}

namespace {
enum : int32_t { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };

/// How CBLAS sees one (batch of) matrix operand(s): transposed or not, its
/// leading dimension and its batch stride, from static strides.
struct BlasOperand {
  int32_t trans;
  int64_t ld;
  int64_t batchStride;
};

std::optional<BlasOperand> blasLayout(Value memref) {
  auto type = dyn_cast<MemRefType>(memref.getType());
  if (!type)
    return std::nullopt;
  SmallVector<int64_t> strides;
  int64_t offset;
  if (failed(type.getStridesAndOffset(strides, offset)))
    return std::nullopt;
  if (llvm::any_of(strides, ShapedType::isDynamic))
    return std::nullopt;
  int64_t rank = type.getRank();
  int64_t rows = type.getDimSize(rank - 2), cols = type.getDimSize(rank - 1);
  int64_t rs = strides[rank - 2], cs = strides[rank - 1];
  BlasOperand layout{kNoTrans, rs, rank == 3 ? strides[0] : 0};
  // A unit dimension's stride is meaningless: use the one that satisfies
  // CBLAS (ld >= the row length).
  if ((cs == 1 || cols == 1) && (rs >= std::max<int64_t>(1, cols) || rows == 1))
    layout = {kNoTrans, std::max<int64_t>(rs, std::max<int64_t>(1, cols)),
              layout.batchStride};
  else if ((rs == 1 || rows == 1) &&
           (cs >= std::max<int64_t>(1, rows) || cols == 1))
    layout = {kTrans, std::max<int64_t>(cs, std::max<int64_t>(1, rows)),
              layout.batchStride};
  else
    return std::nullopt;
  return layout;
}

class LinalgToBlas : public moe::impl::LinalgToBlasBase<LinalgToBlas> {
public:
  using LinalgToBlasBase::LinalgToBlasBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<linalg::LinalgOp> candidates;
    module.walk([&](linalg::LinalgOp op) {
      if (op.hasPureBufferSemantics() &&
          (moe::isBlasCandidate(op, minFlops) ||
           (op->hasAttr(moe::kBlasAttrName) && moe::isBlasCandidate(op, 0))))
        candidates.push_back(op);
    });
    if (candidates.empty())
      return;
    MLIRContext *ctx = &getContext();
    IRRewriter rewriter(ctx);
    auto ptrType = LLVM::LLVMPointerType::get(ctx);
    Type i32 = rewriter.getI32Type(), f32 = rewriter.getF32Type();
    FunctionType sgemmType = rewriter.getFunctionType(
        {i32, i32, i32, i32, i32, i32, f32, ptrType, i32, ptrType, i32, f32,
         ptrType, i32},
        {});
    auto sgemm = module.lookupSymbol<func::FuncOp>("cblas_sgemm");
    if (!sgemm) {
      rewriter.setInsertionPointToStart(module.getBody());
      sgemm = func::FuncOp::create(rewriter, module.getLoc(), "cblas_sgemm",
                                   sgemmType);
      sgemm.setPrivate();
    } else if (sgemm.getFunctionType() != sgemmType) {
      sgemm.emitError("moe-linalg-to-blas: @cblas_sgemm exists with another "
                      "type");
      return signalPassFailure();
    }

    for (linalg::LinalgOp op : candidates) {
      Value a = op.getDpsInputs()[0], b = op.getDpsInputs()[1],
            c = op.getDpsInits()[0];
      std::optional<BlasOperand> la = blasLayout(a), lb = blasLayout(b),
                                 lc = blasLayout(c);
      if (!la || !lb || !lc || lc->trans != kNoTrans)
        continue; // Left to the loops.
      SmallVector<int64_t> ranges = op.getStaticLoopRanges();
      int64_t n = ranges.size();
      int64_t batch = n == 4 ? ranges[0] : 1;
      int64_t M = ranges[n - 3], N = ranges[n - 2], K = ranges[n - 1];
      if (std::max({M, N, K, la->ld, lb->ld, lc->ld}) > INT32_MAX)
        continue;
      // linalg accumulates into its output: beta = 1, unless the op right
      // before zero-fills that output (the importer's pattern): then the fill
      // goes and beta = 0.
      float betaValue = 1.0f;
      if (auto fill = dyn_cast_or_null<linalg::FillOp>(op->getPrevNode()))
        if (fill.hasPureBufferSemantics() && fill.getDpsInits()[0] == c &&
            matchPattern(fill.getDpsInputs()[0], m_AnyZeroFloat())) {
          rewriter.eraseOp(fill);
          betaValue = 0.0f;
        }
      Location loc = op.getLoc();
      rewriter.setInsertionPoint(op);
      auto i32c = [&](int64_t v) -> Value {
        return arith::ConstantIntOp::create(rewriter, loc, v, 32);
      };
      auto f32c = [&](float v) -> Value {
        return arith::ConstantFloatOp::create(rewriter, loc,
                                              cast<FloatType>(f32),
                                              APFloat(v));
      };
      // Element offset (an index) of each operand's first element.
      auto baseAndOffset = [&](Value m) -> std::pair<Value, Value> {
        Value base =
            memref::ExtractAlignedPointerAsIndexOp::create(rewriter, loc, m);
        auto md = memref::ExtractStridedMetadataOp::create(rewriter, loc, m);
        return {base, md.getOffset()};
      };
      auto [baseA, offA] = baseAndOffset(a);
      auto [baseB, offB] = baseAndOffset(b);
      auto [baseC, offC] = baseAndOffset(c);
      auto pointer = [&](OpBuilder &bld, Value base, Value offset, Value b,
                         int64_t batchStride) -> Value {
        Value elem = offset;
        if (b) {
          Value stride = arith::ConstantIndexOp::create(bld, loc, batchStride);
          elem = arith::AddIOp::create(
              bld, loc, elem, arith::MulIOp::create(bld, loc, b, stride));
        }
        Value four = arith::ConstantIndexOp::create(bld, loc, 4);
        Value addr = arith::AddIOp::create(
            bld, loc, base, arith::MulIOp::create(bld, loc, elem, four));
        Value i64 =
            arith::IndexCastOp::create(bld, loc, bld.getI64Type(), addr);
        return LLVM::IntToPtrOp::create(bld, loc, ptrType, i64);
      };
      SmallVector<Value> fixed = {i32c(kRowMajor), i32c(la->trans),
                                  i32c(lb->trans), i32c(M),
                                  i32c(N),         i32c(K),
                                  f32c(1.0f)};
      Value lda = i32c(la->ld), ldb = i32c(lb->ld), ldc = i32c(lc->ld),
            beta = f32c(betaValue);
      auto emitCall = [&](OpBuilder &bld, Value b) {
        SmallVector<Value> args(fixed);
        args.append({pointer(bld, baseA, offA, b, la->batchStride), lda,
                     pointer(bld, baseB, offB, b, lb->batchStride), ldb, beta,
                     pointer(bld, baseC, offC, b, lc->batchStride), ldc});
        func::CallOp::create(bld, loc, sgemm, args);
      };
      if (n == 4) {
        Value zero = arith::ConstantIndexOp::create(rewriter, loc, 0);
        Value one = arith::ConstantIndexOp::create(rewriter, loc, 1);
        Value ub = arith::ConstantIndexOp::create(rewriter, loc, batch);
        scf::ForOp::create(rewriter, loc, zero, ub, one, ValueRange{},
                           [&](OpBuilder &bld, Location, Value iv, ValueRange) {
                             emitCall(bld, iv);
                             scf::YieldOp::create(bld, loc);
                           });
      } else {
        emitCall(rewriter, Value());
      }
      rewriter.eraseOp(op);
    }
  }
};
} // namespace
