// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" | FileCheck %s --check-prefixes=CHECK,SM90
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_80 format=isa" | FileCheck %s --check-prefixes=CHECK,SM80
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVMIR

// The whole GPU path without a GPU: kernels to NVVM and PTX in a gpu.binary,
// host code to the LLVM dialect with the mgpu* runtime calls and C-interface
// wrappers, then LLVM IR that loads the module (JIT'd PTX for format=isa).

// SM90: gpu.binary @moe_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_90", features = "+ptx80">
// SM90-SAME: assembly = "{{.*}}.target sm_90{{.*}}.visible .entry similarity_inform_topk_0{{.*}}bar.sync{{.*}}.visible .entry topk_renorm_warp_0{{.*}}shfl.sync.bfly
// SM80: gpu.binary @moe_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_80", features = "+ptx80">
// SM80-SAME: assembly = "{{.*}}.target sm_80
// CHECK-NOT: gpu.module
// CHECK-LABEL: llvm.func @gate(
// CHECK: llvm.call @mgpuStreamCreate()
// CHECK: llvm.call @mgpuMemAlloc(
// CHECK: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@similarity_inform_topk_0
// CHECK: llvm.call @mgpuMemAlloc(
// CHECK: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@topk_renorm_warp_0
// CHECK: llvm.call @mgpuStreamSynchronize(
// CHECK: llvm.call @mgpuStreamDestroy(
// CHECK: llvm.func @_mlir_ciface_gate(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes {llvm.emit_c_interface}

// LLVMIR-DAG: declare ptr @mgpuStreamCreate()
// LLVMIR-DAG: declare ptr @mgpuMemAlloc(i64, ptr, i8)
// LLVMIR-DAG: declare void @mgpuLaunchKernel(ptr, i64, i64, i64, i64, i64, i64, i32, ptr, ptr, ptr, i64)
// LLVMIR-DAG: declare ptr @mgpuModuleLoadJIT(ptr, i32)
// LLVMIR-DAG: declare ptr @mgpuModuleGetFunction(ptr, ptr)
// LLVMIR-DAG: declare void @mgpuModuleUnload(ptr)
// LLVMIR-DAG: define void @_mlir_ciface_gate(

func.func @gate(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>, %logits: tensor<?x16xbf16>)
    -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  %w2, %i2 = moe.topk_renorm %logits k(2) : tensor<?x16xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i, %w2, %i2 : tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?x2xf32>, tensor<?x2xi32>
}
