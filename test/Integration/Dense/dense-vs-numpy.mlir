// Dense linalg (matmuls, batch and attention contractions, elementwise chains, softmax, layer norm) through
// moe-lower-to-llvm and the execution API, against numpy float64, with the dense strategy + BLAS, the dense
// strategy alone and plain loops, on 1 and 2 threads. The cases and inputs (tails, N = 1, ties, +-Inf, NaN)
// are in Inputs/check_dense.py.
// RUN: %moe_python %S/Inputs/check_dense.py %moe_obj_root | FileCheck %s
// CHECK-NOT: MISMATCH
// CHECK: matmul_512x256x192 blas threads=1: ok
// CHECK: layer_norm_128x1024 loops threads=2: ok
// CHECK: 0 mismatches
