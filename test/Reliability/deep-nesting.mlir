// Brackets nested deeper than the parser can recurse are a diagnostic, not a stack overflow (found by moe-fuzz:
// 20,000 levels of `(` in a function type crash upstream mlir-opt-22 with SIGSEGV). The limit is 1024 levels
// (MoE/Support/NestingDepth.h); file and stdin alike.
// RUN: %python -c "print('func.func private @f(%%a: ' + '(' * 100000 + ')')" > %t.deep.mlir
// RUN: not moe-opt %t.deep.mlir 2>&1 | FileCheck %s --check-prefix=DEEP
// RUN: not moe-opt < %t.deep.mlir 2>&1 | FileCheck %s --check-prefix=DEEP
// DEEP: :1:1049: error: brackets nested deeper than 1024 levels: the MLIR parser recurses once per level and would overflow its stack
// A depth at the limit still parses (and fails only as the parser says: this type is malformed).
// RUN: %python -c "print('func.func private @f(%%a: ' + '(' * 1000 + ')')" > %t.ok.mlir
// RUN: not moe-opt %t.ok.mlir 2>&1 | FileCheck %s --check-prefix=OK
// OK: error: expected '->' in function type
// OK-NOT: nested deeper
// Arrows, strings and comments do not count: this file parses.
// RUN: moe-opt %s | FileCheck %s
// CHECK: func.func private @g(i32) -> i32 attributes {s = "((((<<<<(((("}

func.func private @g(i32) -> i32 attributes {s = "((((<<<<(((("} // ((((((((
