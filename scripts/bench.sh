#!/usr/bin/env bash
# The CPU benchmark suite (bench/cpu.py): our compiled kernels vs PyTorch eager and torch.compile, same inputs,
# same thread count; writes bench/results/cpu-<date>.{json,md,png}.
#
#   ./scripts/bench.sh            # full suite (a few minutes on 2 cores; run it on a quiet machine)
#   ./scripts/bench.sh --quick    # smoke test (small sizes, no torch.compile, no memory run)
#   ./scripts/bench.sh --help     # options (--threads N, --only NAME..., --no-compile, --no-memory)
#
# Builds what it needs first (moe-opt, libMoEExecutorC, libmoe_cpu_runtime in $MOE_BUILD_DIR, default build/) and
# installs matplotlib into .venv when missing. Threads: $MOE_BENCH_THREADS or --threads, default all logical CPUs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MOE_BUILD_DIR:-$ROOT/build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
LLVM_PREFIX=/usr/lib/llvm-22
PY="${MOE_VENV:-$ROOT/.venv}/bin/python"
[ -x "$PY" ] || { echo "bench.sh: $PY is missing: run ./scripts/setup.sh first" >&2; exit 2; }

if [ ! -f "$BUILD/build.ninja" ]; then
  echo "== configuring $BUILD" >&2
  cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$LLVM_PREFIX/lib/cmake/mlir" -DLLVM_EXTERNAL_LIT="$LLVM_PREFIX/bin/lit" >&2
fi
echo "== building moe-opt MoEExecutorC moe_cpu_runtime in $BUILD" >&2
cmake --build "$BUILD" -j "${MOE_JOBS:-$(nproc)}" --target moe-opt MoEExecutorC moe_cpu_runtime >&2

"$PY" -c "import matplotlib" 2>/dev/null || "$PY" -m pip install -q matplotlib >&2

export MOE_BUILD_DIR="$BUILD"
cd "$ROOT"
exec "$PY" -m bench.cpu "$@"
