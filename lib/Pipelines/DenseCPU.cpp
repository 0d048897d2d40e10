//===- DenseCPU.cpp - Tile, fuse and vectorize the dense linalg ops -------===//
//
// Part of the MoE-MLIR project.
//
// The CPU strategy for what the moe kernels leave: the importer's matmuls,
// contractions, reductions and elementwise chains. Upstream transformations
// only (TilingInterface tile-and-fuse, linalg::vectorize, the vector lowering
// patterns); this file chooses tile sizes and what to fuse.
//
// Three tiling levels on tensors, each a tile-and-fuse of a *root* (the last
// op of a chain, visited in reverse order) with its single-use producers:
//   1. threads: an scf.forall over the root's outer parallel loops;
//   2. registers: scf.for loops to at most tile-m x tile-n outputs (the two
//      innermost output dimensions), or 64-element rows for reductions;
//   3. reductions: the k loop of a contraction in steps of 1; a row
//      reduction as a partial reduction into 64-lane accumulators; other
//      long reductions in chunks of 256.
// A producer is fused only when no tiled loop is missing from its slice's
// offsets, i.e. when fusion never computes the same element twice (a
// matmul's A operand is not recomputed for every column tile, a row
// reduction not for every column tile of its consumer). The exception is an
// elementwise producer read by several ops of the root's chain: each gets
// its own copy, which is cheaper than a round trip through memory; the
// copy's own producers are then read from memory, never computed again (a
// producer kept whole for one slice is not fused for another).
//
//===----------------------------------------------------------------------===//

#include "MoE/Pipelines/Passes.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Hoisting.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/TileUsingInterface.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/Transforms.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Dialect/Vector/Transforms/LoweringPatterns.h"
#include "mlir/Dialect/Vector/Transforms/VectorRewritePatterns.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/LoopInvariantCodeMotionUtils.h"

#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::moe {
#define GEN_PASS_DEF_DENSETILEANDVECTORIZE
#define GEN_PASS_DEF_DENSELOWERVECTORS
#include "MoE/Pipelines/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {
/// Largest divisor of `n` that is at most `cap` (at least 1); a multiple of
/// 16 (a full AVX-512 register of f32) when one exists.
int64_t divisorAtMost(int64_t n, int64_t cap) {
  cap = std::max<int64_t>(1, std::min(n, cap));
  for (int64_t t = cap - cap % 16; t >= 16; t -= 16)
    if (n % t == 0)
      return t;
  for (int64_t t = cap; t > 1; --t)
    if (n % t == 0)
      return t;
  return 1;
}

/// Iterations of an op that linalg::vectorize turns into one set of vectors
/// (64 registers of 16 f32 at most: larger ones are tiled first, else stay
/// loops).
constexpr int64_t kMaxVectorElements = 1024;

/// Width of the accumulators of partial reductions (see usesPartialReduction).
constexpr int64_t kPartialLanes = 64;

/// A zero-sized loop has nothing to compute, and upstream tiling divides by
/// the loop size: such ops (a reduction over D = 0, say) are left to the loops
/// of convert-linalg-to-loops, which run zero times, and are never fused.
bool hasZeroSizedLoop(linalg::LinalgOp op) {
  return llvm::is_contained(op.getStaticLoopRanges(), 0);
}

/// The ops the strategy takes: static shapes, at least one loop, one result
/// (multi-result reductions, which only the portable moe lowerings emit, are
/// left to the loops: not validated).
bool isStaticTensorOp(linalg::LinalgOp op) {
  // i1 tensors (masks) stay scalar: a vector of i1 loaded from a byte-per-
  // element buffer reads packed bits (AtenSurface's masked_fill went wrong).
  for (Value v : op->getOperands()) {
    Type t = getElementTypeOrSelf(v.getType());
    if (t.isIntOrFloat() && t.getIntOrFloatBitWidth() < 8)
      return false;
  }
  // math.fpowi vectorizes to llvm.intr.powi with a vector exponent, which
  // LLVM rejects.
  bool powi = false;
  op->walk([&](Operation *inner) {
    powi |= inner->getName().getStringRef() == "math.fpowi";
  });
  return !powi && op.hasPureTensorSemantics() && !op.hasDynamicShape() &&
         op.getNumLoops() > 0 && op->getNumResults() == 1 &&
         !hasZeroSizedLoop(op);
}

