#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of moe-opt, the runtimes, the unit tests and the libFuzzer
# target (build-san/, clang-22), then the lit suite and the unit tests on it. Run by scripts/test.sh; alone:
#   ./scripts/sanitize.sh            # configure + build + lit + ctest
#   MOE_SAN_STEPS=build ./scripts/sanitize.sh   # only the build (scripts/fuzz.sh needs build-san/bin/moe-fuzz)
# Ends with "sanitize: N passed, N failed, N skipped".
#
# Debian's libMLIR.so / libLLVM.so are not instrumented; our code is. Hence these run-time options (and no
# suppressions):
# - detect_leaks=0: the uninstrumented tools the lit tests pipe through (mlir-runner, FileCheck) and MLIR's
#   process-lifetime registries (contexts, pass registrations freed only at exit) are reported as leaks that are
#   not ours;
# - detect_container_overflow=0: std::vector annotations differ between instrumented and uninstrumented code
#   that share a container (libMLIR's SmallVector/std::vector handed to our code), which gives false reports;
# - allow_user_poisoning=0: the same for llvm::BumpPtrAllocator, whose inline code poisons a slab's free space
#   when compiled with ASan (our code) and does not unpoison what it hands out when not (libMLIR): an attribute
#   storage allocated by our code and one by libMLIR in the same slab gives "use-after-poison" in libMLIR's
#   memmove (seen in FileLineColRange::get after moe dialect attributes were uniqued);
# - LD_PRELOAD of the shared ASan runtime: mlir-runner (uninstrumented) loads our instrumented
#   libmoe_cpu_runtime.so, which needs the runtime first in the process (everything is built with -shared-libsan).
source "$(dirname "$0")/common.sh"

SAN_BUILD="${MOE_SAN_BUILD_DIR:-$ROOT/build-san}"
SAN_STEPS="${MOE_SAN_STEPS:-build lit ctest}"

# clang and its sanitizer/libFuzzer runtimes (compiler-rt), through common.sh's installer.
SYSTEM_PACKAGES=(clang-22 libclang-rt-22-dev)
install_system_packages

SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -shared-libsan"
# Coverage counters for moe-fuzz (libFuzzer's guidance) in every library of ours; free for the other binaries.
COV_FLAGS="-fsanitize=fuzzer-no-link"
# -O1, the level the sanitizers' documentation suggests, instead of Release's -O3: the instrumented build is the
# longest stage of the test command on two cores (the critical path of CI), and -O3's inlining and vectorization
# of instrumented code cost compile time that the tests, mostly in uninstrumented LLVM/MLIR, do not win back.
SAN_OPT="${MOE_SAN_OPT:--O1}"
if [ ! -f "$SAN_BUILD/build.ninja" ]; then
  echo "== configuring $SAN_BUILD (clang-22, ASan + UBSan)"
  launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  cmake -G Ninja -S "$ROOT" -B "$SAN_BUILD" "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS_RELEASE="$SAN_OPT -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="$SAN_OPT -DNDEBUG" \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DCMAKE_C_FLAGS="$SAN_FLAGS $COV_FLAGS" -DCMAKE_CXX_FLAGS="$SAN_FLAGS $COV_FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="$SAN_FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$SAN_FLAGS" \
    -DCMAKE_MODULE_LINKER_FLAGS="$SAN_FLAGS" \
    -DMOE_ENABLE_FUZZER=ON \
    -DMLIR_DIR="$LLVM_PREFIX/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$LLVM_PREFIX/bin/lit"
fi

ASAN_RT="$(clang++-22 -print-file-name=libclang_rt.asan-x86_64.so)"
export ASAN_OPTIONS="detect_leaks=0:detect_container_overflow=0:allow_user_poisoning=0:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export LD_LIBRARY_PATH="$(dirname "$ASAN_RT")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

