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

namespace {
/// The loops of a contraction that is one GEMM per batch element:
/// C[b, m, n] += A[b?, m, k] * B[b?, k, n]. `m` and `n` are the two innermost
/// dimensions of C (n the last one); every loop is one of b, m, n, k, or a
/// unit loop. The batch loop may be missing from A or B (a broadcast
/// operand: batch stride 0), which covers the importer's expert einsums
/// (`td,edf->etf`) as well as matmul and batch_matmul in any operand layout.
struct GemmLoops {
  std::optional<unsigned> batch;
  unsigned m, n, k;
};

std::optional<GemmLoops> gemmLoops(linalg::LinalgOp op) {
  if (op.getNumDpsInputs() != 2 || op.getNumDpsInits() != 1 ||
      !linalg::isaContractionOpInterface(op))
    return std::nullopt;
  SmallVector<AffineMap> maps = op.getIndexingMapsArray();
  if (!llvm::all_of(maps, [](AffineMap m) { return m.isProjectedPermutation(); }))
    return std::nullopt;
  AffineMap mapC = maps[2];
  unsigned numLoops = op.getNumLoops();
  if (mapC.getNumResults() < 2)
    return std::nullopt;
  auto has = [](AffineMap m, unsigned d) {
    return m.isFunctionOfDim(d);
  };
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  unsigned rc = mapC.getNumResults();
  GemmLoops loops{std::nullopt, mapC.getDimPosition(rc - 2),
                  mapC.getDimPosition(rc - 1), 0};
  if (!has(maps[0], loops.m) || has(maps[1], loops.m) ||
      !has(maps[1], loops.n) || has(maps[0], loops.n))
    return std::nullopt;
  std::optional<unsigned> k;
  for (unsigned d = 0; d < numLoops; ++d) {
    if (d == loops.m || d == loops.n)
      continue;
    if (!has(mapC, d)) {
      // A reduction loop: k when both operands read it, once.
      if (!has(maps[0], d) || !has(maps[1], d) || k)
        return std::nullopt;
      k = d;
      continue;
    }
    // Another output loop: the batch loop (one), or a unit loop.
    if (ranges[d] == 1)
      continue;
    if (loops.batch)
      return std::nullopt;
    loops.batch = d;
  }
  if (!k)
    return std::nullopt;
  loops.k = *k;
  return loops;
}
} // namespace

bool mlir::moe::isBlasCandidate(linalg::LinalgOp op, int64_t minFlops) {
  for (OpOperand &operand : op->getOpOperands())
    if (!getElementTypeOrSelf(operand.get().getType()).isF32())
      return false;
  if (op.hasDynamicShape())
    return false;
  std::optional<GemmLoops> loops = gemmLoops(op);
  if (!loops)
    return false;
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  return ranges[loops->m] * ranges[loops->n] * ranges[loops->k] >= minFlops;
}

namespace {
enum : int32_t { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };

/// How CBLAS sees one (batch of) matrix operand(s): transposed or not, its
/// leading dimension and its batch stride.
struct BlasOperand {
  int32_t trans;
  int64_t ld;
  int64_t batchStride;
};

/// The layout of operand `operand` of `op` (a buffer with static strides)
/// as the `rows` x `cols` matrix of loops (row, col), batched along `batch`:
/// each loop's stride is the stride of the operand dimension the loop indexes
/// (0 for a loop the operand does not read: a broadcast).
std::optional<BlasOperand> blasLayout(linalg::LinalgOp op, OpOperand &operand,
                                      unsigned row, unsigned col,
                                      std::optional<unsigned> batch) {
  auto type = dyn_cast<MemRefType>(operand.get().getType());
  if (!type)
    return std::nullopt;
  SmallVector<int64_t> strides;
  int64_t offset;
  if (failed(type.getStridesAndOffset(strides, offset)))
    return std::nullopt;
  if (llvm::any_of(strides, ShapedType::isDynamic))
    return std::nullopt;
  AffineMap map = op.getMatchingIndexingMap(&operand);
  auto loopStride = [&](unsigned loop) -> int64_t {
    for (unsigned r = 0; r < map.getNumResults(); ++r)
      if (map.getDimPosition(r) == loop)
        return strides[r];
    return 0;
  };
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  int64_t rows = ranges[row], cols = ranges[col];
  int64_t rs = loopStride(row), cs = loopStride(col);
  int64_t batchStride = batch ? loopStride(*batch) : 0;
  // A unit dimension's stride is meaningless: use the one that satisfies
  // CBLAS (ld >= the row length).
  if ((cs == 1 || cols == 1) && (rs >= std::max<int64_t>(1, cols) || rows == 1))
    return BlasOperand{kNoTrans, std::max<int64_t>(rs, std::max<int64_t>(1, cols)),
                       batchStride};
  if ((rs == 1 || rows == 1) && (cs >= std::max<int64_t>(1, rows) || cols == 1))
    return BlasOperand{kTrans, std::max<int64_t>(cs, std::max<int64_t>(1, rows)),
                       batchStride};
  return std::nullopt;
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
      std::optional<GemmLoops> loops = gemmLoops(op);
      if (!loops)
        continue;
      std::optional<BlasOperand> la = blasLayout(
          op, *op.getDpsInputOperand(0), loops->m, loops->k, loops->batch);
      std::optional<BlasOperand> lb = blasLayout(
          op, *op.getDpsInputOperand(1), loops->k, loops->n, loops->batch);
      std::optional<BlasOperand> lc = blasLayout(
          op, *op.getDpsInitOperand(0), loops->m, loops->n, loops->batch);
      if (!la || !lb || !lc || lc->trans != kNoTrans)
        continue; // Left to the loops.
      SmallVector<int64_t> ranges = op.getStaticLoopRanges();
      int64_t batch = loops->batch ? ranges[*loops->batch] : 1;
      int64_t M = ranges[loops->m], N = ranges[loops->n], K = ranges[loops->k];
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
        if (b && batchStride != 0) { // 0: the operand is broadcast
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
      if (loops->batch) {
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