bool isContraction(linalg::LinalgOp op) {
  return op.getNumReductionLoops() > 0 &&
         linalg::isaContractionOpInterface(op) &&
         succeeded(linalg::inferContractionDims(op));
}

/// A contraction with both an m and an n dimension (a matmul, batched or
/// not, whatever its operand layouts): vectorized to vector.contract, which
/// lowers to outer products. Other contractions (a dimension in all three
/// operands, e.g. the gate combine `te,etd->td`) vectorize elementwise.
bool isMatmulLike(linalg::LinalgOp op) {
  if (!isContraction(op))
    return false;
  FailureOr<linalg::ContractionDimensions> dims =
      linalg::inferContractionDims(op);
  return succeeded(dims) && !dims->m.empty() && !dims->n.empty();
}

int64_t iterationCount(linalg::LinalgOp op) {
  int64_t n = 1;
  for (int64_t r : op.getStaticLoopRanges())
    n *= r;
  return n;
}

/// Loop dimension of each result dimension of the op's first output (-1
/// where the output map has no plain dimension there).
SmallVector<int64_t> outputLoops(linalg::LinalgOp op) {
  AffineMap map = op.getIndexingMapMatchingResult(op->getResult(0));
  SmallVector<int64_t> dims;
  for (AffineExpr e : map.getResults())
    dims.push_back(isa<AffineDimExpr>(e) ? cast<AffineDimExpr>(e).getPosition()
                                         : -1);
  return dims;
}

/// A parallel region costs tens of microseconds (async dispatch, waking the
/// workers, the caller's wait: 30-50 us per region measured on a 2-vCPU
/// Intel Xeon VM), a 2^16-element elementwise op about 10 on one thread:
/// mad_dispersion's O(E·D) tail at E = D = 256 (five such ops) took 0.3 ms
/// more on two threads than on one. A chain (chainIterations) of fewer than
/// 2^17 iterations stays on the calling thread.
constexpr int64_t kMinThreadedIterations = int64_t(1) << 17;

/// The most iterations of `root` and of the linalg ops it reads, transitively
/// up to 16 steps back (its chain, which tile-and-fuse may pull into its
/// thread tiles): a small elementwise consumer of a large matmul is a large
/// chain. Breadth-first, each op once: a producer read by several ops of the
/// chain is not walked again for each path to it.
int64_t chainIterations(linalg::LinalgOp root) {
  constexpr int kMaxDepth = 16;
  int64_t n = iterationCount(root);
  llvm::SmallPtrSet<Operation *, 16> seen = {root};
  SmallVector<linalg::LinalgOp> level = {root};
  for (int depth = 0; depth < kMaxDepth && !level.empty(); ++depth) {
    SmallVector<linalg::LinalgOp> next;
    for (linalg::LinalgOp op : level)
      for (Value v : op->getOperands())
        if (auto producer = v.getDefiningOp<linalg::LinalgOp>())
          if (seen.insert(producer).second) {
            n = std::max(n, iterationCount(producer));
            next.push_back(producer);
          }
    level = std::move(next);
  }
  return n;
}

/// Level 1: about 4 tiles per worker over the outer parallel loops, none for
/// chains of fewer than kMinThreadedIterations iterations.
SmallVector<int64_t> threadTileSizes(linalg::LinalgOp op, int64_t threads) {
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  SmallVector<int64_t> sizes(ranges.size(), 0);
  if (threads <= 1 || chainIterations(op) < kMinThreadedIterations)
    return sizes;
  int64_t target = 4 * threads, tiles = 1;
  SmallVector<int64_t> outDims = outputLoops(op);
  for (int64_t d : outDims) {
    if (d < 0 || tiles >= target)
      continue;
    int64_t need = (target + tiles - 1) / tiles;
    int64_t count = ranges[d];
    for (int64_t c = need; c <= ranges[d]; ++c)
      if (ranges[d] % c == 0) {
        count = c;
        break;
      }
    if (count <= 1)
      continue;
    sizes[d] = ranges[d] / count;
    tiles *= count;
  }
  return sizes;
}

