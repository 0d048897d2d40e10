#!/usr/bin/env bash
# Builds the GPU check folder here (LLVM/MLIR and the CUDA toolkit's ptxas; no GPU needed), then runs it here as a
# self-test: the GPU-free steps (artifact manifests, the host build, the runtime's fake-driver test, the harness's
# unit tests) must pass and the GPU steps report "skipped".
#
#   scripts/gpu-check.sh [DIR]            (default build/gpu-check; MOE_BUILD_DIR: the build with bin/moe-opt)
#   MOE_GPU_CHECK_NO_SELFTEST=1 scripts/gpu-check.sh      (build the folder only)
#
# On the GPU machine (H100/H200 with PyTorch, cmake, nvcc; no LLVM), one command:
#   bash build/gpu-check/run.sh [OUT]     (OUT: results folder; else $OUT; see test/GPU/README.md)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/build/gpu-check}"
case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
BUILD="${MOE_BUILD_DIR:-$ROOT/build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
PY="${MOE_VENV:-$ROOT/.venv}/bin/python"; [ -x "$PY" ] || PY=python3
CHIP="${MOE_GPU_CHIP:-sm_90}"
TOOLKIT="${MOE_CUDA_TOOLKIT:-/usr/local/cuda}"

[ -x "$BUILD/bin/moe-opt" ] && [ -f "$BUILD/lib/libmoe_keys.so" ] || cmake --build "$BUILD" --target moe-opt moe_keys
rm -rf "$DIR" && mkdir -p "$DIR/art" "$DIR/bench" "$DIR/src"
# MOE_GPU_AOT_OPTIONS: more moe-lower-to-nvvm options for the check and bench cases (e.g. topk-rounds=redux).
aot() { python3 "$ROOT/tools/moe-aot/moe-aot.py" "$@" --moe-opt "$BUILD/bin/moe-opt" --chip "$CHIP" \
          --pipeline-options "${MOE_GPU_AOT_OPTIONS:-}" \
          --format fatbin --toolkit "$TOOLKIT" --ptx-fallback --drop-intermediates >/dev/null; }
echo "gpu-check: compiling the check cases and the benchmark cases for $CHIP"
# balance-kernels=true is the default since the H100 run of 2026-11-24; it stays named here so the harness's
# "balance" case keeps its kernels should the default change (moe-aot.py appends --pipeline-options to the
# pipeline's, space-separated: a balance-kernels=false in MOE_GPU_AOT_OPTIONS would still win).
MOE_GPU_AOT_OPTIONS="balance-kernels=true ${MOE_GPU_AOT_OPTIONS:-}" aot "$ROOT/test/GPU/Inputs/gpu-cases.mlir" -o "$DIR/art" --name gpu-cases
(cd "$ROOT" && "$PY" -m bench.gpu.gen_cases "$DIR/bench" >/dev/null)
aot "$DIR/bench/bench-cases.mlir" -o "$DIR/bench" --name bench-cases
# The CUDA kernels of torch.ops.moe.* that the torch-op step needs (the GPU machine has no LLVM to compile them):
# the CUDA tests run here on the CPU kernels record the kernel keys, which are then built for $CHIP.
#   MOE_GPU_CHECK_TORCH_OPS=1 (default)  every kernel the torch-op tests, the model tests and the benchmark call
#   MOE_GPU_CHECK_TORCH_OPS=sample       the kernels of a few torch-op tests (MOE_GPU_CHECK_TORCH_SAMPLE, a pytest
#                                        -k expression): the lit self-test, which must build and load the torch
#                                        extension as the GPU machine does, in seconds rather than ~10 minutes
#   MOE_GPU_CHECK_TORCH_OPS=0            none, and no torch extension (its steps then skip)
TORCH_OPS="${MOE_GPU_CHECK_TORCH_OPS:-1}"
case "$TORCH_OPS" in 0|1|sample) ;; *) echo "gpu-check: MOE_GPU_CHECK_TORCH_OPS must be 0, 1 or sample" >&2; exit 2 ;; esac
record() {   # record WHAT CMD...: run CMD (in the checkout, on the CPU kernels) recording the kernel keys
  local what="$1"; shift
  (cd "$ROOT" && MOE_BUILD_DIR="$BUILD" MOE_TEST_DEVICE=cpu MOE_KERNEL_RECORD="$KEYS" "$@" \
     >>"$DIR/kernels/record.log" 2>&1) ||
    { tail -30 "$DIR/kernels/record.log" >&2; echo "gpu-check: $what fail on the CPU" >&2; exit 1; }
}
if [ "$TORCH_OPS" != 0 ]; then
  echo "gpu-check: recording the kernels of the torch-op CUDA tests and benchmark (run on the CPU kernels)"
  mkdir -p "$DIR/kernels"
  KEYS="$DIR/kernels/keys.txt"
  : > "$KEYS"
  if [ "$TORCH_OPS" = sample ]; then
    record "the sampled torch-op CUDA tests" "$PY" -m pytest -q -p no:cacheprovider \
      -k "${MOE_GPU_CHECK_TORCH_SAMPLE:-test_token_counts_share_one_kernel}" python/tests/test_torch_ops_cuda.py
  else
    record "the torch-op CUDA tests" "$PY" -m pytest -q -p no:cacheprovider python/tests/test_torch_ops_cuda.py
    record "the transformers model tests" "$PY" -m pytest -q -p no:cacheprovider -k matches_eager \
      python/tests/test_hf_models.py
    record "the CUDA torch-op benchmark's calls" "$PY" -m bench.gpu.torch_ops_cuda --record
    record "the whole-model benchmark's calls" "$PY" -m bench.models --record
  fi
  [ -s "$KEYS" ] || { tail -30 "$DIR/kernels/record.log" >&2; echo "gpu-check: no kernel recorded" >&2; exit 1; }
  echo "gpu-check: building them for $CHIP"
  (cd "$ROOT/python" && MOE_BUILD_DIR="$BUILD" MOE_CUDA_TOOLKIT="$TOOLKIT" \
     "$PY" -m moe_mlir.runtime.prebuild "$KEYS" "$DIR/kernels" --chip "$CHIP")
