//===- DispatchPlan.cpp - moe.dispatch_plan on the GPU --------------------===//
//
// Part of the MoE-MLIR project.
//
// A stable counting sort of the N = T·k assignments by expert, without
// atomics, so that the plan is the same on every run (vLLM's
// moe_align_block_size counts with atomics and orders within an expert by
// arrival; the dialect's plan is the stable order). Three kernels on the
// stream, one scratch allocation, no memsets:
//
//  1. dispatch_counts: one warp per chunk of 1024 assignments, 32 at a time in
//     assignment order. Lanes holding the same expert find each other with
//     match.any.sync; the lowest of them adds their number to the chunk's
//     count of that expert in workgroup memory. Writes counts[chunk][e];
//     records an index outside [0, E) in the error word.
//  2. dispatch_scan: one block: per expert the total over the chunks (the
//     `counts` result), the exclusive scans (`offsets`, the block-padded
//     offsets, `num_padded`: runs of E/32 experts a lane of the first warp,
//     a butterfly across the runs), each chunk's first position per expert (in
//     place of its count) and the expert of every padded block; it also
//     writes every entry that no assignment will take: `padded_order`'s
//     padding (N) and `order`'s tail past offsets[E] (-1, only where an index
//     was out of range).
//  3. dispatch_scatter: the warps of kernel 1 again; an assignment's position
//     is its chunk's base for its expert plus the number of lower lanes of
//     the same step holding that expert (a popcount of the match mask), plus
//     the earlier steps' (the running base in workgroup memory). Writes
//     `order`, `inverse` (-1 for an out-of-range index) and `padded_order`.
//
// The scratch buffer holds the chunks' counts (chunks x E) and then the E + 1
// block-padded offsets: one stream-ordered allocation a call. The three
// launches follow each other with no host work between; a moe.route whose
// indices a dispatch plan reads launches its kernel just before them, in the
// same host code (Route.cpp), so route + plan is one chain of four kernels.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Lowerings.h"

#include "MoE/Kernels/IndexErrors.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

namespace {
/// Steps of 32 assignments a warp takes per chunk.
constexpr int64_t kChunkSteps = 32;
constexpr int64_t kChunk = kWarp * kChunkSteps;
/// Threads of the scan kernel.
constexpr int64_t kScanThreads = 256;
/// Chunks whose counts the scan kernel loads together.
constexpr int64_t kScanBatch = 8;

/// One step of a chunk warp: this lane's assignment, its raw index (i64, for
/// error reports), whether it is valid (in [0, N) and its expert in [0, E))
/// and the lanes holding the same expert.
struct Step {
  Value n, raw, inBounds, inRange, expertI32, peers;
};

class ChunkWarp {
public:
  ChunkWarp(GpuKernelBuilder &kb, Value indices, int64_t numExperts)
      : kb(kb), indices(indices), numExperts(numExperts) {
    lane = kb.threadId();
    chunk = kb.blockId();
    kSel = kb.dim(indices, 1);
    total = kb.mul(kb.dim(indices, 0), kSel);
  }

  GpuKernelBuilder &kb;
  Value indices, lane, chunk, kSel, total;
  int64_t numExperts;

  /// For every expert e this lane owns (e = lane, lane + 32, ...).
  void eachExpert(function_ref<void(Value e)> body) {
    kb.forLoop(lane, kb.idx(numExperts), kb.idx(kWarp), body);
  }

  /// The chunk's steps in order, a barrier after each. Every step's index is
  /// loaded first, 32 independent loads a lane in flight at once: loaded in
  /// its step, each load stood between two barriers on the warp's only chain,
  /// one device-memory latency a step (about 16 us a kernel at 65536
  /// assignments on an H200, 2026-11-26).
  void eachStep(function_ref<void(const Step &)> body) {
    Value chunkBase = kb.mul(chunk, kb.idx(kChunk));
    SmallVector<Value> ns, inBounds, loaded;
    for (int64_t s = 0; s < kChunkSteps; ++s) {
      Value n = kb.add(kb.add(chunkBase, kb.idx(s * kWarp)), lane);
      Value in = kb.lt(n, total);
      Value safe = kb.select(in, n, kb.idx(0));
      ns.push_back(n);
      inBounds.push_back(in);
      loaded.push_back(
          kb.load(indices, {kb.divu(safe, kSel), kb.remu(safe, kSel)}));
    }
    for (int64_t s = 0; s < kChunkSteps; ++s) {
      Step st;
      st.n = ns[s];
      st.inBounds = inBounds[s];
      Value v = kb.castInt(loaded[s], kb.i64());
      st.raw = v;
      st.inRange =
          kb.andI(st.inBounds,
                  kb.andI(kb.cmpi(arith::CmpIPredicate::sge, v, kb.cI64(0)),
                          kb.lt(v, kb.cI64(numExperts))));
      st.expertI32 = kb.select(st.inRange, kb.trunc(v, kb.i32()), kb.cI32(-1));
      // Every lane takes part (the block is one warp): out-of-range and
      // past-the-end lanes match each other on -1 and are never used.
      st.peers = NVVM::MatchSyncOp::create(
          kb.b, kb.i32(), kb.cI32(-1), st.expertI32, NVVM::MatchSyncKind::any);
      body(st);
      kb.barrier();
    }
  }

