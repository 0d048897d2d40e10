// RUN: %moe_python -m pytest -q -p no:cacheprovider %S/unit 2>&1 | FileCheck %s

// The GPU harness's and the GPU check's own unit tests (no GPU): --only
// parsing, the stream the harness runs compiled calls on, when it
// synchronizes, frees and reads the error word; the check's verdicts, skips,
// budget and step selection; and a model of topk-rounds=list's selection
// (test_topk_list_model.py) against a sort.

// CHECK-NOT: failed
// CHECK: {{[0-9]+}} passed
