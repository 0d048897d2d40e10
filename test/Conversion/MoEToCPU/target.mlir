// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=256" | FileCheck %s --check-prefixes=CHECK,AVX2
// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=512" | FileCheck %s --check-prefixes=CHECK,AVX512
// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2" | FileCheck %s --check-prefixes=CHECK,AVX512
// RUN: not moe-opt %s --convert-moe-to-cpu="vector-bits=384" 2>&1 | FileCheck %s --check-prefix=BAD-BITS

// The kernels' vectors are one register of the target: 8 f32 lanes (4 i64) for AVX2, 16 (8 i64) for AVX-512,
// and the strategy is the same on both: no gathers or scatters, no masked stores in read-modify-write loops over
// whole vectors, small-K top-k one row per lane, larger K on i32 keys (no i64 max, which AVX2 lacks). A change
// that brings back an AVX-512-only path (16-lane vectors on an AVX2 target, masked stores in mad_dispersion's
// token loops, i64 top-k candidates) fails here without the hardware; target-pipeline.mlir checks the machine code.

// BAD-BITS: convert-moe-to-cpu: vector-bits must be 128, 256 or 512, got 384

// mad_dispersion, D a multiple of the block: plain loads and stores only, also when zeroing. The block is 32
// features (128 bytes) on both targets, so a token's step adds 4 vectors on AVX2 and 2 on AVX-512: with 2 AVX2
// vectors (16 features) AVX2 ran twice the steps and took 1.6x the AVX-512 time (issue #16). Rows 256 bytes
// apart: no prefetch.
// CHECK-LABEL: func.func @mad_static
// CHECK: scf.parallel
// CHECK: arith.muli %{{.+}}, %c32 : index
// CHECK-NOT: memref.prefetch
// AVX2-COUNT-4: arith.addf %{{.+}}, %{{.+}} : vector<8xf32>
// AVX2-NOT: arith.addf
// AVX2: arith.divf
// AVX512-COUNT-2: arith.addf %{{.+}}, %{{.+}} : vector<16xf32>
// AVX512-NOT: arith.addf
// AVX512: arith.divf
// CHECK-NOT: memref.prefetch
// CHECK: math.absf
// CHECK-NOT: vector.maskedstore
// CHECK-NOT: vector.maskedload
// CHECK-NOT: vector.gather
// CHECK-NOT: vector.scatter
// CHECK: return
func.func @mad_static(%x: tensor<?x64xf32>, %a: tensor<?xi32>) -> (tensor<8x64xf32>, tensor<8xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(8) : tensor<?x64xf32>, tensor<?xi32> -> tensor<8x64xf32>, tensor<8xi32>
  return %w, %c : tensor<8x64xf32>, tensor<8xi32>
}

// Rows a page apart (D = 1024): each scatter pass prefetches the block (its two 64-byte lines) of the token 16
// steps ahead (a new page every step, which no hardware prefetcher crosses).
// CHECK-LABEL: func.func @mad_wide
// CHECK: scf.parallel
// CHECK: scf.for %[[T:.+]] = %c0 to %{{.+}} step %c1 {
// CHECK: %[[AHEAD:.+]] = arith.addi %[[T]], %c16 : index
// CHECK: %[[CLAMP:.+]] = arith.minsi %[[AHEAD]], %{{.+}} : index
// CHECK: memref.prefetch %{{.+}}[%[[CLAMP]], %{{.+}}], read, locality<3>, data : memref<?x1024xf32>
// CHECK: memref.prefetch %{{.+}}[%[[CLAMP]], %{{.+}}], read, locality<3>, data : memref<?x1024xf32>
// CHECK-NOT: memref.prefetch
// CHECK: scf.if
// CHECK: arith.divf
// CHECK: memref.prefetch
// CHECK: memref.prefetch
// CHECK-NOT: memref.prefetch
// CHECK: math.absf
// CHECK: return
func.func @mad_wide(%x: tensor<?x1024xf32>, %a: tensor<?xi32>) -> (tensor<8x1024xf32>, tensor<8xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(8) : tensor<?x1024xf32>, tensor<?xi32> -> tensor<8x1024xf32>, tensor<8xi32>
  return %w, %c : tensor<8x1024xf32>, tensor<8xi32>
}