  /// True on the lowest lane of `peers`.
  Value isLeader(const Step &st) {
    Value first = math::CountTrailingZerosOp::create(kb.b, st.peers);
    return kb.eq(first, kb.castInt(lane, kb.i32()));
  }
  Value popcount(Value mask) { return math::CtPopOp::create(kb.b, mask); }
};

Value asIndex(GpuKernelBuilder &kb, Value v) {
  return kb.castInt(v, kb.index());
}
} // namespace

LogicalResult
mlir::moe::gpu_lowering::checkDispatchPlanOnGPU(DispatchPlanOp op) {
  // Capacity needs a priority pass before the sort; only the CPU lowerings
  // have it so far.
  if (op.getCapacity())
    return op.emitOpError(
        "GPU lowering does not support 'capacity' yet (the CPU lowerings do)");
  return success();
}

DispatchPlanKernels::DispatchPlanKernels(HostCode &h, DispatchPlanOp op,
                                         Value indices)
    : h(h), indices(indices), numExperts(op.getNumExperts()),
      blockSize(op.getBlockSize()), loc(op.getLoc()) {
  GpuKernelBuilder &kb = h.kb;
  const int64_t E = numExperts, B = blockSize;
  Value n = kb.mul(kb.dim(indices, 0), kb.dim(indices, 1));
  Value padded = kb.add(n, kb.idx(E * (B - 1)));
  Value numBlocks = kb.ceilDiv(padded, kb.idx(B));
  // Results in the op's order, with the sizes of their dynamic dim.
  SmallVector<Value> sizes = {kb.idx(E), kb.idx(E + 1), n,        n,
                              padded,    numBlocks,     kb.idx(1)};
  for (auto [result, size] : llvm::zip(op->getResults(), sizes)) {
    auto type = cast<RankedTensorType>(result.getType());
    results.push_back(h.allocLike(type, type.isDynamicDim(0) ? ValueRange{size}
                                                             : ValueRange{}));
  }
  // One scratch buffer: each chunk's count (then first position) per expert,
  // then the E + 1 block-padded offsets.
  chunks = kb.ceilDiv(n, kb.idx(kChunk));
  scratch = h.alloc(MemRefType::get({ShapedType::kDynamic}, kb.i32()),
                    {kb.add(kb.mul(chunks, kb.idx(E)), kb.idx(E + 1))});
  word = h.errorWord();
}

namespace {
/// The three kernels of DispatchPlanKernels::launch over its buffers: the
/// counts per chunk, the scans, the positions.
struct DispatchPlanSteps {
  HostCode &h;
  Value indices, scratch, word, chunks;
  int64_t numExperts, blockSize;
  Location loc;
  ArrayRef<Value> results;

  void launchCounts();
  void launchScan();
  void launchScatter();
};
} // namespace

/// Where the padded offset of expert `e` sits in the scratch buffer of
/// `numChunks` chunks of E experts.
static Value paddedOffsetAt(GpuKernelBuilder &kk, int64_t E, Value numChunks,
                            Value e) {
  return kk.add(kk.mul(numChunks, kk.idx(E)), e);
}

