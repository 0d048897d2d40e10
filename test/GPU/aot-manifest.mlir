// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t/fb %t/nofb
// RUN: %python %moe_src_root/tools/moe-aot/moe-aot.py %s -o %t/fb --name small --moe-opt %moe_obj_root/bin/moe-opt --toolkit %cuda_toolkit --ptx-fallback --drop-intermediates
// RUN: %python %S/check_artifacts.py %t/fb/small.manifest.json --require-ptx | FileCheck %s
// RUN: not ls %t/fb/small.ll %t/fb/small.llvm.mlir
// Without --ptx-fallback the check that requires one fails.
// RUN: %python %moe_src_root/tools/moe-aot/moe-aot.py %s -o %t/nofb --name small --moe-opt %moe_obj_root/bin/moe-opt --toolkit %cuda_toolkit
// RUN: ls %t/nofb/small.ll %t/nofb/small.llvm.mlir
// RUN: not %python %S/check_artifacts.py %t/nofb/small.manifest.json --require-ptx | FileCheck %s --check-prefix=NOFB
// With --ptx-fallback moe-aot lowers to PTX once and assembles the binary itself: the same binaries (sizes,
// FNV-1a keys, fatbinary entries) as the pipeline's own format=fatbin above.
// RUN: %python -c "import json, sys; b = [json.load(open(p))['binaries'] for p in sys.argv[1:]]; print(b[0] == b[1] and b[0] != [])" %t/fb/small.manifest.json %t/nofb/small.manifest.json | FileCheck %s --check-prefix=SAME
// A PTX file that does not match its sha256 is caught.
// RUN: echo "// edited" >> %t/fb/small-ptx/*.ptx
// RUN: not %python %S/check_artifacts.py %t/fb/small.manifest.json --require-ptx | FileCheck %s --check-prefix=EDITED

// The artifacts of tools/moe-aot/moe-aot.py name their toolkit and carry an
// uncompressed PTX fallback (PTX ISA 8.0, read by CUDA 12.0+ drivers) under
// the key libmoe_cuda_runtime computes from the embedded fatbinary.

// CHECK: ok: toolkit ptxas {{[0-9]+\.[0-9]+}}
// CHECK-SAME: the binary needs a CUDA {{[0-9]+\.[0-9]+}} driver
// CHECK: ok: moe_kernels_binary: {{[0-9]+}} bytes, key [[KEY:[0-9a-f]{16}]] recomputed from the object, entries [('cubin', 90), ('ptx', 90)]
// CHECK: ok: moe_kernels_binary: PTX fallback small-ptx/moe-[[KEY]].ptx (ISA 8.0, sm_90, needs a CUDA 12.0 driver)
// CHECK-NOT: error

// NOFB: error: moe_kernels_binary: no PTX fallback

// SAME: True

// EDITED: error: small-ptx/moe-{{[0-9a-f]+}}.ptx does not match its sha256

func.func @topk(%s: tensor<64x16xf32>) -> (tensor<64x2xf32>, tensor<64x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<64x16xf32> -> tensor<64x2xf32>, tensor<64x2xi32>
  return %w, %i : tensor<64x2xf32>, tensor<64x2xi32>
}
