#!/usr/bin/env bash
# Set-up command (b): installs what is missing, builds, and runs the whole test suite: the lit suite (check-moe)
# the ctest suites (unit, reference; gpu reports skipped without a GPU) and the Python tests (pytest). Ends with
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

count() { grep -oE "^ *$1 *: *[0-9]+" "$log/lit.txt" | grep -oE '[0-9]+$' || echo 0; }
lit_passed=$(( $(count Passed) + $(count 'Expectedly Failed') ))
lit_failed=$(( $(count Failed) + $(count 'Unexpectedly Passed') + $(count Unresolved) + $(count 'Timed Out') ))
lit_skipped=$(( $(count Unsupported) + $(count Skipped) ))

passed=$((lit_passed + ctest_passed + py_passed))
failed=$((lit_failed + ctest_failed + py_failed))
skipped=$((lit_skipped + ctest_skipped + py_skipped))
[ "$failed" -eq 0 ] || status=1
echo "== summary: lit $lit_passed passed, $lit_failed failed, $lit_skipped skipped;" \
     "ctest $ctest_passed passed, $ctest_failed failed, $ctest_skipped skipped;" \
     "pytest $py_passed passed, $py_failed failed, $py_skipped skipped"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
