#!/usr/bin/env bash
# Set-up command (b): installs what is missing, builds, and runs the whole test suite: the lit suite (check-moe)
# the ctest suites (unit, reference; gpu reports skipped without a GPU), the Python tests (pytest), then the lit and
# ctest suites under ASan + UBSan and a 2-minute fuzz run (MOE_SANITIZE=0 leaves those two out). Ends with
# "N passed, N failed, N skipped".
source "$(dirname "$0")/common.sh"

install_system_packages
install_python
configure_and_build

log="$BUILD/test-summary"
mkdir -p "$log"
status=0

echo "== lit (check-moe)"
cmake --build "$BUILD" --target check-moe 2>&1 | tee "$log/lit.txt" || status=1

ctest_passed=0; ctest_failed=0; ctest_skipped=0
if [ -f "$BUILD/CTestTestfile.cmake" ]; then
  echo "== ctest"
  ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" 2>&1 | tee "$log/ctest.txt" || status=1
  # ctest's own summary: "N% tests passed, F tests failed out of T"; skipped tests are among the T.
  ctest_failed=$(grep -oE '[0-9]+ tests failed out of' "$log/ctest.txt" | grep -oE '^[0-9]+' || echo 0)
  ctest_total=$(grep -oE 'tests failed out of [0-9]+' "$log/ctest.txt" | grep -oE '[0-9]+$' || echo 0)
  ctest_skipped=$(grep -cE '\*\*\*Skipped' "$log/ctest.txt" || true)
  ctest_passed=$((ctest_total - ctest_failed - ctest_skipped))
fi

py_passed=0; py_failed=0; py_skipped=0
echo "== pytest (python/tests)"
MOE_BUILD_DIR="$BUILD" "$VENV/bin/python" -m pytest "$ROOT/python/tests" -q -p no:cacheprovider 2>&1 |
  tee "$log/pytest.txt" || status=1
pycount() { grep -E '^[0-9]+ (passed|failed|skipped|error)|in [0-9.]+s' "$log/pytest.txt" | tail -1 |
            grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
py_passed=$(pycount passed); py_failed=$(( $(pycount failed) + $(pycount error) )); py_skipped=$(pycount skipped)

# Reliability (scripts/sanitize.sh, scripts/fuzz.sh): the lit and ctest suites again under ASan + UBSan (build-san/),
# then a 120 s libFuzzer run over the parser, verifier and pipelines that fails on any crash or hang. On by default
# (CI runs them: about 10 minutes on two cores with a cold ccache); MOE_SANITIZE=0 skips them for a quick local run.
san_passed=0; san_failed=0; san_skipped=0; fuzz_passed=0; fuzz_failed=0
if [ "${MOE_SANITIZE:-1}" != 0 ]; then
  echo "== sanitizers (build-san: ASan + UBSan)"
  "$ROOT/scripts/sanitize.sh" 2>&1 | tee "$log/sanitize.txt" || status=1
  read -r san_passed san_failed san_skipped < <(grep -oE 'sanitize: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' \
    "$log/sanitize.txt" | grep -oE '[0-9]+' | tr '\n' ' '; echo) || true
  [ -n "$san_passed" ] || { san_passed=0; san_failed=1; san_skipped=0; }
  echo "== fuzz (moe-fuzz, ${MOE_FUZZ_SECONDS:-120} s)"
  if "$ROOT/scripts/fuzz.sh" 2>&1 | tee "$log/fuzz.txt"; then fuzz_passed=1; else status=1; fuzz_failed=1; fi
fi

count() { grep -oE "^ *$1 *: *[0-9]+" "$log/lit.txt" | grep -oE '[0-9]+$' || echo 0; }
lit_passed=$(( $(count Passed) + $(count 'Expectedly Failed') ))
lit_failed=$(( $(count Failed) + $(count 'Unexpectedly Passed') + $(count Unresolved) + $(count 'Timed Out') ))
lit_skipped=$(( $(count Unsupported) + $(count Skipped) ))

passed=$((lit_passed + ctest_passed + py_passed + san_passed + fuzz_passed))
failed=$((lit_failed + ctest_failed + py_failed + san_failed + fuzz_failed))
skipped=$((lit_skipped + ctest_skipped + py_skipped + san_skipped))
[ "$failed" -eq 0 ] || status=1
echo "== summary: lit $lit_passed passed, $lit_failed failed, $lit_skipped skipped;" \
     "ctest $ctest_passed passed, $ctest_failed failed, $ctest_skipped skipped;" \
     "pytest $py_passed passed, $py_failed failed, $py_skipped skipped;" \
     "sanitizers $san_passed passed, $san_failed failed, $san_skipped skipped;" \
     "fuzz $fuzz_passed passed, $fuzz_failed failed"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
