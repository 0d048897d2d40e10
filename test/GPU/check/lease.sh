#!/usr/bin/env bash
# A whole GPU lease in one prepared call: the default check folder and the variant folders whose A/B decides an
# option, built here, compressed into .dev/ (a folder .git/info/exclude ignores: the four folders uncompressed pass the
# device call's 64 MiB), and one command there that runs them in the order of their worth within one 10-minute call.
#
#   test/GPU/check/lease.sh prepare     here (about 15 minutes on two cores): .dev/*.tar.xz, .whl/ (transformers)
#   run(command="bash test/GPU/check/lease.sh run", carry=[".dev", ".whl"], timeout_s=600)      there
#
# What comes back (8 files at most): machine.txt (with the Gemma4 test's output), one NAME.tgz a folder's run (its OUT:
# summary.md, summary.json, bench.md/json, logs.tar.gz, and run.log; ve.tgz also ve-cp's, the same folder's second
# run), and race.tgz with every racecheck run. Unpack them into bench/results/ for the record.
#
# The default folder's run and ve's end with the profile step (ncu over the bench's flash cases: stall reasons).
# VARIANTS: NAME|moe-lower-to-nvvm options|steps|bench --only|checks --only (sanitizers: the same cases)|chip (empty:
# sm_90; sm_90a: the Hopper-only instructions, whose cubins run on an H100 or H200 alike)|the folder of an earlier
# variant to run again instead of one of its own (empty: gc-NAME, built by prepare)|VAR=VALUE... for its run. In the
# order of their worth: the call runs them in turn, each cut to what is left. Every option named here is one the
# lease decides: the winner becomes the default and the loser is deleted with it.
# The three options left undecided (issue 80 item 4; bench/results/gpu-options-model-2026-11-29.md kept them by the
# performance model's prediction): va: flash-mma-grad (similarity_inform_grad on tensor cores) and flash-mma-tf32
# (3xTF32: f32 similarity_inform up to 64 features), whose kernels are not each other's (the f16/bf16 backward; the
# f32 forward): its bench's simgrad and f32 sim cases against the default folder's decide them. vc:
# flash-causal-balance=false, the grid's order, against the default's balanced order on the causal cases.
set -uo pipefail
VARIANTS=(
  "va|flash-mma-grad=true flash-mma-tf32=true|checks,memcheck,bench|sim|similarity_inform,similarity_inform_topk_mma,similarity_inform_grad,attention_posterior,attention_posterior_grad"
  "vc|flash-causal-balance=false|bench|causal|"
)
# Then racecheck, as far as the call's time goes: RACES: NAME|folder|cases|budget (empty: what is left). The
# variant kernels first (issue #47 item 1: memcheck and racecheck over every flash variant), then the default
# folder's kernels new since the last racecheck (2026-11-27: the route loop kernel, the lanes kernel's chunked keys,
# the split top-k's combine, every flash kernel's causal order).
RACES=(
  "race-va|gc-va|similarity_inform_grad,similarity_inform|100"
  "race|gpu-check|similarity_inform_topk_mma,route,similarity_inform_grad,similarity_inform|"
)
TRANSFORMERS=5.23.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"

