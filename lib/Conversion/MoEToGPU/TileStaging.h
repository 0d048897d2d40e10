//===- TileStaging.h - Row tiles from global into shared memory -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The staging of the tensor-core kernels' column tiles (FlashMmaGrad.cpp):
// `rows` rows from row0 of a [B, N, width] operand of
// batch element bi into a workgroup tile [rows, cols + pad], columns
// [0, cols), zeros past N, past width and in rows a predicate rejects. In two
// halves, so that the next tile's loads are in flight while a kernel computes
// the current one: fetch() loads the block's 16-byte vectors into registers
// (where `aligned`: width a multiple of 8 elements and a 16-byte aligned
// base; zeros otherwise, no load), put() stores them after the barrier;
// elements() is the misaligned operand's loop, a thread an element;
// copyAsync() the aligned one's cp.async copies (no registers in flight).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_TILESTAGING_H
#define MOE_LIB_CONVERSION_MOETOGPU_TILESTAGING_H

#include "GpuKernelBuilder.h"

namespace mlir::moe::gpu_lowering {

struct TileStaging {
  GpuKernelBuilder &kb;
  ImplicitLocOpBuilder &b;
  /// The tiles' element type (the operands' too).
  Type elt;
  /// The thread, the block's threads, the batch element and the rows N of
  /// the operands.
  Value tid;
  int64_t threads;
  Value bi, N;

  /// Where a thread's vector of 8 elements goes: its tile row and column,
  /// and whether it has one (null: every thread of the block has it).
  struct Place {
    Value r, col, inTile;
  };
  /// The block's vectors of a [rows x cols] tile, the thread's first.
  SmallVector<Place> places(int64_t rows, int64_t cols);
  /// Whether `src` [B, N, width] can be staged 16 bytes at a time: a width a
  /// multiple of 8 and a 16-byte aligned base (false where `depth`, the
  /// tile's static width, is not a multiple of 8).
  Value aligned(Value src, Value width, int64_t depth);
  /// The thread's vectors of rows [row0, row0 + rows) (zeros past N and
  /// width, and where `rowKept(row)` is false; no load unless `aligned`).
  SmallVector<Value> fetch(Value src, ArrayRef<Place> at, Value width,
                           Value row0, Value aligned,
                           function_ref<Value(Value row)> rowKept = nullptr);
  /// Stores fetch()'s vectors into `dst`.
  void put(ValueRange xs, ArrayRef<Place> at, Value dst);
  /// fetch() and put() as cp.async copies of 16 bytes (zeros where fetch()
  /// gives them: src-size 0), straight into `dst`, which the caller commits
  /// and waits for; for an aligned `src` only.
  void copyAsync(Value src, ArrayRef<Place> at, Value width, Value row0,
                 Value dst, function_ref<Value(Value row)> rowKept = nullptr);
  /// The same tile a thread an element (any alignment).
  void elements(Value src, Value dst, int64_t rows, int64_t cols, Value width,
                Value row0, function_ref<Value(Value row)> rowKept = nullptr);
};

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_TILESTAGING_H
