#!/usr/bin/env bash
# The demo (run by scripts/setup.sh): (1-2) a HyperRouter routing step written in the moe dialect: the hypernetwork
# folds at compile time and the top-2 gate runs on the CPU through moe-lower-to-llvm and mlir-runner; (3) the CPU
# kernels of the common configurations are built into the kernel cache (moe_mlir.runtime.prebuild: the first call of
# those torch.ops.moe.* in any later process loads them instead of compiling); (4) python -m moe_mlir.demo: a
# DeepSeek-V3 router and a training step of a seed router through torch.compile(backend="moe"), and the whole-graph
# path, each checked and timed against eager and inductor in the same run; the compile times of the first two in
# fresh processes per backend, cold (empty caches of its own) and warm (moe_mlir.demo.compare_compiles).
source "$(dirname "$0")/common.sh"

example="$ROOT/examples/hyper_router_step.mlir"
echo "== 1. after canonicalization: moe.hyper_router has folded into constants (HyperRouter App. C.4)"
"$BUILD/bin/moe-opt" "$example" --canonicalize | sed -n '/func.func @route/,/return/p'
echo "== 2. compiled for the CPU and run: gate weights, then expert indices"
"$BUILD/bin/moe-opt" "$example" --moe-lower-to-llvm |
  "$LLVM_PREFIX/bin/mlir-runner" -e main -entry-point-result=void \
    -shared-libs="$LLVM_PREFIX/lib/libmlir_c_runner_utils.so,$LLVM_PREFIX/lib/libmlir_runner_utils.so"
echo "== 3. the CPU kernels of the common configurations, built once into the kernel cache"
MOE_BUILD_DIR="$BUILD" "$VENV/bin/python" -m moe_mlir.runtime.prebuild --cpu
echo "== 4. PyTorch: torch.compile(backend=\"moe\") on a DeepSeek-V3 router and a router's training step, then the whole-graph path"
MOE_BUILD_DIR="$BUILD" "$VENV/bin/python" -m moe_mlir.demo
