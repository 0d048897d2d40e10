// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=256" | FileCheck %s --check-prefixes=CHECK,V3
// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=512" | FileCheck %s --check-prefixes=CHECK,V4
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v3" | mlir-translate --mlir-to-llvmir | llc -O3 \
// RUN:   | FileCheck %s --check-prefix=ASM-V3
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v4" | mlir-translate --mlir-to-llvmir | llc -O3 \
// RUN:   | FileCheck %s --check-prefix=ASM-V4

// adjacency_update's kernel picks its strategy by E, k and the target's vector width (AdjacencyUpdate.cpp,
// chooseAdjacencyStrategy; V3 = AVX2, 8 i32 lanes; V4 = AVX-512, 16):
// - histogram (E <= 8; E <= 12 from 2^E tokens on): each token's in-range experts are one i64 bitmask, the workers
//   count masks into 2^E bins, the bins are expanded into C[j, m] at the end;
// - mask rows (E <= 64, k >= 2 or one vector per row): per token, row j of the worker's counts (padded to whole
//   vectors) gets the mask as 0/1 i32 lanes for each set bit j (ctpop/cttz): plain vector loads and stores of the
//   target's width, a variable shift (vpsrlvd, AVX2 has it) to spread the bits; no gather, scatter or masked ops;
// - counting (the rest): each token's slots deduplicated with stamps, one scalar increment per ordered pair.
// Every strategy starts with the reported index check and ends with the sum over the workers and the portable
// O(E²) tail.

// E = 8, k = 2: the histogram on both targets.
// CHECK-LABEL: func.func @hist
// CHECK-SAME: %[[A:[^:]+]]: tensor<8x8xf32>
// CHECK: func.call @moeReportIndexError
// The counts C are the kernel's out.
// CHECK: %[[CK:.+]] = moe.kernel ins(%{{.+}} : tensor<?x{{[0-9?]+}}xi32>) outs(%{{.+}} : tensor<8x8xi32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<?x{{[0-9?]+}}xi32>, %[[C:[^:]+]]: memref<8x8xi32>):
// CHECK: %[[HIST:.+]] = memref.alloc() {alignment = 64 : i64} : memref<2x256xi32>
// CHECK-NOT: vector.
// Up to 65536 (token, slot) pairs (T = 16384 here) the calling thread counts alone: starting the workers and
// summing their buffers cost more (0.02 ms on one thread, 0.04-0.09 ms on two).
// CHECK: %[[PAIRS:.+]] = arith.muli %{{.+}}, %{{.+}} : index
// CHECK: %[[SMALL:.+]] = arith.cmpi ule, %[[PAIRS]], %c65536 : index
// CHECK: scf.if %[[SMALL]] {
// CHECK: } else {
// CHECK: scf.parallel
// CHECK: arith.shli %{{.+}}, %{{.+}} : i64
// CHECK: arith.ori %{{.+}}, %{{.+}} : i64
// CHECK: %[[BIN:.+]] = arith.index_cast %{{.+}} : i64 to index
// CHECK: memref.load %[[HIST]][%{{.+}}, %[[BIN]]]
// CHECK: memref.store %{{.+}}, %[[HIST]][%{{.+}}, %[[BIN]]]
// CHECK: scf.reduce
// The expansion: every bin with a count adds it to C[j, m] for its bit pairs.
// CHECK: scf.for %{{.+}} = %{{.+}} to %c256
// CHECK: memref.store %{{.+}}, %[[C]]
// CHECK: } -> tensor<8x8xi32>
// CHECK-NOT: linalg.matmul
// CHECK: linalg.generic {{.*}} ins(%[[A]], %[[CK]], %{{.+}} :
// CHECK-NOT: moe.adjacency_update
func.func @hist(%a: tensor<8x8xf32>, %idx: tensor<?x2xi32>) -> tensor<8x8xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<8x8xf32>, tensor<?x2xi32> -> tensor<8x8xf32>
  return %n : tensor<8x8xf32>
}