/// Level 2: register tiles. The two innermost output dimensions get
/// tile-m x tile-n (a contraction's m and n; rows of an elementwise op);
/// other parallel loops 1. A non-contraction reduction gets rows of at
/// most 64 on its innermost loop when that one is parallel, 1 elsewhere.
SmallVector<int64_t> registerTileSizes(linalg::LinalgOp op, int64_t tileM,
                                       int64_t tileN) {
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  SmallVector<utils::IteratorType> iters = op.getIteratorTypesArray();
  SmallVector<int64_t> sizes(ranges.size(), 0);
  for (auto [d, it] : llvm::enumerate(iters))
    if (it == utils::IteratorType::parallel)
      sizes[d] = 1;
  if (op.getNumReductionLoops() > 0 && !isContraction(op)) {
    int64_t last = ranges.size() - 1;
    if (iters[last] == utils::IteratorType::parallel)
      sizes[last] = divisorAtMost(ranges[last], 64);
    return sizes;
  }
  SmallVector<int64_t> outDims = outputLoops(op);
  int64_t rank = outDims.size();
  if (rank >= 1 && outDims[rank - 1] >= 0)
    sizes[outDims[rank - 1]] = divisorAtMost(ranges[outDims[rank - 1]], tileN);
  if (rank >= 2 && outDims[rank - 2] >= 0)
    sizes[outDims[rank - 2]] = divisorAtMost(ranges[outDims[rank - 2]], tileM);
  return sizes;
}

/// Level 3: a contraction's k loops in steps of 1; a long reduction's
/// innermost reduction loop in chunks of at most 256, others in steps of 1.
SmallVector<int64_t> reductionTileSizes(linalg::LinalgOp op) {
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  SmallVector<utils::IteratorType> iters = op.getIteratorTypesArray();
  SmallVector<int64_t> sizes(ranges.size(), 0);
  bool contraction = isContraction(op);
  int64_t innermost = -1;
  for (auto [d, it] : llvm::enumerate(iters))
    if (it == utils::IteratorType::reduction) {
      sizes[d] = 1;
      innermost = d;
    }
  if (!contraction && innermost >= 0)
    sizes[innermost] =
        ranges[innermost] > 256 ? divisorAtMost(ranges[innermost], 256) : 0;
  if (!contraction && op.getNumReductionLoops() == 1 &&
      ranges[innermost] > kPartialLanes)
    sizes[innermost] = divisorAtMost(ranges[innermost], kPartialLanes);
  return sizes;
}

/// A reduction with one (innermost) reduction loop longer than this many
/// elements is tiled into partial reductions of this width: each step
/// combines a chunk elementwise into a kPartialLanes-wide accumulator (four
/// AVX-512 registers, enough independent chains to hide the add latency) and
/// one horizontal reduction per row follows the loop. Reducing every chunk
/// horizontally instead costs a shuffle tree per chunk (8x slower than eager
/// for a row sum).
bool usesPartialReduction(linalg::LinalgOp op) {
  if (isContraction(op) || op.getNumReductionLoops() != 1)
    return false;
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  for (auto [d, it] : llvm::enumerate(op.getIteratorTypesArray()))
    if (it == utils::IteratorType::reduction)
      return ranges[d] > kPartialLanes &&
             divisorAtMost(ranges[d], kPartialLanes) > 1;
  return false;
}

bool anyNonZero(ArrayRef<int64_t> sizes) {
  return llvm::any_of(sizes, [](int64_t s) { return s != 0; });
}

/// Whether `iv` flows into `value` (through index arithmetic).
bool dependsOn(Value value, Value iv) {
  SmallVector<Value> work{value};
  llvm::SmallPtrSet<Operation *, 8> seen;
  while (!work.empty()) {
    Value v = work.pop_back_val();
    if (v == iv)
      return true;
    Operation *def = v.getDefiningOp();
    if (!def || !seen.insert(def).second)
      continue;
    llvm::append_range(work, def->getOperands());
  }
  return false;
}