log="$SAN_BUILD/test-summary"
status=0
passed=0; failed=0; skipped=0
if [[ " $SAN_STEPS " == *" build "* ]]; then
  # Only what the lit suite, the unit tests and the fuzzer run. Not the torch extension (libmoe_torch.so, one
  # large TU against the libtorch and Python headers), which only pytest loads, and pytest does not run here. Not
  # the libtorch reference tests either: what they check is the numerics of kernels that MLIR compiles at run
  # time (never instrumented), which the plain ctest checks; the instrumented code they reach (the passes, the
  # executor, the kernel runtime) runs here through lit (every pipeline, Integration/ through mlir-runner with
  # the instrumented runtime) and the unit tests (executor, zero-sized shapes, the async runtime). Under ASan
  # they were 86% of this stage's ctest time and 12% of its build (about 200 CPU s of a 2-core CI run).
  # Every executable of the `unit` label is here: ctest adds one that is not built as NAME_NOT_BUILT, without the
  # label, which `-L unit` then leaves out without a word (the four after MoEZeroSizedTest were, until 2026-11-30;
  # the ctest step below now fails on one).
  wanted=(moe-opt mlir-doc moe_cpu_runtime moe_kernel_runtime moe_cuda_runtime moe-cuda-runtime-fake-test
          moe-cuda-runtime-host-path
          MoEExecutorC MoEExecutorTest MoEZeroSizedTest MoEKernelAsyncRuntimeTest MoELayoutTest MoEShortestDecimalTest
          MoECostSharesTest moe-fuzz)
  # Targets this configuration has (no CUDA toolkit: no moe_cuda_runtime; no libtorch: no reference tests).
  known=$(ninja -C "$SAN_BUILD" -t targets all 2>/dev/null | sed 's/:.*//')
  targets=()
  for t in "${wanted[@]}"; do grep -qx "$t" <<<"$known" && targets+=("$t"); done
  echo "== building $SAN_BUILD: ${targets[*]}"
  /usr/bin/time -f "sanitize: build took %e s wall, %U s user + %S s system CPU" cmake --build "$SAN_BUILD" -j "$JOBS" --target "${targets[@]}" || exit 1
fi
mkdir -p "$log"
if [[ " $SAN_STEPS " == *" lit "* ]]; then
  echo "== lit (check-moe) under ASan + UBSan"
  # Python (the AOT tool, the GPU harness) would need the runtime preloaded too, and runs no code of ours that
  # the other tests do not: those tests are left to the plain build.
  # Five tests of the plain run are left out here (issue #36; `--filter-out`, so lit on build-san/ by hand still
  # has them):
  # - GPU/harness-unit: pytest of the GPU harness against fakes (Python and git only): no code of ours runs in it;
  # - GPU/ptxas-sweep: moe-opt's NVVM pipeline on every chunk of Conversion/MoEToGPU and GPU/Inputs/gpu-cases
  #   (lowered once, for sm_80), each kernel then through ptxas (not instrumented) for sm_80 and sm_90. The gpu-sweep
  #   step below lowers every chunk for sm_90 without ptxas: the same code of ours (the chip only picks topk-rounds,
  #   list-redux on both), ~85 s less of this lit run on 2 loaded cores.
  #   GPU/ptxas-report (every op, both chips) and ptxas-balance still run here;
  # - GPU/ptxas-mma: the tensor-core cases through moe-lower-to-nvvm under four option sets, ptxas after each
  #   (336 of this run's 834 test-seconds on the Xeon, CI on d7d1d11). The code of ours it reaches is
  #   convert-moe-to-gpu's FlashMma under those options, which Conversion/MoEToGPU/similarity_inform_mma*.mlir and
  #   attention_posterior_mma.mlir run here under the same options (FileCheck), and gpu-sweep below through the
  #   whole pipeline (their chunks, with their files' ptxas-options);
  # - GPU/sass-budget: the SASS figures of ops that GPU/ptxas-report lowers here too (the same code of ours), the
  #   rest nvdisasm and Python;
  # - GPU/ptxas-flash-f32: gpu-cases.mlir (the largest chunk) lowered once more, under flash-mma-tf32, each kernel
  #   then through ptxas. The code of ours it reaches is FlashTf32.cpp under that option, which
  #   Conversion/MoEToGPU/similarity_inform_tf32.mlir runs here (FileCheck), and the pipeline after
  #   convert-moe-to-gpu, which gpu-sweep below runs on every chunk.
  start=$SECONDS
  LD_PRELOAD="$ASAN_RT" "$LLVM_PREFIX/bin/lit" -sv --filter-out 'GPU/(ptxas-sweep|ptxas-mma|ptxas-flash-f32|harness-unit|sass-budget)\.mlir$' \
    "$SAN_BUILD/test" 2>&1 | tee "$log/lit.txt" || status=1
  echo "sanitize: lit took $((SECONDS - start)) s wall"
  count() { grep -oE "^ *$1 *: *[0-9]+" "$log/lit.txt" | grep -oE '[0-9]+$' || echo 0; }
  passed=$((passed + $(count Passed)))
  failed=$((failed + $(count Failed) + $(count Unresolved) + $(count 'Timed Out')))
  skipped=$((skipped + $(count Unsupported)))
