// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-key-splits=1" -split-input-file -verify-diagnostics -o %t.nosplit
// RUN: FileCheck %s < %t.nosplit
// RUN: FileCheck %s --check-prefix=LAZY < %t.nosplit
// RUN: not moe-opt %s --convert-moe-to-gpu="%flash_base64 flash-mma-block-rows=96" -split-input-file 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not moe-opt %s --convert-moe-to-gpu="%flash_base64 flash-mma-key-splits=17" -split-input-file 2>&1 | FileCheck %s --check-prefix=BADSPLIT
// The defaults (since the H200 run of 2026-11-26): 4 key splits.
// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -o %t
// RUN: FileCheck %s --check-prefix=LAZY < %t
// RUN: FileCheck %s --check-prefix=SPLIT < %t

// flash-mma-block-rows=128 (issue #47 item 3; the default since the H200 run
// of 2026-11-26): a block of the tensor-core kernel's 4 warps owns 128 query
// rows, two 16-row MMA tiles a warp, so each ldmatrix of keys feeds 4 MMAs (2 key
// blocks x 2 row tiles) and each of values 2 per row tile; the staging's
// 16-byte alignment is decided once, outside the key loops: the aligned
// loops' cp.async copies are unrolled (D = 64: 4 of keys and 1 of values a
// thread and tile, back to back), the misaligned ones keep the element
// loops. Both tiles' fragments take about 160 registers: 2 blocks a
// multiprocessor, no cap below ptxas's 255. The SIMT interpreter runs it
// against the float64 reference (test/GPU/unit/test_flash_mma_simt.py).
// BAD: flash-mma-block-rows must be 64 or 128, got 96
// BADSPLIT: flash-mma-key-splits must be in [1, 16], got 17

// Three stages and the lazy rescale (issue #47 items 2 and 3; the 128-row
// kernel's since the H200 run of 2026-11-26: 1.13x without them). Three tile
// buffers of keys and of values in dynamic shared memory (the launch passes
// 3 x 64 x (72 + 24) x 2 = 36864 bytes; the values' buffers 16-byte aligned
// at 27648): the first two
// tiles' copies before the key loops, each its own commit group, and a
// tile's copies issued two tiles ahead (wait.group 1: all but the last
// committed group done). The whole tiles run in a hot loop without a row
// max: each tile's weights against the carried shift, rounded in pairs, the
// pairs ORed and tested for bit 14 of either half (0x40004000: a weight of 2
// or more, inf or NaN), one vote; a warp that finds one leaves the hot loop
// for the exact step around it (the quads' max: the only shuffles, the
// rescale), then goes back in. The checked tiles follow with the exact step.
// LAZY-LABEL: gpu.func @similarity_inform_mma_0(
// LAZY-NOT: workgroup(
// LAZY: %[[DYN:.+]] = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
// LAZY: memref.view %[[DYN]][%c0{{.*}}][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<192x72xf16, #gpu.address_space<workgroup>>
// LAZY: memref.view %[[DYN]][%c27648{{.*}}][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<192x24xf16, #gpu.address_space<workgroup>>
// LAZY: arith.constant -3.40282347E+38 : f32
// LAZY: nvvm.cp.async.commit.group
// LAZY: nvvm.cp.async.commit.group
// LAZY: scf.while
// LAZY: scf.while
// LAZY: nvvm.cp.async.wait.group 1
// LAZY-NEXT: gpu.barrier
// LAZY: nvvm.cp.async.commit.group
// LAZY-NOT: gpu.shuffle
// LAZY: arith.andi %{{.+}}, %c1073758208_i32 : i32
// LAZY-NOT: gpu.shuffle
// LAZY: nvvm.vote.sync  any
// LAZY-NOT: gpu.shuffle
// LAZY: scf.condition
// LAZY-NOT: gpu.shuffle
// LAZY: scf.condition
// The exact step: each row's quad max (2 shuffles a row), then the mixing.
// LAZY-COUNT-8: gpu.shuffle  xor
// LAZY: nvgpu.mma.sync
// The checked tiles.
// LAZY: scf.for
// LAZY: nvvm.cp.async.wait.group 1
// LAZY-LABEL: func.func @rows128_f16(
// LAZY: gpu.launch_func {{.*}}@moe_kernels::@similarity_inform_mma_0 {{.*}} dynamic_shared_memory_size %c36864_i32

