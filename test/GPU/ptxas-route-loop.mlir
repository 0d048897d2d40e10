// REQUIRES: ptxas
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_80,sm_90 --split-input-file --all-nospill --pipeline-options "route-map=lanes" --out %t.md %moe_src_root/test/Conversion/MoEToGPU/route-loop.mlir | FileCheck %s
// RUN: FileCheck %s --check-prefix=TABLE < %t.md
// RUN: %python %moe_src_root/bench/gpu/ptxas_report.py --moe-opt %moe_obj_root/bin/moe-opt --ptxas %ptxas --chips sm_90 --split-input-file --all-nospill --pipeline-options "route-map=warp" --out %t.warp.md %moe_src_root/test/Conversion/MoEToGPU/route-loop.mlir | FileCheck %s --check-prefix=WARP
// RUN: FileCheck %s --check-prefix=WARP-TABLE < %t.warp.md

// moe.route's loop kernel (the shapes route-map=lanes does not take: test/Conversion/MoEToGPU/route-loop.mlir)
// through moe-lower-to-nvvm and ptxas for sm_80 and sm_90 without local memory: up to 64 groups (the group loop's
// candidates, two a lane), E = 8192, k = 64, replay. A warp a block: at 128 threads ptxas held the kernel to 32
// registers and spilled 8-24 bytes past 32 groups. And the register kernel keeping 8 of 64 groups (route-map=warp),
whose lowering took hours before its kept groups' rounds were unrolled (Route.cpp, keepGroups).

// CHECK: ptxas report: 14 kernels, 0 failures
// WARP: ptxas report: 7 kernels, 0 failures
// WARP-TABLE: | sm_90 | keep_8_of_64_groups | route_warp_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |

// TABLE-DAG: | sm_80 | groups_of_819 | route_loop_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | groups_of_819 | route_loop_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_80 | groups_64_of_65 | route_loop_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | groups_64_of_65 | route_loop_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | experts_8192 | route_loop_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |
// TABLE-DAG: | sm_90 | replay_groups_of_819 | route_loop_0 | {{[0-9]+}} | 0 | 0 | 0 | 0 |
