// Sizes a CUDA launch cannot take are compile-time errors of convert-moe-to-gpu that name the limit (issue #15):
// shared memory per block (option shared-memory-bytes, 48 KiB by default) and grid dimensions (65535 blocks in y
// and z) where the shapes are static. Dynamic sizes are left to the launch.
// RUN: moe-opt %s -split-input-file -verify-diagnostics --convert-moe-to-gpu="shared-memory-bytes=32768"
// RUN: moe-opt %s -split-input-file -verify-diagnostics \
// RUN:   --moe-lower-to-nvvm="chip=sm_90 format=isa shared-memory-bytes=32768"
// At the default limit the K = 256 tile fits: only the grids are errors.
// RUN: not moe-opt %s -split-input-file --convert-moe-to-gpu 2>/dev/null | FileCheck %s --check-prefix=DEFAULT
// RUN: not moe-opt %s --convert-moe-to-gpu="shared-memory-bytes=0" 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not moe-opt %s --convert-moe-to-gpu="block-size=48" 2>&1 | FileCheck %s --check-prefix=BLOCK

// DEFAULT-LABEL: func.func @flash_tile_over_shared_memory
// DEFAULT: gpu.launch_func {{.*}}@moe_kernels::@similarity_inform_0
// DEFAULT-LABEL: func.func @flash_tile_within_shared_memory
// DEFAULT: gpu.launch_func {{.*}}@moe_kernels::@similarity_inform_0
// OPTION: convert-moe-to-gpu: shared-memory-bytes must be positive, got 0
// BLOCK: convert-moe-to-gpu: block-size must be a multiple of 32 in [32, 1024], got 48{{$}}

// The flash kernel stages a [32 x K] value tile: at K = 256, 41216 bytes of workgroup memory in all.
func.func @flash_tile_over_shared_memory(%u: tensor<1x16x8xf32>, %e: tensor<1x16x256xf32>) -> tensor<1x16x256xf32> {
  // expected-error @+1 {{'moe.similarity_inform' op needs 41216 bytes of shared memory per block in kernel @similarity_inform_0, more than the limit of 32768 bytes (option shared-memory-bytes)}}
  %p = moe.similarity_inform %u, %e : tensor<1x16x8xf32>, tensor<1x16x256xf32> -> tensor<1x16x256xf32>
  return %p : tensor<1x16x256xf32>
}

// -----

// K = 128: 24832 bytes, within the limit.
func.func @flash_tile_within_shared_memory(%u: tensor<1x16x8xf32>, %e: tensor<1x16x128xf32>) -> tensor<1x16x128xf32> {
  %p = moe.similarity_inform %u, %e : tensor<1x16x8xf32>, tensor<1x16x128xf32> -> tensor<1x16x128xf32>
  return %p : tensor<1x16x128xf32>
}

// -----

// One block row per sequence: B = 70000 sequences is a grid of 70000 blocks in y.
func.func @sequences_over_grid_y(%u: tensor<70000x1x1xf32>, %e: tensor<70000x1x2xf32>) -> tensor<70000x1x2xf32> {
  // expected-error @+1 {{'moe.similarity_inform' op launches kernel @similarity_inform_0 with a grid of 70000 blocks in dimension y, more than the CUDA limit of 65535}}
  %p = moe.similarity_inform %u, %e : tensor<70000x1x1xf32>, tensor<70000x1x2xf32> -> tensor<70000x1x2xf32>
  return %p : tensor<70000x1x2xf32>
}

// -----

// The same with B = 65535: within the limit.
func.func @sequences_at_grid_y_limit(%u: tensor<65535x1x1xf32>, %e: tensor<65535x1x2xf32>) -> tensor<65535x1x2xf32> {
  %p = moe.similarity_inform %u, %e : tensor<65535x1x1xf32>, tensor<65535x1x2xf32> -> tensor<65535x1x2xf32>
  return %p : tensor<65535x1x2xf32>
}

// -----

// A dynamic batch is checked at launch, not here.
func.func @dynamic_sequences(%u: tensor<?x1x1xf32>, %e: tensor<?x1x2xf32>) -> tensor<?x1x2xf32> {
  %p = moe.similarity_inform %u, %e : tensor<?x1x1xf32>, tensor<?x1x2xf32> -> tensor<?x1x2xf32>
  return %p : tensor<?x1x2xf32>
}

// -----

// attention_posterior's entropy kernel has a block per (chunk, head, sequence): B = 70000 in z.
func.func @posterior_sequences_over_grid_z(%s: tensor<70000x1x1x1xf32>, %u: tensor<70000x1x1xf32>,
    %v: tensor<70000x1x1x1xf32>, %wo: tensor<1x1xf32>, %e: tensor<70000x1x2xf32>)
    -> (tensor<70000x1x2xf32>, tensor<70000xi32>) {
  // expected-error @+3 {{'moe.attention_posterior' op launches kernel @attention_entropy_0 with a grid of 70000 blocks in dimension z, more than the CUDA limit of 65535}}
  // expected-error @+2 {{'moe.attention_posterior' op launches kernel @attention_head_means_0 with a grid of 70000 blocks in dimension y, more than the CUDA limit of 65535}}
  // expected-error @+1 {{'moe.attention_posterior' op launches kernel @attention_posterior_0 with a grid of 70000 blocks in dimension y, more than the CUDA limit of 65535}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<70000x1x1x1xf32>, tensor<70000x1x1xf32>, tensor<70000x1x1x1xf32>, tensor<1x1xf32>, tensor<70000x1x2xf32>
      -> tensor<70000x1x2xf32>, tensor<70000xi32>
  return %p, %h : tensor<70000x1x2xf32>, tensor<70000xi32>
}
