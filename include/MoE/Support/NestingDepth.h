//===- NestingDepth.h - Reject text nested deeper than the parser can take
//-===//
//
// Part of the MoE-MLIR project.
//
// MLIR's parser recurses once per nesting level of brackets (a function type
// inside a function type, a region inside a region, ...) and has no depth
// limit: `(((...` a few ten thousand levels deep overflows the stack of
// mlir-opt itself (found by moe-fuzz; tools/moe-fuzz/upstream/deep-nesting.sh).
// The drivers that parse text we are handed (moe-opt, moe-fuzz) check the
// depth first and give a diagnostic instead of a crash. No real IR comes near
// the limit: the deepest test in this repository nests 9 levels.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_NESTINGDEPTH_H
#define MOE_SUPPORT_NESTINGDEPTH_H

#include "llvm/ADT/StringRef.h"

#include <cstddef>
#include <optional>

namespace mlir::moe {

/// Far above any real IR and far below what the parser survives (about 20,000
/// levels of parentheses in an AddressSanitizer build, more without it).
constexpr unsigned kMaxNestingDepth = 1024;

/// The offset of the first bracket of `text` that opens level `limit + 1`
/// ((, [, {, <; `->` is not a closing bracket), or nothing. String literals
/// and `//` comments are skipped. A stray closing bracket never makes the depth
/// negative, so unbalanced text is measured from its deepest point onwards.
inline std::optional<size_t>
findExcessiveNesting(llvm::StringRef text, unsigned limit = kMaxNestingDepth) {
  unsigned depth = 0;
  for (size_t i = 0, e = text.size(); i < e; ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < e && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
      continue;
    }
    if (c == '/' && i + 1 < e && text[i + 1] == '/') {
      while (i < e && text[i] != '\n')
        ++i;
      continue;
    }
    if (c == '(' || c == '[' || c == '{' || c == '<') {
      if (++depth > limit)
        return i;
    } else if ((c == ')' || c == ']' || c == '}' ||
                (c == '>' && (i == 0 || text[i - 1] != '-'))) &&
               depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

} // namespace mlir::moe

#endif // MOE_SUPPORT_NESTINGDEPTH_H
