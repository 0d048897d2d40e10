#!/usr/bin/env bash
# Builds the benchmark's targets from a committed snapshot (default HEAD) instead of the working tree, so that a
# benchmark run measures one commit even while the shared checkout holds someone's half-finished edits.
#
#   bench/build_snapshot.sh [REV] [BUILD_DIR]    -> prints BUILD_DIR; then MOE_BUILD_DIR=BUILD_DIR ./scripts/bench.sh
#
# The sources go to $MOE_SNAPSHOT_SRC (default /tmp/moe-bench-src); only files whose content changed are copied
# (with a fresh timestamp), so ninja rebuilds only what changed between two snapshots. BUILD_DIR/
# MOE_SOURCE_COMMIT records the commit (bench/cpu.py reports it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV="${1:-HEAD}"
BUILD="${2:-$ROOT/build-bench}"
SRC="${MOE_SNAPSHOT_SRC:-/tmp/moe-bench-src}"
LLVM_PREFIX=/usr/lib/llvm-22
SHA="$(git -C "$ROOT" rev-parse "$REV")"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
git -C "$ROOT" archive "$SHA" | tar -x -C "$TMP"
mkdir -p "$SRC"
(cd "$TMP" && find . -type f) | while IFS= read -r f; do
  if ! cmp -s "$TMP/$f" "$SRC/$f"; then mkdir -p "$(dirname "$SRC/$f")"; cp "$TMP/$f" "$SRC/$f"; fi
done
(cd "$SRC" && find . -type f) | while IFS= read -r f; do [ -e "$TMP/$f" ] || rm -f "$SRC/$f"; done
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$SRC\$" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD"    # configured for another source tree
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -G Ninja -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMLIR_DIR="$LLVM_PREFIX/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$LLVM_PREFIX/bin/lit" -DMOE_ENABLE_TORCH_TESTS=OFF >&2
fi
cmake --build "$BUILD" -j "${MOE_JOBS:-$(nproc)}" --target moe-opt MoEExecutorC moe_cpu_runtime >&2
echo "$SHA" > "$BUILD/MOE_SOURCE_COMMIT"
echo "$BUILD"