// 1. Counts per chunk.
void DispatchPlanSteps::launchCounts() {
  GpuKernelBuilder &kb = h.kb;
  const int64_t E = numExperts;
  MemRefType perExpert = workgroupMemRef({E}, kb.i32());
  GPUKernel kernel(h, "dispatch_counts", {indices, scratch, word}, {perExpert},
                   {kWarp, 1, 1}, loc);
  GpuKernelBuilder &kk = kernel.kb;
  Value base = kernel.arg(1), w = kernel.arg(2);
  Value local = kernel.workgroup(0);
  ChunkWarp cw(kk, kernel.arg(0), E);
  cw.eachExpert([&](Value e) { kk.store(kk.cI32(0), local, {e}); });
  kk.barrier();
  cw.eachStep([&](const Step &st) {
    kk.ifThen(kk.andI(st.inBounds, kk.notI1(st.inRange)), [&] {
      emitRecordIndexError(kk, w, kMoEErrorDispatchPlanIndices,
                           kk.castInt(st.n, kk.i64()), st.raw, kk.cI64(E));
    });
    kk.ifThen(kk.andI(st.inRange, cw.isLeader(st)), [&] {
      Value e = asIndex(kk, st.expertI32);
      kk.store(kk.add(kk.load(local, {e}), cw.popcount(st.peers)), local, {e});
    });
  });
  cw.eachExpert([&](Value e) {
    kk.store(kk.load(local, {e}), base,
             {kk.add(kk.mul(cw.chunk, kk.idx(E)), e)});
  });
  kernel.launch({chunks, kb.idx(1), kb.idx(1)});
}

