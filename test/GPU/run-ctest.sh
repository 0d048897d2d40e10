#!/usr/bin/env bash
# ctest `gpu.ops` (label gpu): compiles test/GPU/Inputs/gpu-cases.mlir ahead of time and compares every op with
# PyTorch CUDA through run_gpu_tests.py. Exit code 77 (ctest SKIP_RETURN_CODE) when there is no GPU or no torch:
# reported as skipped, never as passed.
#   run-ctest.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src="$1"; build="$2"
python="$src/.venv/bin/python"; [ -x "$python" ] || python=python3
out="$build/gpu-artifacts"
# No device: skip before the AOT compile (about a minute of CPU on two cores, for nothing: lit's ptxas-sweep.mlir
# lowers and assembles the same cases without a GPU). run_gpu_tests.py makes the same check after the compile.
"$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 77)" 2>/dev/null || {
  echo "gpu.ops: skipped (no CUDA device visible to PyTorch, or no torch)"; exit 77; }
rm -rf "$out" && mkdir -p "$out"
python3 "$src/tools/moe-aot/moe-aot.py" "$src/test/GPU/Inputs/gpu-cases.mlir" -o "$out" \
  --moe-opt "$build/bin/moe-opt" --toolkit "${MOE_CUDA_TOOLKIT:-/usr/local/cuda}" --link --runtime-dir "$build/lib" \
  --ptx-fallback
MOE_CUDA_PTX_DIR="$out/gpu-cases-ptx" exec "$python" "$src/test/GPU/run_gpu_tests.py" \
  --lib "$out/libgpu-cases.so" --runtime-dir "$build/lib"
