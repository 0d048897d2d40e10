#!/usr/bin/env bash
# Set-up command (b): installs what is missing, builds, and runs the whole test suite: the lit suite (check-moe)
# and the ctest suites (unit, reference; gpu reports skipped without a GPU). Ends with "N passed, N failed".
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
  ctest_failed=$(grep -cE '\*\*\*Failed|\*\*\*Exception|\(Failed\)|Not Run' "$log/ctest.txt" || true)
  ctest_skipped=$(grep -cE '\*\*\*Skipped| Skipped ' "$log/ctest.txt" || true)
  ctest_total=$(grep -oE 'tests failed out of [0-9]+' "$log/ctest.txt" | grep -oE '[0-9]+$' || echo 0)
  ctest_passed=$((ctest_total - ctest_failed - ctest_skipped))
fi

count() { grep -oE "^ *$1: *[0-9]+" "$log/lit.txt" | grep -oE '[0-9]+$' || echo 0; }
lit_passed=$(( $(count Passed) + $(count 'Expectedly Failed') ))
lit_failed=$(( $(count Failed) + $(count 'Unexpectedly Passed') + $(count Unresolved) + $(count 'Timed Out') ))
lit_skipped=$(( $(count Unsupported) + $(count Skipped) ))

passed=$((lit_passed + ctest_passed)); failed=$((lit_failed + ctest_failed)); skipped=$((lit_skipped + ctest_skipped))
[ "$failed" -eq 0 ] || status=1
echo "== summary: lit $lit_passed passed, $lit_failed failed, $lit_skipped skipped;" \
     "ctest $ctest_passed passed, $ctest_failed failed, $ctest_skipped skipped"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
