#!/usr/bin/env bash
# Set-up command (b): installs what is missing, builds, and runs the whole test suite: the lit suite (check-moe)
# the ctest suites (unit, reference; gpu reports skipped without a GPU), the Python tests (pytest), then the lit and
# unit tests under ASan + UBSan and a fuzz run (2 processes x 60 s) (MOE_SANITIZE=0 leaves those two out). Ends with
# "N passed, N failed, N skipped".
#   ./scripts/test.sh               # everything (CI); times: docs/Testing.md
#   MOE_QUICK=1 ./scripts/test.sh   # quick local run: no sanitizer build, no fuzz run (the same lit, ctest, pytest)
#
# After the build the stages are independent, and on two cores each one alone leaves a core idle much of the time
# (pytest is one process whose kernel compiles are serial subprocesses; lit and ctest end on a few long tests), so
# they run side by side: pytest in the foreground, lit then ctest beside it, and the sanitizer chain (build-san,
# ASan lit + ctest, fuzz) beside both at a lower priority. Each writes its log under $BUILD/test-summary/, printed
# when the stage ends; the counts are read from those logs.
source "$(dirname "$0")/common.sh"

QUICK="${MOE_QUICK:-0}"
SANITIZE="${MOE_SANITIZE:-1}"
[ "$QUICK" = 0 ] || SANITIZE=0

# CPU_NOW: the CPU seconds (user + system) of this shell's finished children so far, from bash's `times` (run in
# this shell, not a subshell: a command substitution's `times` would count only its own children). The stages'
# CPU seconds, printed beside their wall times, are what the run's length on two busy cores comes from.
children_cpu() {
  local f="${TMPDIR:-/tmp}/moe-test-times.$BASHPID"
  times > "$f"
  CPU_NOW=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] }
                           printf "%d\n", n + 0.5 }' "$f")
  rm -f "$f"
}

t0=$SECONDS
children_cpu; cpu0=$CPU_NOW
install_system_packages
install_python
configure_and_build
build_s=$((SECONDS - t0))
children_cpu; build_cpu=$((CPU_NOW - cpu0))

log="$BUILD/test-summary"
rm -rf "$log"
mkdir -p "$log"
status=0

# A stage in the background: `stage NAME CMD...` runs CMD with its output in $log/NAME.txt, its exit status in
# $log/NAME.rc, its wall time in $log/NAME.s and its CPU seconds in $log/NAME.cpu.
stage() {
  local name=$1; shift
  local start=$SECONDS rc=0 cpu
  children_cpu; cpu=$CPU_NOW
  "$@" > "$log/$name.txt" 2>&1 || rc=$?
  echo "$rc" > "$log/$name.rc"
  echo $((SECONDS - start)) > "$log/$name.s"
  children_cpu; echo $((CPU_NOW - cpu)) > "$log/$name.cpu"
}
# took NAME: "W s (cpu C s)" of a finished stage.
took() { echo "$(cat "$log/$1.s" 2>/dev/null || echo -) s (cpu $(cat "$log/$1.cpu" 2>/dev/null || echo -) s)"; }
show() {  # prints a finished stage's log and whether it failed
  echo "== ${2:-$1}: $(cat "$log/$1.s") s"
  cat "$log/$1.txt"
  [ "$(cat "$log/$1.rc")" = 0 ] || status=1
}

# The sanitizer chain (scripts/sanitize.sh, scripts/fuzz.sh): the lit and ctest suites again under ASan + UBSan
# (build-san/), then a libFuzzer run (2 x 60 s) over the parser, verifier and pipelines that fails on any crash or hang.
# On by default (CI runs them); MOE_SANITIZE=0 or MOE_QUICK=1 leaves them out. nice: the plain suites come first
# when both want a core; the chain has the idle one.
# check-moe's one dependency outside `all` (the generated op docs docs-up-to-date.mlir compares), built here: lit
# then runs directly, so that no second ninja runs in $BUILD beside a test that builds there. Before any stage
# starts: a failure here ends the script (set -e) with nothing left running in the background.
cmake --build "$BUILD" --target mlir-doc > /dev/null

