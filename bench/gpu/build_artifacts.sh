#!/usr/bin/env bash
# Here (a machine with LLVM/MLIR and the CUDA toolkit's ptxas, no GPU needed): compiles the GPU benchmark cases
# (bench/cases.py:gpu_cases) ahead of time for sm_90 with tools/moe-aot/moe-aot.py into ART (default
# bench/gpu/artifacts, git-ignored): bench-cases.mlir, cases.json, bench-cases.o (host code + embedded fatbin),
# bench-cases-ptx/ (its PTX fallback) and bench-cases.manifest.json (toolkit, chip, PTX ISA, sha256s).
# The device machine then needs only cmake, a C++ compiler, the CUDA driver and torch: bench/gpu/run_on_device.sh.
#
#   bench/gpu/build_artifacts.sh [ART]      (MOE_BUILD_DIR: the build holding bin/moe-opt, default build/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ART="${1:-$ROOT/bench/gpu/artifacts}"
BUILD="${MOE_BUILD_DIR:-$ROOT/build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
PY="${MOE_VENV:-$ROOT/.venv}/bin/python"
CHIP="${MOE_GPU_CHIP:-sm_90}"
TOOLKIT="${MOE_CUDA_TOOLKIT:-/usr/local/cuda}"

[ -x "$BUILD/bin/moe-opt" ] || cmake --build "$BUILD" --target moe-opt
rm -rf "$ART" && mkdir -p "$ART"
(cd "$ROOT" && "$PY" -m bench.gpu.gen_cases "$ART")
python3 "$ROOT/tools/moe-aot/moe-aot.py" "$ART/bench-cases.mlir" -o "$ART" --name bench-cases \
  --moe-opt "$BUILD/bin/moe-opt" --chip "$CHIP" --format fatbin --toolkit "$TOOLKIT" --ptx-fallback \
  --drop-intermediates   # keep the carried folder small
{ echo "chip=$CHIP"; echo "commit=$(cat "$BUILD/MOE_SOURCE_COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD)"; echo "built=$(date -Iseconds)"
  echo "toolkit=$("$TOOLKIT/bin/ptxas" --version | tail -1)"; } > "$ART/BUILD_INFO"
ls -la "$ART"