/// Whether a loop runs more than one iteration (unknown: yes).
bool multiTrip(OpFoldResult lb, OpFoldResult ub, OpFoldResult step) {
  std::optional<int64_t> l = getConstantIntValue(lb), u = getConstantIntValue(ub),
                         s = getConstantIntValue(step);
  if (!l || !u || !s)
    return true;
  return *u - *l > *s;
}

/// Fusing the producer of `slice` computes each of its elements once: every
/// loop around the slice, up to `stop`, that runs more than once moves the
/// slice (its induction variable reaches an offset).
bool fusionIsNotRedundant(tensor::ExtractSliceOp slice, Operation *stop) {
  SmallVector<Value> offsets;
  for (OpFoldResult ofr : slice.getMixedOffsets())
    if (auto v = dyn_cast<Value>(ofr))
      offsets.push_back(v);
  auto moves = [&](Value iv) {
    return llvm::any_of(offsets, [&](Value o) { return dependsOn(o, iv); });
  };
  for (Operation *p = slice->getParentOp(); p && p != stop;
       p = p->getParentOp()) {
    if (auto loop = dyn_cast<scf::ForOp>(p)) {
      if (multiTrip(loop.getLowerBound(), loop.getUpperBound(),
                    loop.getStep()) &&
          !moves(loop.getInductionVar()))
        return false;
    } else if (auto forall = dyn_cast<scf::ForallOp>(p)) {
      for (auto [iv, lb, ub, st] :
           llvm::zip(forall.getInductionVars(), forall.getMixedLowerBound(),
                     forall.getMixedUpperBound(), forall.getMixedStep()))
        if (multiTrip(lb, ub, st) && !moves(iv))
          return false;
    }
  }
  return true;
}

/// The ops of `block` that `root` reads, directly or through other ops of
/// the block, and `root` itself.
llvm::SmallPtrSet<Operation *, 16> producerClosure(Operation *root,
                                                   Block &block) {
  llvm::SmallPtrSet<Operation *, 16> seen{root};
  SmallVector<Operation *> work{root};
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp())
        if (def->getBlock() == &block && seen.insert(def).second)
          work.push_back(def);
  }
  return seen;
}

class DenseTileAndVectorize
    : public moe::impl::DenseTileAndVectorizeBase<DenseTileAndVectorize> {
public:
  using DenseTileAndVectorizeBase::DenseTileAndVectorizeBase;

  void runOnOperation() override;

private:
  /// Loops the strategy created; ops inside other regions (the portable moe
  /// lowerings' own scf loops with tensor iter_args) are left alone.
  llvm::DenseSet<Operation *> ownLoops;
  bool isOurs(Operation *op) const {
    for (Operation *p = op->getParentOp(); p && !isa<func::FuncOp>(p);
         p = p->getParentOp())
      if (!ownLoops.contains(p))
        return false;
    return true;
  }
  bool leftForBlas(linalg::LinalgOp op) const {
    return op->hasAttr(moe::kBlasAttrName);
  }
  /// Tile-and-fuse every root of `block` (last op first) with the sizes
  /// `sizesOf` gives, fusing single-use linalg producers when that does not
  /// recompute (see fusionIsNotRedundant); `reductionLevel`: only input
  /// producers (a destination cannot be fused into a reduction loop).
  /// `blasRoots`: BLAS matmuls are roots too (thread level: each tile is one
  /// single-threaded BLAS call).
  LogicalResult tileBlock(
      Block &block,
      function_ref<SmallVector<int64_t>(linalg::LinalgOp)> sizesOf,
      scf::SCFTilingOptions::LoopType loopType, bool reductionLevel,
      bool blasRoots = false);
};