fi
if [[ " $SAN_STEPS " == *" lit "* ]]; then
  # gpu-sweep: what GPU/ptxas-sweep runs of our code, once: moe-opt --moe-lower-to-nvvm (chip=sm_90, format=isa:
  # through serialization) on every `// -----` chunk that expects no diagnostic, with the file's
  # `// ptxas-options:`: bench/gpu/ptxas_report.py's case_chunks and lower_to_isa, what the sweep splits and runs.
  # Any failure or sanitizer report fails it. $JOBS chunks at a time: this step often runs after the plain stages
  # have ended, and one moe-opt at a time left a core idle for its 224 s (CI on d7d1d11). gpu-cases.mlir, the
  # largest chunk (~1 min), goes first.
  echo "== gpu-sweep (moe-opt --moe-lower-to-nvvm on every GPU test chunk) under ASan + UBSan"
  start=$SECONDS
  if LD_PRELOAD="$ASAN_RT" python3 - "$ROOT/bench/gpu" "$SAN_BUILD/bin/moe-opt" "$JOBS" \
       "$ROOT/test/GPU/Inputs/gpu-cases.mlir" "$ROOT"/test/Conversion/MoEToGPU/*.mlir > "$log/gpu-sweep.txt" 2>&1 <<'PY'
import sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
from ptxas_report import case_chunks, lower_to_isa
moe_opt, jobs = sys.argv[2], int(sys.argv[3])
chunks = [chunk for path in sys.argv[4:] for chunk in case_chunks(path, split=True)]
def lower(case):
    name, text, options = case
    proc = lower_to_isa(moe_opt, "sm_90", options, text)
    if proc.returncode != 0 or "ERROR: AddressSanitizer" in proc.stderr or "runtime error" in proc.stderr:
        return f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return None
with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
    failed = [msg for msg in pool.map(lower, chunks) if msg]
print("\n".join(failed))
print(f"gpu-sweep: {len(chunks)} chunks lowered, {len(failed)} failed")
sys.exit(1 if failed or not chunks else 0)
PY
  then passed=$((passed + 1)); else failed=$((failed + 1)); status=1; fi
  tail -20 "$log/gpu-sweep.txt"
  echo "sanitize: gpu-sweep took $((SECONDS - start)) s wall"
fi
if [[ " $SAN_STEPS " == *" ctest "* ]]; then
  echo "== ctest (unit) under ASan + UBSan"
  start=$SECONDS
  # The unit tests only: the reference tests are not built here (see the build step). A unit test whose executable
  # is missing (gtest_discover_tests' include file: `if(EXISTS exe) ... LABELS;unit ... else NAME_NOT_BUILT`) is a
  # failure, not a test left out.
  for f in "$SAN_BUILD"/unittests/*_include.cmake; do
    grep -q 'LABELS;unit' "$f" || continue
    exe=$(sed -n 's/^if(EXISTS "\(.*\)")$/\1/p' "$f" | head -1)
    [ -x "$exe" ] || { echo "sanitize: the unit test ${exe##*/} is not built (add it to the build step's list)"; failed=$((failed + 1)); status=1; }
  done
  LD_PRELOAD="$ASAN_RT" ctest --test-dir "$SAN_BUILD" --output-on-failure -j "$JOBS" -L unit 2>&1 |
    tee "$log/ctest.txt" || status=1
  echo "sanitize: ctest took $((SECONDS - start)) s wall"
  c_failed=$(grep -oE '[0-9]+ tests failed out of' "$log/ctest.txt" | grep -oE '^[0-9]+' || echo 0)
  c_total=$(grep -oE 'tests failed out of [0-9]+' "$log/ctest.txt" | grep -oE '[0-9]+$' || echo 0)
  c_skipped=$(grep -cE '\*\*\*Skipped' "$log/ctest.txt" || true)
  passed=$((passed + c_total - c_failed - c_skipped)); failed=$((failed + c_failed))
  skipped=$((skipped + c_skipped))
fi
[ "$failed" -eq 0 ] || status=1
echo "sanitize: $passed passed, $failed failed, $skipped skipped"
exit $status