# The background stages die with the script: a CI timeout, Ctrl-C or a failing step must not leave lit, ctest,
# ninja or the fuzzer running as orphans (non-interactive bash starts background jobs ignoring SIGINT, and killing
# a subshell alone would not reach its children).
san_pid=""; plain_pid=""
kill_tree() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$c"; done; kill -TERM "$1" 2>/dev/null || true; }
stop_stages() { local p; for p in $san_pid $plain_pid; do kill_tree "$p"; done; }
trap stop_stages EXIT
trap 'stop_stages; exit 130' INT TERM

# The fuzz run comes last, when the other stages have ended and both cores are free: two fuzzing processes for 60 s
# (libFuzzer's fork mode) rather than one for 120 s, the same CPU time in half the wall time.
export MOE_FUZZ_JOBS="${MOE_FUZZ_JOBS:-2}" MOE_FUZZ_SECONDS="${MOE_FUZZ_SECONDS:-60}"
fuzz_what="moe-fuzz, $MOE_FUZZ_JOBS x $MOE_FUZZ_SECONDS s"
if [ "$SANITIZE" != 0 ]; then
  echo "== sanitizers (build-san: ASan + UBSan) and fuzz ($fuzz_what): in the background"
  ( stage sanitize nice -n 10 "$ROOT/scripts/sanitize.sh"
    stage fuzz nice -n 10 "$ROOT/scripts/fuzz.sh" ) &
  san_pid=$!
fi

# pytest in two processes: the files below (whole-model training, the wheel in a fresh venv, multi-process ranks,
# the examples (a transformers causal LM generating and training; torchrun),
# every transformers MoE family: about 170 s plus test_hf_families.py's 4-6 min) run after ctest in the lit/ctest
# stage, the rest in the foreground. One pytest
# process alone left a core idle for its last ~240 s, once the sanitizer chain had ended (CI10, docs/Testing.md).
# Both share the kernels' disk cache (a kernel one process built, the other loads).
PYTEST_LATE=(test_router_losses_hf.py test_wheel.py test_expert_parallel.py test_distributed.py test_training.py test_examples.py
             test_hf_models.py test_hf_families.py)