fi
{ echo "chip=$CHIP"; echo "commit=$(git -C "$ROOT" rev-parse HEAD)"; echo "built=$(date -Iseconds)"
  echo "toolkit=$("$TOOLKIT/bin/ptxas" --version | tail -1)"; echo "aot_options=${MOE_GPU_AOT_OPTIONS:-}"; } > "$DIR/bench/BUILD_INFO"

# The sources the GPU machine builds and runs (tracked files only), in the repository's layout: these seeds and
# what they need, followed through their #includes and the CMake files' paths (copy_sources.py), so that a header
# a runtime source starts to include travels with it.
python3 "$ROOT/test/GPU/check/copy_sources.py" "$ROOT" "$DIR/src" --cmake "$ROOT/test/GPU/check/CMakeLists.txt" \
    lib/Runtime/CUDA lib/Runtime/CPU lib/Runtime/Torch cmake/MoELibtorch.cmake cmake/MoEDeviceRuntimes.cmake \
    tools/moe-aot test/GPU/run_gpu_tests.py python/moe_mlir/runtime/abi.py test/GPU/check_artifacts.py test/GPU/unit \
    test/GPU/runtime \
    test/GPU/check 'bench/*.py' 'bench/gpu/*.py' >/dev/null
cp "$ROOT/test/GPU/check/run.sh" "$ROOT/test/GPU/check/gpu_check.py" "$ROOT/test/GPU/check/CMakeLists.txt" "$DIR/"
# The op verifier that checks every torch op call (python/moe_mlir/runtime/verify.py): MLIR and the dialect linked
# statically (6 MB), for the GPU machine, which has no LLVM.
mkdir -p "$DIR/lib"
cp "$BUILD/lib/libmoe_keys.so" "$DIR/lib/"
cp "$ROOT/test/GPU/README.md" "$DIR/README.md"
COMMIT="$(git -C "$ROOT" rev-parse HEAD)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no | wc -l)"
"$PY" - "$DIR" "$COMMIT" "$DIRTY" <<'PYEOF'
import datetime, json, os, sys
d, commit, dirty = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = json.load(open(os.path.join(d, "art", "gpu-cases.manifest.json")))
doc = {"commit": commit + ("+local-changes" if dirty else ""),
       "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "chip": m["chip"], "toolkit": m["toolkit"], "binary_needs_cuda": m["binary_needs_cuda"],
       "ptx_isa": [p["ptx_isa"] for p in m["ptx_fallback"]],
       "manifests": ["art/gpu-cases.manifest.json", "bench/bench-cases.manifest.json"]}
json.dump(doc, open(os.path.join(d, "MANIFEST.json"), "w"), indent=1)
PYEOF
SIZE_KB="$(du -sk "$DIR" | cut -f1)"
echo "gpu-check: $DIR ($((SIZE_KB / 1024)) MiB)"
[ "$SIZE_KB" -lt $((60 * 1024)) ] || { echo "gpu-check: the folder is over 60 MiB" >&2; exit 1; }

[ -n "${MOE_GPU_CHECK_NO_SELFTEST:-}" ] && exit 0
# Self-test here: GPU steps skipped (exit 77), every other step must pass.
rc=0
# The host build (the torch extension's five files on a cold ccache) takes minutes on two shared cores: the
# self-test gives it and the run more time than the GPU machine's limits (300 s, 540 s).
# The host build's folder is the check folder's own sibling (build/gpu-check-selftest-build for the default): a
# CMake build folder is bound to its source folder, so one shared by two check folders fails to configure.
# (No comment line between the continued lines below: it would end the command there, and the two limits would
# stay unexported shell variables, as they did: the self-test's build ran under the GPU machine's 300 s.)
MOE_GPU_CHECK_BUILD_TIMEOUT_S="${MOE_GPU_CHECK_BUILD_TIMEOUT_S:-1200}" \
MOE_GPU_CHECK_BUDGET_S="${MOE_GPU_CHECK_BUDGET_S:-1800}" \
MOE_PYTHON="$PY" MOE_REPO="${MOE_REPO:-$ROOT}" MOE_GPU_CHECK_BUILD="${MOE_GPU_CHECK_BUILD:-$DIR-selftest-build}" \
  bash "$DIR/run.sh" "${MOE_GPU_CHECK_SELFTEST_OUT:-$BUILD/gpu-check-selftest}" || rc=$?
if [ "$rc" = 77 ] || [ "$rc" = 0 ]; then exit 0; fi
exit "$rc"
