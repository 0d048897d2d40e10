//===- F32Staging.h - f32 row tiles into shared memory ---------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The staging of the 3xTF32 flash kernel's tiles (FlashTf32.cpp): rows of a [B, N, width] operand of any float type, a
// column window of them, into an f32 workgroup tile, 16 bytes a thread and
// load where the operand is f32 and aligned (f32StagedAligned), else an
// element a thread; zeros past the rows and columns, and in the rows a
// predicate rejects. (TileStaging.h stages the tensor-core kernels' f16/bf16
// tiles, 8 elements a vector, from column 0.)
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_F32STAGING_H
#define MOE_LIB_CONVERSION_MOETOGPU_F32STAGING_H

#include "GpuKernelBuilder.h"

namespace mlir::moe::gpu_lowering {

/// Floats a staged vector (16 bytes).
constexpr int64_t kF32Vec = 4;

/// Whether the f32 operand `src` [B, rows, width] can be staged kF32Vec
/// floats at a time: a 16-byte aligned base and a width a multiple of kF32Vec.
Value f32StagedAligned(GpuKernelBuilder &kb, ImplicitLocOpBuilder &b, Value src,
                       Value width);

/// Rows [row0, row0 + rows) of src[bi] (any float type), columns [col0,
/// col0 + cols), into the f32 workgroup tile dst [rows x cols + pad]: zeros
/// past `limit` rows and `width` columns, and in the rows where rowKept(row)
/// is false. With `vectors` (an f32 operand, f32StagedAligned) 16 bytes a
/// thread and load, else an element; `threads` threads of the block (tid)
/// share the tile. `put` (default: the store into dst) stores each value: a
/// vector<4xf32> at (r, c) with `vectors`, else an f32.
struct F32Stage {
  GpuKernelBuilder &kb;
  ImplicitLocOpBuilder &b;
  Value tid;
  int64_t threads;
  Value bi;

  void operator()(Value src, Value dst, int64_t rows, int64_t cols, Value row0,
                  Value limit, Value col0, Value width, bool vectors,
                  function_ref<Value(Value row)> rowKept = nullptr,
                  function_ref<void(Value x, Value r, Value c)> put = nullptr);
};

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_F32STAGING_H