// flash-mma-key-splits=4 (with the 128-row kernel): blocks along z share a
// row block's key tiles (each its ceil(tiles / S) of them, from the
// buffer of its first tile's parity) and write their rows' unnormalized
// accumulators, max and sum to a workspace [S, B, N, K + 2]; a second
// kernel, a thread a row, combines them in split order. The host takes S =
// min(4, ceil(264 / blocks), key tiles), at least 1 (264: twice an H100's
// 132 multiprocessors). The SIMT interpreter runs both kernels against the
// float64 reference (test_flash_mma_simt.py::test_flash_mma_key_splits).
// Where S = 1 (a grid of 264 blocks or more, or one key tile: a decode
// step) the direct kernel runs alone, without the workspace's round trip
// and the second launch, and the split pair launches over empty grids.
// SPLIT-LABEL: gpu.func @similarity_inform_mma_0(
// SPLIT-SAME: %{{[a-z0-9]+}}: memref<1x16384x16xf32>) kernel
// SPLIT-LABEL: gpu.func @similarity_inform_mma_1(
// SPLIT-SAME: %[[WS:[a-z0-9]+]]: memref<?x?x?x18xf32>)
// In tiles of 64 keys: split z's [lo, hi) of the block's tiles.
// SPLIT: %[[TILES:.+]] = arith.ceildivui %{{.+}}, %c64
// SPLIT: %[[S:.+]] = gpu.grid_dim  z
// SPLIT: %[[SHARE:.+]] = arith.ceildivui %[[TILES]], %[[S]]
// SPLIT: %[[Z:.+]] = gpu.block_id  z
// SPLIT: %[[LO0:.+]] = arith.muli %[[Z]], %[[SHARE]]
// SPLIT: %[[LO:.+]] = arith.minui %[[LO0]], %[[TILES]]
// SPLIT: %[[HI0:.+]] = arith.addi %[[LO]], %[[SHARE]]
// SPLIT: %[[HI:.+]] = arith.minui %[[HI0]], %[[TILES]]
// The split's whole tiles from its first key (the lazy loop), then its
// checked tiles up to its last.
// SPLIT: %[[LOK:.+]] = arith.muli %[[LO]], %c64
// SPLIT: scf.while (%{{.+}} = %[[LOK]],
// SPLIT: scf.for %{{.+}} = %{{.+}} to %[[HI]] step %c1
// SPLIT: memref.store %{{.+}}, %[[WS]][%{{.+}}, %{{.+}}, %{{.+}}, %c16{{.*}}] : memref<?x?x?x18xf32>
// SPLIT: memref.store %{{.+}}, %[[WS]][%{{.+}}, %{{.+}}, %{{.+}}, %c17{{.*}}] : memref<?x?x?x18xf32>
// SPLIT-LABEL: gpu.func @similarity_inform_mma_combine_0(
// SPLIT: llvm.nvvm.ex2.approx.ftz.f
// SPLIT: arith.divf
// SPLIT-LABEL: func.func @rows128_f16(
// SPLIT: %[[WANT:.+]] = arith.ceildivui %c264,
// SPLIT: %[[CAP:.+]] = arith.minui %[[WANT]], %c4
// SPLIT: %[[S1:.+]] = arith.minui %[[CAP]],
// SPLIT: %[[NS:.+]] = arith.maxsi %[[S1]], %c1
// SPLIT: %[[ONE:.+]] = arith.cmpi eq, %[[NS]], %c1
// SPLIT: %[[DG:.+]] = arith.select %[[ONE]], %{{.+}}, %c0
// SPLIT: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_mma_0 blocks in (%[[DG]], %{{.+}}, %c1
// SPLIT: %[[MANY:.+]] = arith.xori %[[ONE]], %true
// SPLIT: %[[WSN:.+]] = arith.select %[[MANY]], %[[NS]], %c0
// SPLIT: %[[BUF:.+]], %{{.+}} = gpu.alloc async [%{{.+}}] (%[[WSN]], %{{.+}}, %{{.+}}) : memref<?x?x?x18xf32>
// SPLIT: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_mma_1 blocks in (%{{.+}}, %{{.+}}, %[[NS]])
// SPLIT: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_mma_combine_0
// SPLIT: gpu.dealloc async {{.*}} %[[BUF]]
// Where the 128-row kernel does not apply (D = 256), no split.
// SPLIT-LABEL: func.func @d256_one_row_tile(
// SPLIT-NOT: gpu.alloc
// The split keys' top-k combine: a quad of lanes a row (32 rows a block), a
// row past B·N reading the last row so that its quad reaches the shuffles.
// SPLIT-LABEL: gpu.func @similarity_inform_topk_mma_combine_0
// SPLIT: %[[TIG:.+]] = arith.remui %thread_id_x, %c4
// SPLIT: %[[Q:.+]] = arith.divui %thread_id_x, %c4
// SPLIT: %[[ITEM:.+]] = arith.addi %{{.+}}, %[[Q]]
// SPLIT: %[[ACTIVE:.+]] = arith.cmpi slt, %[[ITEM]], %[[ROWS:.+]] : index
// SPLIT: %[[LAST:.+]] = arith.subi %[[ROWS]], %c1
// SPLIT: arith.minui %[[ITEM]], %[[LAST]]
// SPLIT: gpu.shuffle  xor %{{.+}}, %c2_i32
// SPLIT: gpu.shuffle  xor %{{.+}}, %c1_i32
// SPLIT: scf.if %[[ACTIVE]]
// SPLIT: memref.store
// The fused top-k's split pair: the split kernel's partial rows, then the
// top-k combine, over ceil(B·N / 32) blocks.
// SPLIT-LABEL: func.func @topk_two_row_tiles(
// SPLIT: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_topk_mma_0
// SPLIT: gpu.alloc async {{.*}} : memref<?x?x?x18xf32>
// SPLIT: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_topk_mma_1
// SPLIT: %[[CB:.+]] = arith.ceildivui %{{.+}}, %c32
// SPLIT: %[[CG:.+]] = arith.select %{{.+}}, %[[CB]], %c0
// SPLIT: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_topk_mma_combine_0 blocks in (%[[CG]],
// SPLIT: gpu.dealloc

// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: %[[DYN:.+]] = gpu.dynamic_shared_memory
// CHECK: %[[K:.+]] = memref.view %[[DYN]][%c0{{.*}}][] : {{.*}} to memref<192x72xf16, #gpu.address_space<workgroup>>
// CHECK: %[[V:.+]] = memref.view %[[DYN]][%c27648{{.*}}][] : {{.*}} to memref<192x24xf16, #gpu.address_space<workgroup>>
// The query fragments of both row tiles (4 chunks each).
// CHECK-COUNT-8: vector.from_elements {{.*}} : vector<4x2xf16>
// 2 x 12 accumulators (16 experts and the sums' block), then (max, sum) x 4 rows.
// CHECK: scf.if %{{.+}} -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32) {
// Aligned: the first two tiles' copies, then the tile two ahead in each
// trip, none in a loop.
// CHECK-NOT: = %thread_id_x to
// CHECK: %[[K0:.+]] = memref.subview %[[K]][
// CHECK-COUNT-4: nvgpu.device_async_copy %{{.+}}[{{.+}}], %[[K0]][
// CHECK: %[[V0:.+]] = memref.subview %[[V]][
// CHECK: nvgpu.device_async_copy %{{.+}}[{{.+}}], %[[V0]][
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.while
// CHECK: scf.while
// CHECK: nvvm.cp.async.wait.group 1
// CHECK-NOT: = %thread_id_x to
// The buffer two tiles ahead as views (addresses: a base a tile plus constants).
// CHECK: %[[KN:.+]] = memref.subview %[[K]][
// CHECK-COUNT-4: nvgpu.device_async_copy %{{.+}}[{{.+}}], %[[KN]][
// CHECK: %[[VN:.+]] = memref.subview %[[V]][
// CHECK: nvgpu.device_async_copy %{{.+}}[{{.+}}], %[[VN]][
// One key fragment, four MMAs: row tile 0's two key blocks, then row tile 1's.
// CHECK: %[[KT:.+]] = memref.subview %[[K]][
// CHECK: nvgpu.ldmatrix %[[KT]]
// CHECK: nvgpu.mma.sync(%[[Q0:[0-9]+]],
// CHECK: nvgpu.mma.sync(%[[Q0]],
// CHECK: nvgpu.mma.sync(%[[Q1:[0-9]+]],
// CHECK: nvgpu.mma.sync(%[[Q1]],
// CHECK-NOT: nvgpu.mma.sync
// CHECK: nvgpu.ldmatrix %[[KT]]
// The hot loop: no row max (no shuffle), one vote for a weight of 2.
// CHECK-NOT: gpu.shuffle
// CHECK: nvvm.vote.sync  any
// One value fragment (16 experts), two MMAs a row tile, then each tile's sums.
// CHECK: %[[VT:.+]] = memref.subview %[[V]][
// CHECK: nvgpu.ldmatrix %[[VT]]{{.*}}transpose = true
// CHECK-COUNT-4: nvgpu.mma.sync
// CHECK: nvgpu.mma.sync(%{{.+}}, %[[ONES:cst[_0-9]*]],
// CHECK: nvgpu.mma.sync(%{{.+}}, %[[ONES]],
// CHECK-NOT: nvgpu.mma.sync
// CHECK: nvgpu.ldmatrix %[[VT]]
// The misaligned branch: the element loops.
// CHECK: } else {
// CHECK: scf.for %{{.+}} = %thread_id_x to %c4096 step %c128
// CHECK-LABEL: func.func @rows128_f16(
// CHECK: arith.ceildivui %{{.+}}, %c128
func.func @rows128_f16(%u: tensor<1x16384x64xf16>, %e: tensor<1x16384x16xf16>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<1x16384x64xf16>, tensor<1x16384x16xf16> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}

