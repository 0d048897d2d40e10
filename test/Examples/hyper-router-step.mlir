// examples/hyper_router_step.mlir as examples/README.md runs it: canonicalization folds moe.hyper_router into the
// router's constants (HyperRouter App. C.4), and the lowered module runs. Expected values by hand: the generated
// expert 0 is w2[0:3] · relu(w1 · emb + b1) = [0.85, 0.25, 0.3] with bias w2[3] · h = 0.085; token 3 (zeros) sees
// only the biases [0.085, 0.05, -0.085, 0.025]: experts 0 and 1, weights sigmoid(+-0.035); token 0 sees
// [0.935, -0.675, 0.135, 0.025]: experts 0 and 2, weights sigmoid(+-0.8); token 5 is token 0 again.
// RUN: moe-opt %moe_src_root/examples/hyper_router_step.mlir --canonicalize | FileCheck %s --check-prefix=FOLD
// RUN: moe-opt %moe_src_root/examples/hyper_router_step.mlir --moe-lower-to-llvm | \
// RUN:   mlir-runner -e main -entry-point-result=void -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils | \
// RUN:   FileCheck %s --check-prefix=EXEC

// FOLD-LABEL: func.func @route
// FOLD-NOT: moe.hyper_router
// FOLD: arith.constant dense<{{\[\[}}8.500000e-01, 2.500000e-01, 3.000000e-01], [-7.250000e-01, 0.330000043,
// FOLD: arith.constant dense<[8.500000e-02, 5.000000e-02, -8.500000e-02, 2.500000e-02]>
// FOLD: moe.topk_renorm %{{.*}} k(2)
// FOLD-NOT: moe.hyper_router
// FOLD: return

// EXEC: sizes = [6, 2]
// EXEC-NEXT: {{\[\[}}0.689974, 0.310026],
// EXEC-NEXT: [0.560945, 0.439055],
// EXEC-NEXT: [0.652489, 0.347511],
// EXEC-NEXT: [0.508749, 0.491251],
// EXEC-NEXT: [0.823465, 0.176535],
// EXEC-NEXT: [0.689974, 0.310026]]
// EXEC: sizes = [6, 2]
// EXEC-NEXT: {{\[\[}}0, 2],
// EXEC-NEXT: [3, 1],
// EXEC-NEXT: [2, 0],
// EXEC-NEXT: [0, 1],
// EXEC-NEXT: [2, 0],
// EXEC-NEXT: [0, 2]]
