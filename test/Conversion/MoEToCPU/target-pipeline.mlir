// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v3" | FileCheck %s --check-prefix=V3
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v4" | FileCheck %s --check-prefix=V4
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v3" | mlir-translate --mlir-to-llvmir | llc -O3 \
// RUN:   | FileCheck %s --check-prefix=ASM-V3
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v4" | mlir-translate --mlir-to-llvmir | llc -O3 \
// RUN:   | FileCheck %s --check-prefix=ASM-V4
// RUN: not moe-opt %s --moe-lower-to-llvm="target-cpu=pentium9" 2>&1 | FileCheck %s --check-prefix=BAD

// moe-lower-to-llvm target-cpu: the kernels' vector width follows the CPU (x86-64-v3: AVX2, 8 lanes; x86-64-v4:
// AVX-512, 16 lanes) and every function carries the CPU, so that the JIT (or llc/clang) compiles for it whatever
// the host is. mad_dispersion's token loops must compile to plain vector loads and stores on AVX2: no
// VMASKMOVPS (microcoded stores that also defeat store forwarding), no gather or scatter.

// BAD: error: moe-lower-to-llvm: unknown target-cpu 'pentium9'

// V3-LABEL: llvm.func @mad(
// V3-SAME: target_cpu = "x86-64-v3"
// V3-SAME: target_features = #llvm.target_features<[{{.*}}"+avx2"{{.*}}"+fma"
// V3-NOT: avx512
// V3: llvm.load {{.*}} -> vector<8xf32>
// V3: llvm.store {{.*}} : vector<8xf32>, !llvm.ptr
// V3-NOT: llvm.intr.masked.store
// V3-NOT: llvm.intr.masked.gather
// V3-NOT: llvm.intr.masked.scatter
// V3: llvm.return
// V4-LABEL: llvm.func @mad(
// V4-SAME: target_cpu = "x86-64-v4"
// V4-SAME: "+avx512f"
// V4: llvm.load {{.*}} -> vector<16xf32>

// ASM-V3-LABEL: mad:
// ASM-V3-NOT: zmm
// ASM-V3-NOT: vmaskmov
// ASM-V3-NOT: gather
// ASM-V3-NOT: scatter
// ASM-V3: vaddps {{.*}}%ymm
// ASM-V3: .Lfunc_end
// ASM-V4-LABEL: mad:
// ASM-V4: vaddps {{.*}}%zmm
// ASM-V4: .Lfunc_end
func.func @mad(%x: tensor<?x256xf32>, %a: tensor<?xi32>) -> (tensor<8x256xf32>, tensor<8xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(8) : tensor<?x256xf32>, tensor<?xi32> -> tensor<8x256xf32>, tensor<8xi32>
  return %w, %c : tensor<8x256xf32>, tensor<8xi32>
}

// ASM-V3-LABEL: topk:
// ASM-V3-NOT: zmm
// ASM-V3-NOT: gather
// ASM-V3-NOT: scatter
// ASM-V3: .Lfunc_end
func.func @topk(%s: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// Top-k over K = 64 on AVX2: ymm signed i32 max (vpmaxsd) and compare (vpcmpeqd), no i64 compare-and-blend
// (vpcmpgtq: the i64 candidates of before), no masked store (a whole-vector knockout store would become one), no
// zmm.
// ASM-V3-LABEL: topk_wide:
// ASM-V3-NOT: zmm
// ASM-V3-NOT: vpcmpgtq
// ASM-V3-NOT: vpmaskmov
// ASM-V3-NOT: vmaskmov
// ASM-V3: vpmaxsd {{.*}}%ymm
// ASM-V3-NOT: zmm
// ASM-V3-NOT: vpcmpgtq
// ASM-V3-NOT: vpmaskmov
// ASM-V3: vpcmpeqd {{.*}}%ymm
// ASM-V3-NOT: zmm
// ASM-V3-NOT: vpcmpgtq
// ASM-V3: .Lfunc_end
// ASM-V4-LABEL: topk_wide:
// ASM-V4: vpmaxsd {{.*}}%zmm
// ASM-V4: .Lfunc_end
func.func @topk_wide(%s: tensor<?x64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