// -----

// D = 256: both tiles' fragments would pass 200 registers: one row tile, 64
// rows a block, the staging as before; the whole tiles not peeled past 128
// features (the peeled copy spilled at static sizes like these).
// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-NOT: nvvm.minctasm = 4
// CHECK-LABEL: func.func @d256_one_row_tile(
// CHECK: arith.ceildivui %{{.+}}, %c64
func.func @d256_one_row_tile(%u: tensor<2x256x256xbf16>, %e: tensor<2x256x64xbf16>) -> tensor<2x256x64xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x256x256xbf16>, tensor<2x256x64xbf16> -> tensor<2x256x64xf32>
  return %p : tensor<2x256x64xf32>
}

// -----

// The fused top-k on the 128-row kernel: the epilogue
// selects the thread's four rows (g and g + 8 of each row tile) one after
// another, each with the quad's 4-lane butterfly rounds (64-bit candidates as
// two 32-bit shuffles a step).
// CHECK-LABEL: gpu.func @similarity_inform_topk_mma_0
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: %[[WR:.+]] = memref.collapse_shape
// CHECK-COUNT-4: gpu.shuffle  xor %{{.+}}, %c{{[12]}}_i32{{.*}} : i32
// CHECK: memref.store %{{.+}}, %[[WR]]
// CHECK-COUNT-4: gpu.shuffle  xor %{{.+}}, %c{{[12]}}_i32{{.*}} : i32
// CHECK: memref.store %{{.+}}, %[[WR]]
// CHECK-COUNT-4: gpu.shuffle  xor %{{.+}}, %c{{[12]}}_i32{{.*}} : i32
// CHECK: memref.store %{{.+}}, %[[WR]]
// CHECK-COUNT-4: gpu.shuffle  xor %{{.+}}, %c{{[12]}}_i32{{.*}} : i32
// CHECK: memref.store %{{.+}}, %[[WR]]
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.return
// CHECK-LABEL: func.func @topk_two_row_tiles(
// CHECK: arith.ceildivui %{{.+}}, %c128
func.func @topk_two_row_tiles(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
  return %w, %i : tensor<2x128x2xf32>, tensor<2x128x2xi32>
}