pytest_cmd=(env MOE_BUILD_DIR="$BUILD" "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=20)

echo "== lit (check-moe), ctest, then pytest of ${PYTEST_LATE[*]}: in the background"
(
  stage lit "$LLVM_PREFIX/bin/lit" -sv "$BUILD/test"
  if [ -f "$BUILD/CTestTestfile.cmake" ]; then
    stage ctest ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
  fi
  stage pytest-late "${pytest_cmd[@]}" "${PYTEST_LATE[@]/#/$ROOT/python/tests/}"
) &
plain_pid=$!

echo "== pytest (python/tests but ${PYTEST_LATE[*]})"
start=$SECONDS
children_cpu; cpu=$CPU_NOW
py_rc=0
"${pytest_cmd[@]}" "$ROOT/python/tests" "${PYTEST_LATE[@]/#/--ignore=$ROOT/python/tests/}" 2>&1 |
  tee "$log/pytest.txt" || py_rc=$?
[ "$py_rc" = 0 ] || status=1
pytest_s=$((SECONDS - start))
children_cpu; pytest_cpu=$((CPU_NOW - cpu))
# pycount FILE WHAT: the count of WHAT (passed, failed, ...) in a pytest log's summary line.
pycount() { grep -E '^[0-9]+ (passed|failed|skipped|error)|in [0-9.]+s' "$1" | tail -1 |
            grep -oE "[0-9]+ $2" | grep -oE '^[0-9]+' || echo 0; }
py_passed=$(pycount "$log/pytest.txt" passed); py_skipped=$(pycount "$log/pytest.txt" skipped)
py_failed=$(( $(pycount "$log/pytest.txt" failed) + $(pycount "$log/pytest.txt" error) ))
# pytest killed or crashed (no summary line, or an exit status its counts do not explain): a failure, not 0 failed.
[ "$py_rc" = 0 ] || [ "$py_failed" -gt 0 ] || py_failed=1

wait "$plain_pid" || status=1
plain_pid=""  # finished: nothing left for stop_stages
show lit "lit (check-moe)"
show pytest-late "pytest (${PYTEST_LATE[*]})"
late_failed=$(( $(pycount "$log/pytest-late.txt" failed) + $(pycount "$log/pytest-late.txt" error) ))
[ "$(cat "$log/pytest-late.rc")" = 0 ] || [ "$late_failed" -gt 0 ] || late_failed=1
py_passed=$((py_passed + $(pycount "$log/pytest-late.txt" passed)))
py_skipped=$((py_skipped + $(pycount "$log/pytest-late.txt" skipped)))
py_failed=$((py_failed + late_failed))
ctest_passed=0; ctest_failed=0; ctest_skipped=0
if [ -f "$log/ctest.txt" ]; then
  show ctest
  # ctest's own summary: "N% tests passed, F tests failed out of T"; skipped tests are among the T.
  ctest_failed=$(grep -oE '[0-9]+ tests failed out of' "$log/ctest.txt" | grep -oE '^[0-9]+' || echo 0)
  ctest_total=$(grep -oE 'tests failed out of [0-9]+' "$log/ctest.txt" | grep -oE '[0-9]+$' || echo 0)
  ctest_skipped=$(grep -cE '\*\*\*Skipped' "$log/ctest.txt" || true)
  ctest_passed=$((ctest_total - ctest_failed - ctest_skipped))
  # No summary line at all (ctest did not run): a failure, not zero tests.
  grep -qE 'tests failed out of' "$log/ctest.txt" || ctest_failed=1
fi

san_passed=0; san_failed=0; san_skipped=0; fuzz_passed=0; fuzz_failed=0
times="build $build_s s (cpu $build_cpu s), pytest $pytest_s s (cpu $pytest_cpu s), lit $(took lit), ctest $(took ctest)"
times="$times, pytest-late $(took pytest-late)"
if [ -n "$san_pid" ]; then
  [ -f "$log/fuzz.rc" ] || echo "== waiting for the sanitizer chain"
  wait "$san_pid" || status=1
  san_pid=""
  show sanitize "sanitizers (build-san: ASan + UBSan)"
  read -r san_passed san_failed san_skipped < <(grep -oE 'sanitize: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' \
    "$log/sanitize.txt" | grep -oE '[0-9]+' | tr '\n' ' '; echo) || true
  [ -n "$san_passed" ] || { san_passed=0; san_failed=1; san_skipped=0; }
  # sanitize.sh failed with no failure in its counts (its lit or ctest killed: no summary to count from).
  [ "$(cat "$log/sanitize.rc")" = 0 ] || [ "$san_failed" -gt 0 ] || san_failed=1
  show fuzz "fuzz ($fuzz_what)"
  if [ "$(cat "$log/fuzz.rc")" = 0 ]; then fuzz_passed=1; else fuzz_failed=1; fi
  times="$times, sanitizers $(took sanitize), fuzz $(took fuzz)"
fi

count() { grep -oE "^ *$1 *: *[0-9]+" "$log/lit.txt" | grep -oE '[0-9]+$' || echo 0; }
lit_passed=$(( $(count Passed) + $(count 'Expectedly Failed') ))
lit_failed=$(( $(count Failed) + $(count 'Unexpectedly Passed') + $(count Unresolved) + $(count 'Timed Out') ))
lit_skipped=$(( $(count Unsupported) + $(count Skipped) ))
[ "$(cat "$log/lit.rc")" = 0 ] || [ "$lit_failed" -gt 0 ] || lit_failed=1  # lit (or the build before it) failed

passed=$((lit_passed + ctest_passed + py_passed + san_passed + fuzz_passed))
failed=$((lit_failed + ctest_failed + py_failed + san_failed + fuzz_failed))
skipped=$((lit_skipped + ctest_skipped + py_skipped + san_skipped))
[ "$failed" -eq 0 ] || status=1
echo "== times (wall, side by side after the build): $times; total $((SECONDS - t0)) s$( [ "$QUICK" = 0 ] || echo " (quick mode)")"
echo "== summary: lit $lit_passed passed, $lit_failed failed, $lit_skipped skipped;" \
     "ctest $ctest_passed passed, $ctest_failed failed, $ctest_skipped skipped;" \
     "pytest $py_passed passed, $py_failed failed, $py_skipped skipped;" \
     "sanitizers $san_passed passed, $san_failed failed, $san_skipped skipped;" \
     "fuzz $fuzz_passed passed, $fuzz_failed failed"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
