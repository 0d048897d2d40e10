#!/usr/bin/env bash
# Builds the installable wheel dist/moe_mlir-<version>-cp3XX-cp3XX-linux_x86_64.whl from the build tree (run by
# scripts/setup.sh after the build; python/tests/test_wheel.py runs it when dist/ has no current wheel). See
# docs/Install.md.
#
# The wheel is the python package plus its compiled pieces in moe_mlir/_bundle: bin/moe-opt (moe-opt-static, a
# launcher of the compiler library) and bin/moe-aot.py (the ahead-of-time GPU object tool, stdlib-only Python), lib/ (the
# compiler libmoe_compiler.so, which links LLVM and MLIR statically: the torch ops' kernel compiler and JIT, the
# execution API, moe-opt's driver; compiler-rt's builtins archive the JIT links kernels against; the torch extension
# libmoe_torch.so, the kernel runtime libmoe_kernel_runtime.so, libmoe_cpu_runtime.so, libmoe_cuda_runtime.so when
# built), their run paths set to $ORIGIN (patchelf) so that they load each other from the package, never from the
# build tree; system.json (what they need from the system beyond the C and C++ libraries, checked at import:
# scripts/wheel_system_deps.py) and build.json (the torch it was built against, which the wheel requires, and the
# manylinux tag of the C library the pieces link against).
# The package is staged in $BUILD/wheel-stage.XXXXXX: the source tree is left as it is (the editable install uses it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MOE_BUILD_DIR:-$ROOT/build}"
VENV="${MOE_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
DIST="${MOE_DIST_DIR:-$ROOT/dist}"

for f in bin/moe-opt-static lib/libmoe_compiler.so lib/libmoe_keys.so lib/libmoe_torch.so lib/libmoe_kernel_runtime.so lib/libmoe_cpu_runtime.so; do
  [ -f "$BUILD/$f" ] || { echo "build-wheel: $BUILD/$f is missing: build the project first (scripts/setup.sh)" >&2; exit 1; }
done
command -v patchelf >/dev/null || { echo "build-wheel: needs patchelf (apt install patchelf)" >&2; exit 1; }
start=$(date +%s)
# dist/ is shared by every build tree and by python/tests/test_wheel.py, which copies the wheel under the same lock:
# nobody reads a wheel that is being replaced. The stage is this run's own.
mkdir -p "$DIST"
exec 9>"$DIST/.build.lock"
flock 9
mkdir -p "$BUILD"
STAGE="$(mktemp -d "$BUILD/wheel-stage.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
tar -C "$ROOT/python" --exclude=__pycache__ --exclude='*.pyc' --exclude=_bundle \
  -cf - pyproject.toml setup.py _moe_mlir_cli.py moe_mlir | tar -C "$STAGE" -xf -
B="$STAGE/moe_mlir/_bundle"
mkdir -p "$B/bin" "$B/lib"
cp "$BUILD/bin/moe-opt-static" "$B/bin/moe-opt"
cp "$ROOT/tools/moe-aot/moe-aot.py" "$B/bin/"
for lib in libmoe_compiler.so libmoe_keys.so libmoe_torch.so libmoe_kernel_runtime.so libmoe_cpu_runtime.so libmoe_cuda_runtime.so \
           libclang_rt.builtins-x86_64.a; do
  [ ! -f "$BUILD/lib/$lib" ] || cp "$BUILD/lib/$lib" "$B/lib/"
done
# The compiler library must carry its LLVM: a build with -DMOE_COMPILER_STATIC=OFF cannot make this wheel.
if readelf -d "$B/lib/libmoe_compiler.so" | grep -qE 'NEEDED.*lib(LLVM|MLIR|clang)'; then
  echo "build-wheel: $BUILD/lib/libmoe_compiler.so links a shared LLVM/MLIR: configure with -DMOE_COMPILER_STATIC=ON" >&2
  exit 1
fi

# Run paths: the bundle's own libraries next to each other ($ORIGIN) and torch's libraries in the same
# site-packages (the extension's libtorch*: in practice `import torch` has loaded them already, and the loader reuses
# a loaded soname). Nothing of the system's LLVM.
patchelf --set-rpath '$ORIGIN/../lib' "$B/bin/moe-opt"
for f in "$B"/lib/*.so; do
  case "$(basename "$f")" in
    libmoe_torch.so) patchelf --set-rpath '$ORIGIN:$ORIGIN/../../../torch/lib' "$f" ;;
    *) patchelf --set-rpath '$ORIGIN' "$f" ;;
  esac
done

TORCH_LIB=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
"$PY" - "$B/build.json" "$B" <<'EOF'
import json, re, subprocess, sys, sysconfig, torch
from pathlib import Path
# The manylinux tag: the newest GLIBC_2.N symbol version any piece needs, rounded up to auditwheel's oldest policy
# that allows it (a policy also bounds libstdc++'s versions: manylinux_2_31 is GCC 10's, which the pieces link
# against where the build has MOE_GLIBC_SYSROOT; python/tests/test_wheel.py checks that auditwheel agrees).
import auditwheel
need = 17
for f in [*Path(sys.argv[2], "bin").iterdir(), *Path(sys.argv[2], "lib").glob("*.so")]:
    out = subprocess.run(["objdump", "-T", str(f)], capture_output=True, text=True).stdout
    need = max([need, *(int(m) for m in re.findall(r"GLIBC_2\.(\d+)", out))])
policies = json.loads((Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json").read_text())
need = min(int(m.group(1)) for p in policies if (m := re.fullmatch(r"manylinux_2_(\d+)", p["name"]))
           and int(m.group(1)) >= need)
info = {"torch": torch.__version__.split("+")[0], "python": sysconfig.get_python_version(),
        "platform": f"manylinux_2_{need}_x86_64"}
open(sys.argv[1], "w").write(json.dumps(info) + "\n")
EOF
echo "== wheel: what the compiled pieces need from the system"
"$PY" "$ROOT/scripts/wheel_system_deps.py" "$B" "$TORCH_LIB"

rm -f "$DIST"/moe_mlir-*.whl
"$PY" -m pip --disable-pip-version-check wheel -q --no-deps --no-build-isolation -w "$DIST" "$STAGE"
rm -rf "$STAGE"
echo "== wheel: $(ls "$DIST"/moe_mlir-*.whl) ($(du -h "$DIST"/moe_mlir-*.whl | cut -f1), $(( $(date +%s) - start )) s)"