// 2. Totals, scans, chunk bases, block experts, and every entry of `order`
// and `padded_order` that no assignment takes (no memsets on the host).
void DispatchPlanSteps::launchScan() {
  GpuKernelBuilder &kb = h.kb;
  const int64_t E = numExperts, B = blockSize;
  Type i32 = kb.i32();
  Value counts = results[0], offsets = results[1], order = results[2],
        paddedOrder = results[4], blockExperts = results[5],
        numPadded = results[6];
  MemRefType perExpert = workgroupMemRef({E}, i32);
  GPUKernel kernel(h, "dispatch_scan",
                   {indices, scratch, counts, offsets, blockExperts, numPadded,
                    order, paddedOrder},
                   {perExpert}, {kScanThreads, 1, 1}, loc);
  GpuKernelBuilder &kk = kernel.kb;
  Value ix = kernel.arg(0), base = kernel.arg(1), cnt = kernel.arg(2),
        off = kernel.arg(3), blocks = kernel.arg(4), num = kernel.arg(5),
        ord = kernel.arg(6), pord = kernel.arg(7);
  Value totals = kernel.workgroup(0);
  Value tid = kk.threadId();
  Value nk = kk.mul(kk.dim(ix, 0), kk.dim(ix, 1));
  Value numChunks = kk.ceilDiv(nk, kk.idx(kChunk));
  auto poffAt = [&](Value e) { return paddedOffsetAt(kk, E, numChunks, e); };
  auto eachExpert = [&](function_ref<void(Value)> body) {
    kk.forLoop(tid, kk.idx(E), kk.idx(kScanThreads), body);
  };
  auto at = [&](Value c, Value e) { return kk.add(kk.mul(c, kk.idx(E)), e); };
  eachExpert([&](Value e) {
    Value sum =
        kk.forLoop(kk.idx(0), numChunks, kk.idx(1), ValueRange{kk.cI32(0)},
                   [&](Value c, ValueRange acc) -> SmallVector<Value> {
                     return {kk.add(acc[0], kk.load(base, {at(c, e)}))};
                   })[0];
    kk.store(sum, totals, {e});
    kk.store(sum, cnt, {e});
  });
  kk.barrier();
  // The exclusive scans by the first warp: lane l takes the run of C
  // experts [l*C, l*C + C), sums its counts (and block-rounded counts), a
  // butterfly gives every lane the sum of the lanes below it and the
  // total, then each lane writes its run's offsets. (One thread's E steps,
  // each a shared-memory load on the chain, were ~4 us at E = 256.)
  const int64_t C = llvm::divideCeil(E, kWarp);
  kk.ifThen(kk.lt(tid, kk.idx(kWarp)), [&] {
    Value first = kk.mul(tid, kk.idx(C));
    // The run's m-th count and its rounded form (0 past the last expert).
    auto countAt = [&](Value m) -> std::pair<Value, Value> {
      Value e = kk.add(first, m);
      Value in = kk.lt(e, kk.idx(E));
      Value c = kk.select(in, kk.load(totals, {kk.select(in, e, kk.idx(0))}),
                          kk.cI32(0));
      return {c, kk.mul(kk.ceilDiv(c, kk.cI32(B)), kk.cI32(B))};
    };
    SmallVector<Value> run =
        kk.forLoop(kk.idx(0), kk.idx(C), kk.idx(1), {kk.cI32(0), kk.cI32(0)},
                   [&](Value m, ValueRange acc) -> SmallVector<Value> {
                     auto [c, rounded] = countAt(m);
                     return {kk.add(acc[0], c), kk.add(acc[1], rounded)};
                   });
    Value laneI32 = kk.castInt(tid, i32);
    Value sum = run[0], padded = run[1];
    Value below = kk.cI32(0), paddedBelow = kk.cI32(0);
    for (int64_t bit = 1; bit < kWarp; bit *= 2) {
      Value other = kk.shuffleXor(sum, bit);
      Value otherPadded = kk.shuffleXor(padded, bit);
      Value fromBelow = kk.cmpi(arith::CmpIPredicate::ne,
                                kk.andI(laneI32, kk.cI32(bit)), kk.cI32(0));
      below = kk.add(below, kk.select(fromBelow, other, kk.cI32(0)));
      paddedBelow =
          kk.add(paddedBelow, kk.select(fromBelow, otherPadded, kk.cI32(0)));
      sum = kk.add(sum, other);
      padded = kk.add(padded, otherPadded);
    }
    kk.forLoop(kk.idx(0), kk.idx(C), kk.idx(1), {below, paddedBelow},
               [&](Value m, ValueRange acc) -> SmallVector<Value> {
                 Value e = kk.add(first, m);
                 kk.ifThen(kk.lt(e, kk.idx(E)), [&] {
                   kk.store(acc[0], off, {e});
                   kk.store(acc[1], base, {poffAt(e)});
                 });
                 auto [c, rounded] = countAt(m);
                 return {kk.add(acc[0], c), kk.add(acc[1], rounded)};
               });
    kk.ifThen(kk.eq(tid, kk.idx(0)), [&] {
      kk.store(sum, off, {kk.idx(E)});
      kk.store(padded, base, {poffAt(kk.idx(E))});
      kk.store(padded, num, {kk.idx(0)});
    });
  });
  kk.barrier();
  Value nI32 = kk.trunc(kk.castInt(nk, kk.i64()), i32);
  eachExpert([&](Value e) {
    // Each chunk's count replaced by its first position, kScanBatch chunks
    // a step: their counts loaded before any store, so that the loads are
    // in flight together (a load after each store waited for the one
    // before it: one latency a chunk).
    kk.forLoop(kk.idx(0), numChunks, kk.idx(kScanBatch),
               ValueRange{kk.load(off, {e})},
               [&](Value c0, ValueRange run) -> SmallVector<Value> {
                 SmallVector<Value> in, pos, count;
                 for (int64_t j = 0; j < kScanBatch; ++j) {
                   Value c = kk.add(c0, kk.idx(j));
                   in.push_back(kk.lt(c, numChunks));
                   pos.push_back(at(kk.select(in.back(), c, kk.idx(0)), e));
                   count.push_back(kk.select(
                       in.back(), kk.load(base, {pos.back()}), kk.cI32(0)));
                 }
                 Value r = run[0];
                 for (int64_t j = 0; j < kScanBatch; ++j) {
                   Value first = r;
                   kk.ifThen(in[j], [&] { kk.store(first, base, {pos[j]}); });
                   r = kk.add(r, count[j]);
                 }
                 return {r};
               });
    // Expert e's padded blocks, and the padding after its assignments.
    Value firstPos = asIndex(kk, kk.load(base, {poffAt(e)}));
    Value endPos = asIndex(kk, kk.load(base, {poffAt(kk.add(e, kk.idx(1)))}));
    Value first = kk.divu(firstPos, kk.idx(B));
    Value last = kk.divu(endPos, kk.idx(B));
    Value eI32 = kk.castInt(e, kk.i32());
    kk.forLoop(first, last, kk.idx(1),
               [&](Value blk) { kk.store(eI32, blocks, {blk}); });
    kk.forLoop(kk.add(firstPos, asIndex(kk, kk.load(totals, {e}))), endPos,
               kk.idx(1), [&](Value p) { kk.store(nI32, pord, {p}); });
  });
  // The blocks past the last used one, the entries of `padded_order` past
  // the last block, and those of `order` past the last valid assignment
  // (there are some only where an index was out of range).
  Value usedPos = asIndex(kk, kk.load(base, {poffAt(kk.idx(E))}));
  Value used = kk.divu(usedPos, kk.idx(B));
  kk.forLoop(kk.add(used, tid), kk.dim(blocks, 0), kk.idx(kScanThreads),
             [&](Value blk) { kk.store(kk.cI32(-1), blocks, {blk}); });
  kk.forLoop(kk.add(usedPos, tid), kk.dim(pord, 0), kk.idx(kScanThreads),
             [&](Value p) { kk.store(nI32, pord, {p}); });
  kk.forLoop(kk.add(asIndex(kk, kk.load(off, {kk.idx(E)})), tid), nk,
             kk.idx(kScanThreads),
             [&](Value p) { kk.store(kk.cI32(-1), ord, {p}); });
  kernel.launch({kb.idx(1), kb.idx(1), kb.idx(1)});
}

