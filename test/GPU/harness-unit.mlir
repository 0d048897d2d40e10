// RUN: env MOE_OPT=%moe_obj_root/bin/moe-opt %moe_python -m pytest -q -p no:cacheprovider %S/unit 2>&1 | FileCheck %s

// The GPU harness's and the GPU check's own unit tests (no GPU): --only
// parsing, the stream the harness runs compiled calls on, when it
// synchronizes, frees and reads the error word; the check's verdicts, skips,
// budget and step selection; a model of topk-rounds=list's selection
// (test_topk_list_model.py) against a sort, one of route-map=lanes's
// (test_route_lanes_model.py) against moe.route's definition, and
// route-map=lanes's kernel as moe-opt emits it run warp by warp by a SIMT
// interpreter (simt.py, test_route_lanes_simt.py) against the harness's
// float64 reference; dispatch_plan's three kernels (alone and after a route
// kernel, test_dispatch_plan_simt.py) against its plain-Python plan.

// CHECK-NOT: failed
// CHECK: {{[0-9]+}} passed
