#!/usr/bin/env bash
# The GPU check (see gpu_check.py beside this script and README.md): on a machine with an NVIDIA GPU, PyTorch,
# cmake and the CUDA toolkit (no LLVM): builds the host side, checks every kernel against PyTorch CUDA (also
# through the PTX fallback and under compute-sanitizer memcheck/racecheck), runs the torch-op CUDA tests and the
# benchmark, and writes summary.md/summary.json/bench.*/logs.tar.gz into OUT.
#
#   bash run.sh [OUT]        (else $OUT, else ./gpu-check-results)
# Exit status: 0 passed, 1 a step failed, 77 skipped (no GPU) or partly not run.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${MOE_PYTHON:-$(command -v python3)}"
export MOE_PYTHON="$PY"
exec "$PY" "$HERE/gpu_check.py" "$@"