LogicalResult DenseTileAndVectorize::tileBlock(
    Block &block,
    function_ref<SmallVector<int64_t>(linalg::LinalgOp)> sizesOf,
    scf::SCFTilingOptions::LoopType loopType, bool reductionLevel,
    bool blasRoots) {
  IRRewriter rewriter(&getContext());
  llvm::SmallPtrSet<Operation *, 16> done;
  Operation *stop = block.getParentOp();
  while (true) {
    // The last untouched candidate of the block.
    linalg::LinalgOp root;
    for (Operation &op : llvm::reverse(block)) {
      auto linalgOp = dyn_cast<linalg::LinalgOp>(&op);
      if (!linalgOp || done.contains(&op) || !isStaticTensorOp(linalgOp) ||
          (!blasRoots && leftForBlas(linalgOp)))
        continue;
      root = linalgOp;
      break;
    }
    if (!root)
      return success();
    done.insert(root);
    SmallVector<int64_t> sizes = sizesOf(root);
    if (!anyNonZero(sizes))
      continue;

    scf::SCFTilingOptions tiling;
    tiling.setLoopType(loopType);
    tiling.setTileSizes(getAsIndexOpFoldResult(&getContext(), sizes));
    if (reductionLevel && usesPartialReduction(root)) {
      SmallVector<unsigned> dims;
      for (auto [d, it] : llvm::enumerate(root.getIteratorTypesArray()))
        if (it == utils::IteratorType::reduction)
          dims.push_back(d);
      tiling.setReductionTilingStrategy(
          ReductionTilingStrategy::PartialReductionOuterReduction);
      tiling.setReductionDims(dims);
    }
    scf::SCFTileAndFuseOptions options;
    options.setTilingOptions(tiling);
    // The ops this tiling replaces: the root and fused producers whose every
    // user is one of them or lives in the new loops. A producer fused as a
    // copy (see below) stays alive and is not one of them.
    llvm::SmallPtrSet<Operation *, 8> replaced{root.getOperation()};
    // Producers refused for some slice: they stay computed whole, so fusing
    // them for another slice would compute them a second time (only a fill
    // or an elementwise copy is cheap enough for that).
    llvm::SmallPtrSet<Operation *, 8> keptWhole;
    llvm::SmallPtrSet<Operation *, 16> closure = producerClosure(root, block);
    options.setFusionControlFn(
        [&](tensor::ExtractSliceOp slice, OpResult producer,
            bool isDestination)
            -> std::optional<scf::SCFTileAndFuseOptions::ControlFnResult> {
          auto producerOp = dyn_cast<linalg::LinalgOp>(producer.getOwner());
          if (!producerOp)
            return std::nullopt;
          if (leftForBlas(producerOp) || hasZeroSizedLoop(producerOp) ||
              (reductionLevel && isDestination)) {
            keptWhole.insert(producerOp);
            return std::nullopt;
          }
          // Other users keep the untiled producer alive: fusing would compute
          // it twice. A fill is cheap enough to duplicate. The users that
          // go away are the ops this tiling replaces and slices in the new
          // loops. An elementwise producer whose users all feed the root
          // (softmax's exp, used by the row sum and the division) is fused
          // into each of them as a copy: recomputing it costs less than a
          // round trip through memory. Its own producers then still have a
          // user (the original), so they are fused only on the same terms:
          // a copy of a residual add `x + matmul(...)` reads the matmul's
          // result, it does not compute the matmul again (the ACMoE stack
          // computed its first layer's experts twice that way).
          Operation *loop = block.findAncestorOpInBlock(*slice);
          bool dies = llvm::all_of(producer.getUsers(), [&](Operation *user) {
            return replaced.contains(user) ||
                   block.findAncestorOpInBlock(*user) == loop;
          });
          bool feedsRootOnly =
              linalg::isElementwise(producerOp) &&
              llvm::all_of(producer.getUsers(), [&](Operation *user) {
                Operation *top = block.findAncestorOpInBlock(*user);
                return top == loop || closure.contains(top);
              });
          bool cheapCopy = isa<linalg::FillOp>(producerOp) || feedsRootOnly;
          if ((!cheapCopy && (!dies || keptWhole.contains(producerOp))) ||
              !fusionIsNotRedundant(slice, stop)) {
            keptWhole.insert(producerOp);
            return std::nullopt;
          }
          if (dies)
            replaced.insert(producerOp);
          return scf::SCFTileAndFuseOptions::ControlFnResult{};
        });
    rewriter.setInsertionPoint(root);
    FailureOr<scf::SCFTileAndFuseResult> result =
        scf::tileConsumerAndFuseProducersUsingSCF(
            rewriter, cast<TilingInterface>(root.getOperation()), options);
    if (failed(result))
      continue; // Not tileable as asked: stays whole (vectorized or loops).
    for (OpResult res : root->getResults())
      if (Value repl = result->replacements.lookup(res))
        rewriter.replaceAllUsesWith(res, repl);
    // Remove what the fusion left dead (the root and fused producers).
    SmallVector<Operation *> dead{root};
    llvm::append_range(dead, result->fusedProducers);
    bool erased = true;
    while (erased) {
      erased = false;
      for (Operation *&op : dead)
        if (op && op->use_empty()) {
          done.erase(op);
          rewriter.eraseOp(op);
          op = nullptr;
          erased = true;
        }
    }
    // The tiled ops live in the new loops; the loops themselves are done.
    for (LoopLikeOpInterface loop : result->loops) {
      done.insert(loop);
      ownLoops.insert(loop);
    }
  }
}

