#!/usr/bin/env bash
# On the GPU machine (H100/H200; cmake, a C++ compiler, the CUDA toolkit, python3 with torch; no LLVM, no network):
# builds the host runtime + libbench-cases.so from the carried artifacts (bench/gpu/build_artifacts.sh), runs
# bench/gpu/bench_gpu.py and writes bench/results/gpu-<date>-<gpu>.json (also copied to $OUT when set).
#
#   bench/gpu/run_on_device.sh [ART] [bench_gpu.py options, e.g. --only topk --no-compile]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# ART is optional: a first argument that is an option (--only ...) belongs to bench_gpu.py.
ART="$ROOT/bench/gpu/artifacts"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then ART="$1"; shift; fi
case "$ART" in /*) ;; *) ART="$ROOT/$ART" ;; esac
BUILD="${MOE_GPU_BENCH_BUILD:-/tmp/moe-bench-gpu}"
PY="${MOE_PYTHON:-python3}"
[ -f "$ART/bench-cases.o" ] || { echo "run_on_device.sh: $ART/bench-cases.o missing (bench/gpu/build_artifacts.sh)" >&2; exit 2; }

cmake -S "$ROOT/bench/gpu/device" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMOE_GPU_ARTIFACTS="$ART" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv || true

cd "$ROOT"
export PYTHONUNBUFFERED=1
MOE_CUDA_PTX_DIR="$ART/bench-cases-ptx" "$PY" -m bench.gpu.bench_gpu --lib "$BUILD/libbench-cases.so" --runtime-dir "$BUILD" \
  --manifest "$ART/cases.json" --out "$ROOT/bench/results" "$@"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$ROOT"/bench/results/gpu-*.json "$ROOT"/bench/results/gpu-*.md "$OUT"/ 2>/dev/null || true; fi