// E = 64, k = 8 (the prefill case of the benchmark): mask rows, 8 ymm or 4 zmm row adds per set bit.
// CHECK-LABEL: func.func @rows
// CHECK: func.call @moeReportIndexError
// The counts C are the kernel's out.
// CHECK: %[[CK:.+]] = moe.kernel ins(%{{.+}} : tensor<?x{{[0-9?]+}}xi32>) outs(%{{.+}} : tensor<64x64xi32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<?x{{[0-9?]+}}xi32>, %[[C:[^:]+]]: memref<64x64xi32>):
// CHECK: %[[CNT:.+]] = memref.alloc() {alignment = 64 : i64} : memref<2x64x64xi32>
// CHECK: scf.parallel
// V3: %[[B0:.+]] = vector.broadcast %{{.+}} : i32 to vector<8xi32>
// V3: arith.shrui %[[B0]], %{{.+}} : vector<8xi32>
// V4: %[[B0:.+]] = vector.broadcast %{{.+}} : i32 to vector<16xi32>
// V4: arith.shrui %[[B0]], %{{.+}} : vector<16xi32>
// CHECK: %[[N:.+]] = math.ctpop %{{.+}} : i64
// CHECK: scf.for {{.*}} iter_args(%[[M:.+]] = %{{.+}}) -> (i64)
// CHECK: math.cttz %[[M]] : i64
// V3-COUNT-8: vector.store %{{.+}}, %{{.+}} : memref<64x64xi32, strided<[64, 1], offset: ?>>, vector<8xi32>
// V4-COUNT-4: vector.store %{{.+}}, %{{.+}} : memref<64x64xi32, strided<[64, 1], offset: ?>>, vector<16xi32>
// CHECK-NOT: vector.store
// CHECK: scf.yield
// CHECK: scf.reduce
// CHECK: memref.load %[[CNT]]
// CHECK: memref.store %{{.+}}, %[[C]]
// CHECK: } -> tensor<64x64xi32>
func.func @rows(%a: tensor<64x64xf32>, %idx: tensor<?x8xi32>) -> tensor<64x64xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<64x64xf32>, tensor<?x8xi32> -> tensor<64x64xf32>
  return %n : tensor<64x64xf32>
}

// E = 24 (not a multiple of the lanes), i64 indices: rows padded to 24 (3 x 8) or 32 (2 x 16) lanes.
// CHECK-LABEL: func.func @ragged
// V3: memref.alloc() {alignment = 64 : i64} : memref<2x24x24xi32>
// V3-COUNT-3: vector.store %{{.+}} : memref<24x24xi32, strided<[24, 1], offset: ?>>, vector<8xi32>
// V4: memref.alloc() {alignment = 64 : i64} : memref<2x24x32xi32>
// V4-COUNT-2: vector.store %{{.+}} : memref<24x32xi32, strided<[32, 1], offset: ?>>, vector<16xi32>
func.func @ragged(%a: tensor<24x24xf32>, %idx: tensor<?x4xi64>) -> tensor<24x24xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<24x24xf32>, tensor<?x4xi64> -> tensor<24x24xf32>
  return %n : tensor<24x24xf32>
}

// E = 12: the histogram (4096 bins) from 4096 tokens on, mask rows below.
// CHECK-LABEL: func.func @mid
// CHECK: %[[MANY:.+]] = arith.cmpi sge, %{{.+}}, %c4096 : index
// CHECK: scf.if %[[MANY]] {
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x4096xi32>
// CHECK-NOT: vector.
// CHECK: } else {
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x12x16xi32>
// V3-COUNT-2: vector.store %{{.+}} : memref<12x16xi32, strided<[16, 1], offset: ?>>, vector<8xi32>
// V4: vector.store %{{.+}} : memref<12x16xi32, strided<[16, 1], offset: ?>>, vector<16xi32>
func.func @mid(%a: tensor<12x12xf32>, %idx: tensor<?x2xi32>) -> tensor<12x12xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<12x12xf32>, tensor<?x2xi32> -> tensor<12x12xf32>
  return %n : tensor<12x12xf32>
}

// E = 16, k = 1: one vector per row on AVX-512 (rows), two on AVX2, where a single scalar increment per token
// (counting) is cheaper.
// CHECK-LABEL: func.func @k1
// V3: memref.alloc() {alignment = 64 : i64} : memref<2x16x16xi32>
// V3: memref.alloc() {alignment = 64 : i64} : memref<2x16xindex>
// V3-NOT: math.ctpop
// V4: memref.alloc() {alignment = 64 : i64} : memref<2x16x16xi32>
// V4-NOT: memref<2x16xindex>
// V4: math.ctpop
// V4: vector.store %{{.+}} : memref<16x16xi32, strided<[16, 1], offset: ?>>, vector<16xi32>
// CHECK: return
func.func @k1(%a: tensor<16x16xf32>, %idx: tensor<?x1xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<?x1xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}