// 3. Positions.
void DispatchPlanSteps::launchScatter() {
  GpuKernelBuilder &kb = h.kb;
  const int64_t E = numExperts;
  Value offsets = results[1], order = results[2], inverse = results[3],
        paddedOrder = results[4];
  MemRefType perExpert = workgroupMemRef({E}, kb.i32());
  GPUKernel kernel(h, "dispatch_scatter",
                   {indices, scratch, offsets, order, inverse, paddedOrder},
                   {perExpert}, {kWarp, 1, 1}, loc);
  GpuKernelBuilder &kk = kernel.kb;
  Value base = kernel.arg(1), off = kernel.arg(2), ord = kernel.arg(3),
        inv = kernel.arg(4), pord = kernel.arg(5);
  Value running = kernel.workgroup(0);
  ChunkWarp cw(kk, kernel.arg(0), E);
  Value numChunks = kk.ceilDiv(cw.total, kk.idx(kChunk));
  cw.eachExpert([&](Value e) {
    kk.store(kk.load(base, {kk.add(kk.mul(cw.chunk, kk.idx(E)), e)}), running,
             {e});
  });
  kk.barrier();
  Value laneI32 = kk.castInt(cw.lane, kk.i32());
  Value lower = kk.sub(kk.shl(kk.cI32(1), laneI32), kk.cI32(1));
  cw.eachStep([&](const Step &st) {
    Value e = asIndex(kk, kk.select(st.inRange, st.expertI32, kk.cI32(0)));
    kk.ifThen(st.inRange, [&] {
      Value rank = cw.popcount(kk.andI(st.peers, lower));
      Value pos = kk.add(kk.load(running, {e}), rank);
      Value nI32 = kk.castInt(st.n, kk.i32());
      kk.store(nI32, ord, {asIndex(kk, pos)});
      kk.store(pos, inv, {st.n});
      Value within = kk.sub(pos, kk.load(off, {e}));
      Value poff = kk.load(base, {paddedOffsetAt(kk, E, numChunks, e)});
      kk.store(nI32, pord, {asIndex(kk, kk.add(poff, within))});
    });
    // An out-of-range assignment is in no expert's list.
    kk.ifThen(kk.andI(st.inBounds, kk.notI1(st.inRange)),
              [&] { kk.store(kk.cI32(-1), inv, {st.n}); });
    // Everybody has read the base before the leader moves it on.
    kk.barrier();
    kk.ifThen(kk.andI(st.inRange, cw.isLeader(st)), [&] {
      kk.store(kk.add(kk.load(running, {e}), cw.popcount(st.peers)), running,
               {e});
    });
  });
  kernel.launch({chunks, kb.idx(1), kb.idx(1)});
}

void DispatchPlanKernels::launch() {
  DispatchPlanSteps steps{h,          indices,   scratch, word,   chunks,
                          numExperts, blockSize, loc,     results};
  steps.launchCounts();
  steps.launchScan();
  steps.launchScatter();
  h.release(scratch);
}

template <>
LogicalResult
GPULowering<DispatchPlanOp>::lower(DispatchPlanOp op, OpAdaptor adaptor,
                                   ConversionPatternRewriter &rewriter) const {
  if (failed(checkDispatchPlanOnGPU(op)))
    return failure();
  HostCode h(rewriter, op);
  DispatchPlanKernels plan(h, op, h.buffer(adaptor.getIndices()));
  plan.launch();
  h.finish(/*checkErrors=*/true);
  h.replace(op, plan.results);
  return success();
}