// A dynamic D: whole blocks take the branch of plain loads and stores, the ragged block the masked one.
// CHECK-LABEL: func.func @mad_dynamic
// CHECK: scf.parallel
// CHECK: %[[FULL:.+]] = arith.cmpi sle
// CHECK: scf.if %[[FULL]] {
// AVX2: vector.load {{.*}} : memref<?x?xf32>, vector<8xf32>
// AVX2: vector.store {{.*}} : memref<4x?xf32>, vector<8xf32>
// AVX512: vector.load {{.*}} : memref<?x?xf32>, vector<16xf32>
// AVX512: vector.store {{.*}} : memref<4x?xf32>, vector<16xf32>
// CHECK-NOT: vector.masked
// CHECK: } else {
// CHECK: vector.maskedload
// CHECK: vector.maskedstore
func.func @mad_dynamic(%x: tensor<?x?xf32>, %a: tensor<?xi32>) -> (tensor<4x?xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<?x?xf32>, tensor<?xi32> -> tensor<4x?xf32>, tensor<4xi32>
  return %w, %c : tensor<4x?xf32>, tensor<4xi32>
}

// topk_renorm, K = 8: a block of lanes rows loaded as 8 row-major vectors, transposed by three unzip rounds of
// shuffles (even, odd elements), k = 2 insertion slots per lane, zipped back (interleave) and stored whole.
// CHECK-LABEL: func.func @topk_small
// CHECK: memref.collapse_shape {{.*}} into memref<?xf32>
// CHECK: scf.parallel
// AVX2: vector.load {{.*}} : memref<?xf32>, vector<8xf32>
// AVX2: vector.shuffle {{.*}} [0, 2, 4, 6, 8, 10, 12, 14] : vector<8xf32>, vector<8xf32>
// AVX2: vector.shuffle {{.*}} [1, 3, 5, 7, 9, 11, 13, 15] : vector<8xf32>, vector<8xf32>
// AVX2: arith.cmpi sgt, %{{.+}}, %{{.+}} : vector<8xi32>
// AVX2: vector.shuffle {{.*}} [0, 8, 1, 9, 2, 10, 3, 11] : vector<8xf32>, vector<8xf32>
// AVX2: vector.store {{.*}} : memref<?xf32>, vector<8xf32>
// AVX512: vector.load {{.*}} : memref<?xf32>, vector<16xf32>
// AVX512: vector.shuffle {{.*}} [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30] : vector<16xf32>, vector<16xf32>
// AVX512: arith.cmpi sgt, %{{.+}}, %{{.+}} : vector<16xi32>
// AVX512: vector.store {{.*}} : memref<?xf32>, vector<16xf32>
// CHECK-NOT: vector.gather
// CHECK-NOT: vector.scatter
// CHECK: return
func.func @topk_small(%s: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// topk_renorm, K = 64: per row, knockout rounds over i32 ordered keys, one register wide (AVX2 has no i64 max:
// the i64 candidates of before ran ~4x the instructions there), 8 rows through the rounds together (the sel
// scratch is [workers, 8, lanes]), their keys in the worker's scratch. AVX-512 (4 key vectors a row) scans the
// row: a round loads the keys, the max key is left in every lane by a butterfly of shuffles, the index is a max
// of (compare lanes and INT32_MAX - index), no select (VBLENDVPS on AVX2), and the pick is knocked out with one
// scalar store. AVX2 (8 key vectors a row, 32 at K = 256 on either target) goes over two levels: the chunk
// maxima, transposed into one vector by max(evens, odds) shuffle rounds, are loop-carried; a round finds the top
// key and the lowest chunk holding it there, loads that chunk alone, and knocks the pick out with a vector store
// (4 rows' keys in registers, 32 ymm at K = 64, spilled every round on AVX2, which ran 1.55-1.6x the AVX-512
// time; scanning all 32 chunks of K = 256 twice a round made AVX2 1.6x slower than AVX-512, issue #16).
// CHECK-LABEL: func.func @topk_wide
// CHECK-NOT: xi64>
// AVX2: memref.alloc() {alignment = 64 : i64} : memref<2x8x8xf32>
// AVX512: memref.alloc() {alignment = 64 : i64} : memref<2x8x16xf32>
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [0, 2, 4, 6, 8, 10, 12, 14] : vector<8xi32>, vector<8xi32>
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [1, 3, 5, 7, 9, 11, 13, 15] : vector<8xi32>, vector<8xi32>
// AVX2: scf.for %[[J:.+]] = %c0 to %c8 step %c1 iter_args({{.*}}) -> ({{(vector<8xi32>, ){7}vector<8xi32>}}) {
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [4, 5, 6, 7, 0, 1, 2, 3] : vector<8xi32>, vector<8xi32>
// AVX2: %[[CHUNKV:.+]] = arith.subi %{{.+}}, %{{.+}} : vector<8xi32>
// AVX2: %[[CHUNK:.+]] = vector.extract %[[CHUNKV]][0] : i32 from vector<8xi32>
// AVX2: %[[FIRST:.+]] = arith.muli %[[CHUNK]], %c8_i32 : i32
// AVX2: %[[KEYS:.+]] = vector.load %[[SCRATCH:.+]][%[[AT:.+]]] : memref<?xi32, strided<[1], offset: ?>>, vector<8xi32>
// AVX2-NOT: vector.load
// AVX2: %[[LANE:.+]] = vector.extract %{{.+}}[0] : i32 from vector<8xi32>
// AVX2: %[[INDEX:.+]] = arith.addi %[[FIRST]], %[[LANE]] : i32
// AVX2: memref.store %[[INDEX]], %{{.+}}[%{{.+}}, %[[J]]] : memref<?x8xi32>
// AVX2: %[[KNOCKED:.+]] = arith.select %{{.+}}, %{{.+}}, %[[KEYS]] : vector<8xi1>, vector<8xi32>
// AVX2: vector.store %[[KNOCKED]], %[[SCRATCH]][%[[AT]]]
// AVX512: scf.for %[[J:.+]] = %c0 to %c8 step %c1 {
// AVX512-NOT: arith.select
// AVX512: vector.load {{.*}} : memref<?xi32, strided<[1], offset: ?>>, vector<16xi32>
// AVX512: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// AVX512: vector.shuffle %{{.+}}, %{{.+}} [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7] : vector<16xi32>, vector<16xi32>
// AVX512: %[[HIT:.+]] = arith.cmpi eq, %{{.+}}, %{{.+}} : vector<16xi32>
// AVX512: %[[HITI:.+]] = arith.extsi %[[HIT]] : vector<16xi1> to vector<16xi32>
// AVX512: arith.andi %[[HITI]], %{{.+}} : vector<16xi32>
// AVX512-NOT: arith.select
// AVX512: vector.extract %{{.+}}[0] : i32 from vector<
// AVX512: memref.store %{{.+}}, %{{.+}}[%{{.+}}, %[[J]]] : memref<?x8xi32>
// AVX512-NOT: arith.select
// AVX512-COUNT-8: memref.store %c-2147483648_i32, %{{.+}}[%{{.+}}] : memref<?xi32, strided<[1], offset: ?>>
// CHECK-NOT: memref.store %c-2147483648_i32
// AVX2: math.floor %{{.+}} : vector<8xf32>
// AVX512: math.floor %{{.+}} : vector<16xf32>
// CHECK-NOT: vector.gather
// CHECK-NOT: xi64>
// CHECK: return
func.func @topk_wide(%s: tensor<?x64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// K = 256: two levels on both targets, 4 rows together (their chunk maxima loop-carried: 4 vectors a row on
// AVX2, one on AVX-512); no scalar knockout store.
// CHECK-LABEL: func.func @topk_256
// CHECK-NOT: xi64>
// AVX2: memref.alloc() {alignment = 64 : i64} : memref<2x4x8xf32>
// AVX512: memref.alloc() {alignment = 64 : i64} : memref<2x4x16xf32>
// AVX2: scf.for %{{.+}} = %c0 to %c8 step %c1 iter_args({{.*}}) -> ({{(vector<8xi32>, ){15}vector<8xi32>}}) {
// AVX512: scf.for %{{.+}} = %c0 to %c8 step %c1 iter_args({{.*}}) -> ({{(vector<16xi32>, ){3}vector<16xi32>}}) {
// CHECK-NOT: memref.store %c-2147483648_i32
// CHECK: math.floor
// CHECK-NOT: xi64>
// CHECK: return
func.func @topk_256(%s: tensor<?x256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// hyper_router: GEMV rows as FMA chains on one register each, four accumulators a row. AVX-512 reads one row a
// step; AVX2 two (eight accumulators, each x chunk loaded once for both rows; one row a step read w2 at 80% of
// the STREAM triad against AVX-512's 93%), then the odd row alone.
// CHECK-LABEL: func.func @hyper
// AVX2: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c2 {
// AVX2: scf.for {{.*}} step %c4 iter_args({{.*}}) -> ({{(vector<8xf32>, ){7}vector<8xf32>}})
// AVX2: %[[M0:.+]] = vector.load %{{.+}} : memref<64x32xf32>, vector<8xf32>
// AVX2: %[[M1:.+]] = vector.load %{{.+}} : memref<64x32xf32>, vector<8xf32>
// AVX2: %[[X:.+]] = vector.load %{{.+}} : memref<32xf32>, vector<8xf32>
// AVX2: vector.fma %[[M0]], %[[X]], %{{.+}} : vector<8xf32>
// AVX2: vector.fma %[[M1]], %[[X]], %{{.+}} : vector<8xf32>
// AVX2: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c1 {
// AVX2: scf.for {{.*}} step %c4 iter_args({{.*}}) -> ({{(vector<8xf32>, ){3}vector<8xf32>}})
// AVX512: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c1 {
// AVX512: scf.for {{.*}} step %c4 iter_args({{.*}}) -> ({{(vector<16xf32>, ){3}vector<16xf32>}})
// AVX512: vector.fma %{{.+}}, %{{.+}}, %{{.+}} : vector<16xf32>
// AVX512-NOT: step %c2
// CHECK-NOT: vector.gather
// CHECK: return
func.func @hyper(%emb: tensor<32xf32>, %w1: tensor<64x32xf32>, %b1: tensor<64xf32>, %w2: tensor<520x64xf32>,
                 %b2: tensor<520xf32>) -> (tensor<8x64xf32>, tensor<8xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(8) : tensor<32xf32>, tensor<64x32xf32>,
      tensor<64xf32>, tensor<520x64xf32>, tensor<520xf32> -> tensor<8x64xf32>, tensor<8xf32>
  return %w, %b : tensor<8x64xf32>, tensor<8xf32>
}

// similarity_inform (the flash mixing kernel shared by the mixing ops and their backward): the 8 x 32 tile of dot
// products is computed in register blocks of the target. AVX-512: one depth loop with 8 rows x 2 zmm (16
// accumulators of 32 registers), the dots stay in registers. With AVX2, 6 rows x 2 ymm per key half, then the 2 rows
// left x 4 ymm (at most 12 accumulators of 16 registers, at least 8 to cover the FMA latency), each block stored
// to the tile buffer; vector<16> accumulators there (32 ymm) spilled on every step and ran at half the speed. The
// P·V accumulation takes one register per row: 8 x vector<8> on AVX2, 8 x vector<16> on AVX-512.
// CHECK-LABEL: func.func @similarity_blocks
// AVX2: %{{.+}}:12 = scf.for
// AVX2-COUNT-12: vector.fma {{.*}} : vector<8xf32>
// AVX2: vector.store {{.*}} : memref<8x32xf32, strided<[32, 1], offset: ?>>, vector<8xf32>
// AVX2: %{{.+}}:12 = scf.for
// AVX2-COUNT-12: vector.fma {{.*}} : vector<8xf32>
// AVX2: %{{.+}}:8 = scf.for
// AVX2-COUNT-8: vector.fma {{.*}} : vector<8xf32>
// AVX2: %{{.+}}:8 = scf.for %{{.+}} = %c0 to %c32
// AVX2: vector.load {{.*}} : memref<?x?x?xf32>, vector<8xf32>
// AVX2-COUNT-8: vector.fma {{.*}} : vector<8xf32>
// AVX512: %{{.+}}:16 = scf.for
// AVX512-COUNT-16: vector.fma {{.*}} : vector<16xf32>
// AVX512: %{{.+}}:8 = scf.for %{{.+}} = %c0 to %c32
// AVX512: vector.load {{.*}} : memref<?x?x?xf32>, vector<16xf32>
// AVX512-COUNT-8: vector.fma {{.*}} : vector<16xf32>
// CHECK: return
func.func @similarity_blocks(%u: tensor<1x?x64xf32>, %e: tensor<1x?x16xf32>) -> tensor<1x?x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x?x64xf32>, tensor<1x?x16xf32> -> tensor<1x?x16xf32>
  return %p : tensor<1x?x16xf32>
}
