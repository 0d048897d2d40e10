#!/usr/bin/env bash
# Found by moe-fuzz (issue #15 long run): Debian's MLIR 22 parser recurses once per bracket level with no limit, so
# deeply nested input overflows the stack (SIGSEGV in Parser::parseFunctionType / parseTypeListParens). Upstream, not
# ours: moe-opt and moe-fuzz reject input nested deeper than 1024 levels before parsing (MoE/Support/NestingDepth.h,
# test/Reliability/deep-nesting.mlir). Reproduce: bash tools/moe-fuzz/upstream/deep-nesting.sh
python3 -c "print('func.func private @f(%a: ' + '(' * 100000 + ')')" | "${MLIR_OPT:-mlir-opt-22}" > /dev/null