void DenseTileAndVectorize::runOnOperation() {
  func::FuncOp func = getOperation();
  if (func.isExternal())
    return;
  using LoopType = scf::SCFTilingOptions::LoopType;
  int64_t threads = numThreads, m = tileM, n = tileN;
  if (m < 1 || n < 1) {
    func.emitError("moe-dense-tile-and-vectorize: tile-m and tile-n must be "
                   ">= 1");
    return signalPassFailure();
  }
  Block &body = func.getBody().front();

  // The matmuls moe-linalg-to-blas will call BLAS for, whatever the size of
  // their thread tiles.
  if (blas)
    func.walk([&](linalg::LinalgOp op) {
      if (op.hasPureTensorSemantics() &&
          moe::isBlasCandidate(op, blasMinFlops))
        op->setAttr(moe::kBlasAttrName, UnitAttr::get(&getContext()));
    });

  // 0. keepdim reductions (tensor<Tx1xf32>, `(d0, d1) -> (d0, 0)` maps)
  // become plain projected permutations that tiling and vectorization accept
  // (upstream linalg-fold-unit-extent-dims, on the function's top-level ops
  // only: inside the portable moe lowerings' loops it would break in-place
  // bufferization of their iter_args).
  {
    SmallVector<Operation *> topLevel;
    for (Operation &op : body)
      if (isa<linalg::LinalgOp, tensor::CollapseShapeOp, tensor::ExpandShapeOp,
              tensor::EmptyOp>(op))
        topLevel.push_back(&op);
    RewritePatternSet patterns(&getContext());
    linalg::ControlDropUnitDims control;
    linalg::populateFoldUnitExtentDimsPatterns(patterns, control);
    // The reshapes it puts between two folded ops cancel out (an expand_shape
    // of a result collapsed again by its consumer), and reshaped empty inits
    // become empty tensors: the ops of a chain read each other directly
    // again, which is what fusion needs (a 1x8x512x512 softmax was 10x slower
    // than eager, every op materialized).
    tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns,
                                                         &getContext());
    tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns,
                                                       &getContext());
    tensor::populateFoldTensorEmptyPatterns(patterns);
    linalg::FillOp::getCanonicalizationPatterns(patterns, &getContext());
    GreedyRewriteConfig config;
    config.setStrictness(GreedyRewriteStrictness::ExistingAndNewOps);
    (void)applyOpPatternsGreedily(topLevel, std::move(patterns), config);
  }

  // 1. Threads.
  (void)tileBlock(
      body,
      [&](linalg::LinalgOp op) { return threadTileSizes(op, threads); },
      LoopType::ForallOp, /*reductionLevel=*/false, /*blasRoots=*/true);

  // 2. Registers, inside each thread tile and for what stayed whole.
  SmallVector<Block *> blocks{&body};
  for (auto forall : func.getBody().getOps<scf::ForallOp>())
    if (ownLoops.contains(forall))
      blocks.push_back(forall.getBody());
  for (Block *block : blocks)
    (void)tileBlock(
        *block,
        [&](linalg::LinalgOp op) { return registerTileSizes(op, m, n); },
        LoopType::ForOp, /*reductionLevel=*/false);

  // 3. Reduction loops: every block that holds static linalg ops now.
  llvm::SetVector<Block *> reductionBlocks;
  func.walk([&](linalg::LinalgOp op) {
    if (isStaticTensorOp(op) && op.getNumReductionLoops() > 0 &&
        !leftForBlas(op) && isOurs(op))
      reductionBlocks.insert(op->getBlock());
  });
  for (Block *block : reductionBlocks)
    (void)tileBlock(
        *block,
        [&](linalg::LinalgOp op) {
          if (op.getNumReductionLoops() == 0)
            return SmallVector<int64_t>(op.getNumLoops(), 0);
          return reductionTileSizes(op);
        },
        LoopType::ForOp, /*reductionLevel=*/true);

  // 4. Vectorize what is now small and static; an op still above the vector
  // budget (e.g. a producer fused whole into a reduction loop) first gets the
  // register and reduction tiles of its own.
  IRRewriter rewriter(&getContext());
  SmallVector<linalg::LinalgOp> toVectorize;
  func.walk([&](linalg::LinalgOp op) {
    if (isStaticTensorOp(op) && !leftForBlas(op) && isOurs(op))
      toVectorize.push_back(op);
  });
  for (linalg::LinalgOp &op : toVectorize) {
    if (iterationCount(op) <= kMaxVectorElements)
      continue;
    SmallVector<int64_t> sizes = registerTileSizes(op, m, n);
    SmallVector<int64_t> reduction = reductionTileSizes(op);
    for (auto [s, r, it] :
         llvm::zip(sizes, reduction, op.getIteratorTypesArray()))
      if (it == utils::IteratorType::reduction)
        s = r;
    scf::SCFTilingOptions tiling;
    tiling.setTileSizes(getAsIndexOpFoldResult(&getContext(), sizes));
    rewriter.setInsertionPoint(op);
    FailureOr<scf::SCFTilingResult> tiled = scf::tileUsingSCF(
        rewriter, cast<TilingInterface>(op.getOperation()), tiling);
    if (failed(tiled))
      continue;
    rewriter.replaceOp(op, tiled->replacements);
    for (LoopLikeOpInterface loop : tiled->loops)
      ownLoops.insert(loop);
    op = cast<linalg::LinalgOp>(tiled->tiledOps.back());
  }
  llvm::erase_if(toVectorize, [](linalg::LinalgOp op) {
    return iterationCount(op) > kMaxVectorElements;
  });
  for (linalg::LinalgOp op : toVectorize) {
    rewriter.setInsertionPoint(op);
    FailureOr<linalg::VectorizationResult> result = linalg::vectorize(
        rewriter, op, /*inputVectorSizes=*/{}, /*inputScalableVecDims=*/{},
        /*vectorizeNDExtract=*/false, /*flatten1DDepthwiseConv=*/false,
        /*assumeDynamicDimsMatchVecSizes=*/false,
        /*createNamedContraction=*/isMatmulLike(op));
    if (failed(result))
      continue; // Stays a linalg op: convert-linalg-to-loops takes it.
    rewriter.replaceOp(op, result->replacements);
  }

  // 5. Clean up on tensors; keep accumulators out of the k loops.
  RewritePatternSet patterns(&getContext());
  // Generic contractions vectorize to (broadcasting) reads + mul +
  // multi_reduction: split the broadcasts out of the reads so that they fold
  // into the indexing maps of one vector.contract.
  vector::populateVectorTransferPermutationMapLoweringPatterns(patterns);
  vector::populateVectorReductionToContractPatterns(patterns);
  vector::populateSinkVectorOpsPatterns(patterns);
  vector::TransferWriteOp::getCanonicalizationPatterns(patterns,
                                                       &getContext());
  vector::TransferReadOp::getCanonicalizationPatterns(patterns, &getContext());
  tensor::populateFoldTensorSubsetIntoVectorTransferPatterns(patterns);
  scf::ForOp::getCanonicalizationPatterns(patterns, &getContext());
  tensor::ExtractSliceOp::getCanonicalizationPatterns(patterns, &getContext());
  (void)applyPatternsGreedily(func, std::move(patterns));
  func.walk([&](scf::ForOp loop) {
    if (ownLoops.contains(loop))
      (void)hoistLoopInvariantSubsets(rewriter, loop);
  });
}