// E = 256: counting on both targets (stamps, lists of distinct experts, one increment per pair).
// CHECK-LABEL: func.func @count
// The counts C are the kernel's out.
// CHECK: %[[CK:.+]] = moe.kernel ins(%{{.+}} : tensor<?x{{[0-9?]+}}xi32>) outs(%{{.+}} : tensor<256x256xi32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<?x{{[0-9?]+}}xi32>, %[[C:[^:]+]]: memref<256x256xi32>):
// CHECK: %[[COUNTS:.+]] = memref.alloc() {alignment = 64 : i64} : memref<2x256x256xi32>
// CHECK: %[[STAMPS:.+]] = memref.alloc() {alignment = 64 : i64} : memref<2x256xindex>
// CHECK: %[[LISTS:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<2x?xindex>
// CHECK-NOT: vector.
// CHECK: scf.parallel
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (index)
// CHECK: arith.cmpi ne
// CHECK: scf.for
// CHECK: scf.for
// CHECK: arith.addi %{{.+}}, %{{.+}} : i32
// CHECK: memref.store
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (i32)
// CHECK: memref.load %[[COUNTS]]
// CHECK: memref.store %{{.+}}, %[[C]]
func.func @count(%a: tensor<256x256xf32>, %idx: tensor<?x8xi32>) -> tensor<256x256xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<256x256xf32>, tensor<?x8xi32> -> tensor<256x256xf32>
  return %n : tensor<256x256xf32>
}

// k unknown at compile time: the mask reads the slots in a loop (histogram for E = 8).
// CHECK-LABEL: func.func @dyn_k
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x256xi32>
// CHECK: scf.parallel
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (i64)
// CHECK: arith.ori %{{.+}}, %{{.+}} : i64
// CHECK: scf.reduce
func.func @dyn_k(%a: tensor<8x8xf32>, %idx: tensor<?x?xi32>) -> tensor<8x8xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<8x8xf32>, tensor<?x?xi32> -> tensor<8x8xf32>
  return %n : tensor<8x8xf32>
}

// Dynamic E: counting on one worker.
// CHECK-LABEL: func.func @dyn
// CHECK: memref.alloc(%{{.+}}, %{{.+}}) {alignment = 64 : i64} : memref<1x?x?xi32>
// CHECK-NOT: scf.parallel
// CHECK: return
func.func @dyn(%a: tensor<?x?xf32>, %idx: tensor<?x2xi32>) -> tensor<?x?xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<?x?xf32>, tensor<?x2xi32> -> tensor<?x?xf32>
  return %n : tensor<?x?xf32>
}

// The machine code: AVX2 code stays in ymm registers (no zmm), with no gather, scatter or masked move; the row
// adds are vpaddd, the bit spread vpsrlvd, the bit loop popcnt/tzcnt. AVX-512: zmm row adds.
// ASM-V3-LABEL: rows:
// ASM-V3-NOT: zmm
// ASM-V3-NOT: gather
// ASM-V3-NOT: scatter
// ASM-V3-NOT: maskmov
// ASM-V3: vpsrlvd {{.*}}%ymm
// ASM-V3: popcnt
// ASM-V3: tzcnt
// ASM-V3: vpaddd {{.*}}%ymm
// ASM-V3-NOT: zmm
// ASM-V3-NOT: gather
// ASM-V3-NOT: scatter
// ASM-V3-NOT: maskmov
// ASM-V3: .Lfunc_end
// ASM-V3-LABEL: ragged:
// ASM-V3-NOT: zmm
// ASM-V3-NOT: maskmov
// ASM-V3: vpaddd {{.*}}%ymm
// ASM-V3-NOT: zmm
// ASM-V3-NOT: maskmov
// ASM-V3: .Lfunc_end
// ASM-V4-LABEL: rows:
// ASM-V4: vpsrlvd {{.*}}%zmm
// ASM-V4: vpaddd {{.*}}%zmm
// ASM-V4: .Lfunc_end
