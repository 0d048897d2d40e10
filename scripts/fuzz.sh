#!/usr/bin/env bash
# Fuzzes moe-opt's parser, verifier and pipelines with libFuzzer (tools/moe-fuzz, built by scripts/sanitize.sh
# with ASan + UBSan). The seed corpus is test/**/*.mlir split at `// -----`, each chunk behind one byte that picks
# the pipeline (canonicalize, convert-moe-to-linalg, moe-lower-to-llvm with and without the fast kernels,
# fuse/split, moe-lower-to-nvvm, convert-moe-to-gpu). Fails on a crash, an abort, a sanitizer report, a hang
# (an input over 30 s) or an input over 4 GB; the input is kept under build-san/fuzz/crashes/.
#   ./scripts/fuzz.sh                          # short run: 120 s (scripts/test.sh runs this)
#   MOE_FUZZ_SECONDS=3600 MOE_FUZZ_JOBS=2 ./scripts/fuzz.sh   # long run: an hour on two cores
#   MOE_FUZZ_RUNS=100000 MOE_FUZZ_SECONDS=5400 nice -n 19 ./scripts/fuzz.sh   # stops after 100,000 inputs
#   MOE_FUZZ_DIR=build-san/fuzz-long ...       # another work folder (log, corpus, crashes), e.g. beside a short run
#   build-san/bin/moe-fuzz build-san/fuzz/crashes/crash-...    # replays one input
source "$(dirname "$0")/common.sh"

SAN_BUILD="${MOE_SAN_BUILD_DIR:-$ROOT/build-san}"
SECONDS_BUDGET="${MOE_FUZZ_SECONDS:-120}"
FUZZ_JOBS="${MOE_FUZZ_JOBS:-1}"
FUZZ_RUNS="${MOE_FUZZ_RUNS:-}"
FUZZER="$SAN_BUILD/bin/moe-fuzz"
[ -x "$FUZZER" ] || MOE_SAN_STEPS=build "$ROOT/scripts/sanitize.sh"

work="${MOE_FUZZ_DIR:-$SAN_BUILD/fuzz}"
seeds="$work/seeds"; corpus="$work/corpus"; crashes="$work/crashes"
mkdir -p "$seeds" "$corpus" "$crashes"
# One seed per `// -----` chunk of every test; the leading byte cycles through the pipelines.
python3 - "$ROOT/test" "$seeds" <<'PY'
import pathlib, sys
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = 0
for path in sorted(root.rglob("*.mlir")):
    for chunk in path.read_text(errors="replace").split("// -----"):
        if "moe." not in chunk or len(chunk) > 65536:
            continue
        (out / f"seed-{n:05d}").write_bytes(bytes([n % 7]) + chunk.encode())
        n += 1
print(f"fuzz: {n} seeds from {root}")
PY

ASAN_RT="$(clang++-22 -print-file-name=libclang_rt.asan-x86_64.so)"
export LD_LIBRARY_PATH="$(dirname "$ASAN_RT")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# See scripts/sanitize.sh for why these options (uninstrumented libMLIR).
export ASAN_OPTIONS="detect_leaks=0:detect_container_overflow=0:allow_user_poisoning=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

echo "== fuzz: $SECONDS_BUDGET s, $FUZZ_JOBS job(s)"
status=0
# The ASan runtime must come first in the process (the link puts libstdc++ before it): preload it, as sanitize.sh
# does for the lit suite.
LD_PRELOAD="$ASAN_RT" "$FUZZER" "$corpus" "$seeds" -max_total_time="$SECONDS_BUDGET" -timeout=30 -rss_limit_mb=4096 -max_len=65536 \
  -dict="$ROOT/tools/moe-fuzz/mlir.dict" -keep_seed=1 -artifact_prefix="$crashes/" -print_final_stats=1 \
  $( [ "$FUZZ_JOBS" -gt 1 ] && echo "-fork=$FUZZ_JOBS -ignore_crashes=0" ) ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} 2>&1 | tee "$work/log.txt" | grep -E \
  "INITED|DONE|ERROR|==[0-9]+==|moe-fuzz:|Test unit written|stat::number_of_executed_units|Done [0-9]+ runs" || true
grep -qE "ERROR: libFuzzer|ERROR: AddressSanitizer|runtime error|Test unit written|moe-fuzz: verified" "$work/log.txt" &&
  status=1
runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$work/log.txt" | grep -oE '[0-9]+$' | tail -1 || true)
# Fork mode (-fork=N) prints no final stats: its last status line "#N: cov: ..." counts the inputs of all jobs.
[ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+: cov:' "$work/log.txt" | grep -oE '[0-9]+' | tail -1 || true)
# A fuzzer that did not start (or died before its stats) has tested nothing: that is a failure, not a pass.
if [ -z "$runs" ] || [ "$runs" -eq 0 ]; then
  echo "fuzz: the fuzzer ran no input; its log ($work/log.txt) ends:"; tail -5 "$work/log.txt"
  status=1
fi
echo "fuzz: ${runs:-?} inputs in $SECONDS s (budget $SECONDS_BUDGET s${FUZZ_RUNS:+ or $FUZZ_RUNS inputs}), $( [ $status -eq 0 ] && echo "no crash or hang" || echo "FAILED (see $crashes)")"
exit $status