/// Whether a vector.contract has an m dimension (parallel, in lhs and acc
/// only) and an n dimension (parallel, in rhs and acc only).
bool hasOuterProductForm(vector::ContractionOp op) {
  SmallVector<AffineMap> maps = op.getIndexingMapsArray();
  bool m = false, n = false;
  for (auto [d, it] : llvm::enumerate(op.getIteratorTypesArray())) {
    if (it != vector::IteratorType::parallel)
      continue;
    auto in = [&](AffineMap map) {
      return map.getResultPosition(getAffineDimExpr(d, op.getContext()))
          .has_value();
    };
    m |= in(maps[0]) && !in(maps[1]);
    n |= in(maps[1]) && !in(maps[0]);
  }
  return m && n;
}

class DenseLowerVectors
    : public moe::impl::DenseLowerVectorsBase<DenseLowerVectors> {
public:
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    linalg::hoistRedundantVectorTransfers(func);
    MLIRContext *ctx = &getContext();
    {
      // A contraction without an m or an n dimension (the gate combine
      // `te,etd->td`: t is in all three operands) has no outer-product form;
      // its k tile is 1, so it is an elementwise multiply-add.
      SmallVector<Operation *> elementwise;
      func.walk([&](vector::ContractionOp op) {
        if (!hasOuterProductForm(op))
          elementwise.push_back(op);
      });
      RewritePatternSet patterns(ctx);
      vector::populateVectorContractLoweringPatterns(
          patterns, vector::VectorContractLowering::ParallelArith);
      GreedyRewriteConfig config;
      config.setStrictness(GreedyRewriteStrictness::ExistingOps);
      (void)applyOpPatternsGreedily(elementwise, std::move(patterns), config);
    }
    {
      // Matmul tiles (tile-m x tile-n x 1 contractions) to outer products
      // while they still have their k dimension.
      RewritePatternSet patterns(ctx);
      vector::populateVectorContractLoweringPatterns(
          patterns, vector::VectorContractLowering::OuterProduct);
      (void)applyPatternsGreedily(func, std::move(patterns));
    }
    {
      // Unit dimensions (batch and reduction tiles of 1) out of the way, so
      // that transfers and elementwise ops are the forms lowered below.
      RewritePatternSet patterns(ctx);
      vector::populateCastAwayVectorLeadingOneDimPatterns(patterns);
      vector::populateVectorTransferDropUnitDimsPatterns(patterns);
      vector::populateDropUnitDimWithShapeCastPatterns(patterns);
      (void)applyPatternsGreedily(func, std::move(patterns));
    }
    {
      RewritePatternSet patterns(ctx);
      vector::populateVectorContractLoweringPatterns(
          patterns, vector::VectorContractLowering::OuterProduct);
      vector::populateVectorTransferPermutationMapLoweringPatterns(patterns);
      vector::populateVectorMultiReductionLoweringPatterns(
          patterns, vector::VectorMultiReductionLowering::InnerReduction);
      vector::populateVectorTransposeLoweringPatterns(
          patterns, vector::VectorTransposeLowering::Shuffle1D);
      vector::populateVectorBroadcastLoweringPatterns(patterns);
      vector::populateVectorShapeCastLoweringPatterns(patterns);
      (void)applyPatternsGreedily(func, std::move(patterns));
    }
    {
      RewritePatternSet patterns(ctx);
      vector::populateVectorOuterProductLoweringPatterns(patterns);
      (void)applyPatternsGreedily(func, std::move(patterns));
    }
  }
};
} // namespace
