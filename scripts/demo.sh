#!/usr/bin/env bash
# The demo: (1-2) a HyperRouter routing step written in the moe dialect: the hypernetwork folds at compile time and
# the top-2 gate runs on the CPU through moe-lower-to-llvm and mlir-runner; (3) HF's Qwen3MoeSparseMoeBlock through
# torch.compile(backend="moe") (routing raised, inductor), checked and timed against eager and inductor, then a
# Similarity-Inform SMoE block imported whole, compiled for the CPU by moe-opt, checked and timed against eager.
source "$(dirname "$0")/common.sh"

example="$ROOT/examples/hyper_router_step.mlir"
echo "== 1. after canonicalization: moe.hyper_router has folded into constants (HyperRouter App. C.4)"
"$BUILD/bin/moe-opt" "$example" --canonicalize | sed -n '/func.func @route/,/return/p'
echo "== 2. compiled for the CPU and run: gate weights, then expert indices"
"$BUILD/bin/moe-opt" "$example" --moe-lower-to-llvm |
  "$LLVM_PREFIX/bin/mlir-runner" -e main -entry-point-result=void \
    -shared-libs="$LLVM_PREFIX/lib/libmlir_c_runner_utils.so,$LLVM_PREFIX/lib/libmlir_runner_utils.so"
echo "== 3. PyTorch models: an HF Qwen3-MoE block through torch.compile(backend=\"moe\"), then a Similarity-Inform block through the whole-graph path"
MOE_BUILD_DIR="$BUILD" "$VENV/bin/python" -m moe_mlir.demo
