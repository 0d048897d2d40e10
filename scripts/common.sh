# Shared steps of scripts/setup.sh (build + demo) and scripts/test.sh (build + every test). Sourced, not run.
# Every step is idempotent: a second run only does what is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MOE_BUILD_DIR:-$ROOT/build}"
LLVM_PREFIX=/usr/lib/llvm-22
JOBS="${MOE_JOBS:-$(nproc)}"

SYSTEM_PACKAGES=(llvm-22-dev libmlir-22-dev mlir-22-tools clang-22 libclang-rt-22-dev liblld-22-dev libzstd-dev zlib1g-dev cmake ninja-build g++ python3 python3-venv
                 libgtest-dev time libopenblas-dev patchelf curl)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_system_packages() {
  local missing=()
  for p in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
}

VENV="${MOE_VENV:-$ROOT/.venv}"

# PyTorch into .venv (scripts/install-python.sh), then our package, editable. --no-deps: torch is already there
# (a plain install would pull gigabytes of CUDA wheels the lean torch install avoids).
install_python() {
  "$ROOT/scripts/install-python.sh"
  local where
  where=$("$VENV/bin/python" -c "import moe_mlir, os; print(os.path.dirname(moe_mlir.__file__))" 2>/dev/null || true)
  if [ "$where" != "$ROOT/python/moe_mlir" ]; then
    echo "== python: installing moe_mlir (editable) into $VENV"
    "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT/python"
  fi
}

configure_and_build() {
  # glibc 2.31 and GCC 10's libstdc++ for the wheel's libraries to link against (manylinux_2_31): the wheel then
  # installs on Ubuntu 20.04+, RHEL 9 and Amazon Linux 2023, although built on this Debian 12.
  # Without it (no download), the pieces link against this system's libraries: test_wheel.py says so.
  local sysroot
  sysroot="$("$ROOT/scripts/glibc-sysroot.sh")" || { echo "== warning: no glibc 2.31 sysroot: the wheel will need this glibc" >&2; sysroot=""; }
  if [ ! -f "$BUILD/build.ninja" ]; then
    echo "== configuring $BUILD"
    # ccache (when installed) makes rebuilds in other worktrees and clean clones nearly free.
    local launcher=()
    if command -v ccache >/dev/null 2>&1; then
      launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    cmake -G Ninja -S "$ROOT" -B "$BUILD" "${launcher[@]}" \
      -DCMAKE_BUILD_TYPE=Release \
      -DMOE_GLIBC_SYSROOT="$sysroot" \
      -DMLIR_DIR="$LLVM_PREFIX/lib/cmake/mlir" \
      -DLLVM_EXTERNAL_LIT="$LLVM_PREFIX/bin/lit"
  elif ! grep -qx "MOE_GLIBC_SYSROOT:PATH=$sysroot" "$BUILD/CMakeCache.txt"; then
    cmake -DMOE_GLIBC_SYSROOT="$sysroot" "$BUILD" > /dev/null
  fi
  echo "== building"
  cmake --build "$BUILD" -j "$JOBS"
}

# The installable wheel dist/moe_mlir-*.whl from the build (scripts/build-wheel.sh; docs/Install.md).
build_wheel() {
  "$ROOT/scripts/build-wheel.sh"
}