prepare() {
  mkdir -p .git/info .dev .whl build
  for p in /.dev/ /.whl/; do grep -qx "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
  rm -f .dev/*.tar.xz
  MOE_GPU_CHECK_NO_SELFTEST=1 scripts/gpu-check.sh build/gpu-check
  tar cf - -C build gpu-check | xz -T0 -6 > .dev/gpu-check.tar.xz
  local v name opts chip reuse
  for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name opts _ _ _ chip reuse _ <<<"$v"
    [ -z "$reuse" ] || continue
    MOE_GPU_CHECK_NO_SELFTEST=1 MOE_GPU_CHECK_TORCH_OPS=0 MOE_GPU_AOT_OPTIONS="$opts" MOE_GPU_CHIP="${chip:-sm_90}" \
      scripts/gpu-check.sh "build/gc-$name"
    tar cf - -C build "gc-$name" | xz -T0 -6 > ".dev/gc-$name.tar.xz"
  done
  ls .whl/transformers-$TRANSFORMERS-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d .whl "transformers==$TRANSFORMERS"
  du -shc .dev .whl
  echo 'lease: run(command="bash test/GPU/check/lease.sh run", carry=[".dev", ".whl"], timeout_s=600)'
}

run() {
  # W: the scratch folder (the build folders, the results before they are packed, the wheel's install).
  local W="${MOE_LEASE_TMP:-/tmp}" T0
  local O="${OUT:-$W/lease-out}"
  mkdir -p "$O"
  T0=$(date +%s)
  el() { echo $(($(date +%s) - T0)); }
  export PYTHONUNBUFFERED=1 MOE_REPO="$ROOT"
  for t in .dev/*.tar.xz; do tar xJf "$t" -C build; done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" .whl/*.whl &&
    export PYTHONPATH="$W/site"
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > "$O/machine.txt" 2>&1
  # go NAME FOLDER BUILD BUDGET STEPS [VAR=VALUE...]: BUDGET (empty: all that is left) cut to what is left of the
  # call's 545 s, less 25 for packing and the step's overrun; not run (status 1) with less than 40 s. Its results go
  # to OUT as NAME.tgz, or with PACK set as PACK.tgz beside the earlier runs of that PACK (the racecheck runs: one
  # file, within the call's 8).
  local PACK="" PACKED=()
  go() {
    local n=$1 f=$2 b=$3 budget=$4 steps=$5 left
    shift 5
    left=$((545 - $(el) - 25))
    [ -z "$budget" ] || [ "$budget" -gt "$left" ] && budget=$left
    if [ "$budget" -lt 40 ]; then echo "== $n not run: $left s left"; return 1; fi
    echo "== $n at $(el) s"
    env "$@" MOE_GPU_CHECK_STEPS="$steps" MOE_GPU_CHECK_BUDGET_S="$budget" MOE_GPU_CHECK_BUILD="$b" \
      timeout $((budget + 30)) bash "$f/run.sh" "$W/o-$n" > "$W/o-$n.log" 2>&1
    echo "rc=$? at $(el) s"
    grep '|' "$W/o-$n.log" | tail -20
    cp "$W/o-$n.log" "$W/o-$n/run.log" 2>/dev/null
    if [ -n "$PACK" ]; then
      PACKED+=("o-$n")
      tar czf "$O/$PACK.tgz" -C "$W" "${PACKED[@]}"
    else
      tar czf "$O/$n.tgz" -C "$W" "o-$n"
    fi
  }
  go def build/gpu-check "$W/b1" 250 checks,torch-ops,memcheck,bench,profile
  # Gemma4 (issue #48 item 1) on CUDA tensors, with the default folder's extension and kernels.
  echo "== gemma4 at $(el) s"
  MOE_TEST_DEVICE=cuda MOE_GPU_RUNTIME_DIR="$W/b1" MOE_TORCH_LIB="$W/b1/lib/libmoe_torch.so" \
    MOE_CUDA_RUNTIME="$W/b1/libmoe_cuda_runtime.so" MOE_KERNEL_PREBUILT="$ROOT/build/gpu-check/kernels" \
    MOE_KEYS_LIBRARY="$ROOT/build/gpu-check/lib/libmoe_keys.so" MOE_KERNEL_CACHE="$W/kc" \
    PYTHONPATH="$ROOT:$ROOT/python:$W/site" timeout 90 python3 -m pytest -q -p no:cacheprovider -rs \
    python/tests/test_hf_models.py -k gemma4 > "$W/gemma4.log" 2>&1
  echo "rc=$? at $(el) s"
  { echo "== the Gemma4 test on CUDA"; cat "$W/gemma4.log"; } >> "$O/machine.txt"
  local v name opts steps bench cases folder budget reuse extra
  for v in "${VARIANTS[@]}"; do
    IFS="|" read -r name opts steps bench cases _ reuse extra <<<"$v"
    folder=${reuse:-gc-$name}
    local env=(MOE_GPU_BENCH_ARGS="--only $bench --no-compile --reps 50")
    [ -n "$cases" ] && env+=(MOE_GPU_CHECK_ONLY="--only $cases" MOE_GPU_CHECK_SANITIZE_ONLY="--only $cases")
    # shellcheck disable=SC2206 # VAR=VALUE words
    [ -n "$extra" ] && env+=($extra)
    # A run of an earlier variant's folder is packed beside that variant's (NAME.tgz of the folder's variant: the
    # call's 8 files).
    [ -n "$reuse" ] && PACK=${reuse#gc-} PACKED=("o-${reuse#gc-}")
    go "$name" "build/$folder" "$W/b-${folder#gc-}" $([ "$steps" = bench ] && echo 45 || echo 130) "$steps" \
      "${env[@]}"
    PACK="" PACKED=()
  done
  PACK=race
  for v in "${RACES[@]}"; do
    IFS='|' read -r name folder cases budget <<<"$v"
    local b="$W/b1"
    [ "$folder" = gpu-check ] || b="$W/b-${folder#gc-}"
    go "$name" "build/$folder" "$b" "$budget" racecheck MOE_GPU_CHECK_SANITIZE_ONLY="--only $cases" || break
  done
  echo "== done at $(el) s"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
