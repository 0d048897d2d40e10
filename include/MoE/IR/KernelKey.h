//===- KernelKey.h - A torch op's kernel key as its moe op ------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The kernel key of a torch.ops.moe.* call (lib/Runtime/Torch/TorchKernels.h,
// `op|attr=value|...|out:name:elem|...|in:name:elem:dims|...`, `?` for a
// token-like dimension) is the compiler's input: the op is built with its ODS
// builder from the table KernelKeys.td, its result types inferred (an `out:`
// entry gives a result another element type: indices as i64), and verified,
// so an op's surface and checks are written once, in ODS.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_KERNELKEY_H
#define MOE_IR_KERNELKEY_H

#include "MoE/IR/MoEOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>
#include <type_traits>

namespace mlir::moe {

/// A parsed key. Its attributes and inputs keep the key's order (the inputs'
/// is the kernel's parameter order).
struct KernelKey {
  struct Input {
    std::string name, elem;
    /// ShapedType::kDynamic for `?`; empty for `scalar`.
    SmallVector<int64_t> shape;
  };
  std::string op;
  SmallVector<std::pair<std::string, std::string>> attrs;
  SmallVector<Input> inputs;
  /// `out:<result>:<element type>`: a result whose element type is not the
  /// inferred one (indices as i64, as torch.topk gives them); the op's
  /// verifier says whether the result may take it.
  SmallVector<std::pair<std::string, std::string>> outputs;

  /// The attribute `name`'s text, or null.
  const std::string *attr(StringRef name) const;
};

/// Parses `text`; std::nullopt with `error` set for a malformed key.
std::optional<KernelKey> parseKernelKey(StringRef text, std::string &error);

/// How an ODS attribute may appear in a key: always; or left out for its
/// default; or left out, or `none`, for an absent optional attribute.
enum class KeyAttrKind { Required, Defaulted, Optional };

/// The operands and attributes of a key as the generated builders take them
/// (KernelKeys.td, tools/moe-tblgen -gen-moe-kernel-keys): each lookup records
/// what it used, so a key with a name the op does not have is an error, and
/// the first error is emitted at `loc`.
class KernelKeyArgs {
public:
  KernelKeyArgs(const KernelKey &key, ValueRange inputs, Location loc)
      : key(key), inputs(inputs), loc(loc),
        usedInputs(key.inputs.size(), false),
        usedAttrs(key.attrs.size(), false) {}

  /// Appends the input `name` to `operands` (and its segment size, 0 or 1);
  /// a missing input is an error unless `optional`.
  void operand(StringRef name, bool optional, SmallVectorImpl<Value> &operands,
               SmallVectorImpl<int32_t> &segments);

  /// The attribute `name` as the ODS return type T (integers, APFloat as f32,
  /// bool as 0/1, an enum by its keyword); std::nullopt when the key leaves it
  /// out (an error if Required), says `none` for an Optional one, or it does
  /// not parse.
  template <typename T>
  std::optional<T> attr(StringRef name, KeyAttrKind kind) {
    const std::string *text = lookupAttr(name, kind);
    if (!text)
      return std::nullopt;
    std::optional<T> value;
    if constexpr (std::is_same_v<T, bool>)
      value = parseBool(*text);
    else if constexpr (std::is_same_v<T, llvm::APFloat>)
      value = parseF32(*text);
    else if constexpr (std::is_integral_v<T>) {
      if (std::optional<int64_t> v = parseInt(*text))
        value = T(*v);
    } else if constexpr (std::is_enum_v<T>) {
      value = symbolizeEnum<T>(*text);
      if (!value) {
        // The torch op's wording: the values the enum has, by keyword.
        std::string allowed;
        for (unsigned i = 0; i < 64; ++i) {
          StringRef word = stringifyEnum(static_cast<T>(i));
          if (!word.empty())
            allowed += (allowed.empty() ? "'" : ", '") + word.str() + "'";
        }
        fail("'" + name.str() + "' must be one of " + allowed + ", got '" +
             *text + "'");
        return std::nullopt;
      }
    } else
      static_assert(!sizeof(T), "no key conversion for this attribute type");
    if (!value)
      fail("attribute '" + name.str() + "' = '" + *text +
           "' is not a value of its type");
    return value;
  }

  /// The element-type rule of the operand `name` (ODS's type constraint,
  /// `ok` its predicate on the input, `summary` its description): "'name'
  /// must be f32, f16 or bf16, got i64", the torch ops' words for it.
  void checkOperandType(bool ok, StringRef name, StringRef summary, Value v);

  /// Key attributes that build no attribute of the op (KernelKeys.td's
  /// extraAttrs).
  void ignoreAttr(StringRef name);

  /// Whether every input and attribute of the key was used; emits an error
  /// naming the first that was not.
  bool allUsed(StringRef opName);

  bool failed() const { return hasFailed; }
  void fail(const Twine &message);
  Location getLoc() const { return loc; }

private:
  const std::string *lookupAttr(StringRef name, KeyAttrKind kind);
  static std::optional<bool> parseBool(StringRef text);
  static std::optional<llvm::APFloat> parseF32(StringRef text);
  static std::optional<int64_t> parseInt(StringRef text);

  const KernelKey &key;
  ValueRange inputs;
  Location loc;
  SmallVector<bool> usedInputs, usedAttrs;
  bool hasFailed = false;
};

/// The op of `key` at `b`'s insertion point on `inputs` (the key's inputs, in
/// its order), its result types inferred; null after an error emitted at the
/// location (a key of no op, a name the op lacks, a malformed value, a failed
/// inference). The op is not verified here.
Operation *buildKernelKeyOp(OpBuilder &b, Location loc, const KernelKey &key,
                            ValueRange inputs);

/// The kernel module of `key`: `func.func @kernel(inputs...) -> (results...)`
/// around its op, verified; the results are those the kernel returns (all, but
/// for hyper_router_backward without weight gradients and apply_capacity).
/// Null after an error emitted at an unknown location.
OwningOpRef<ModuleOp> buildKernelModule(MLIRContext *context, StringRef key);

/// The ops of the kernel-key table (KernelKeys.td), in its order.
ArrayRef<StringLiteral> kernelKeyOps();

/// `diagnostics` of the key `keyText` in the torch op's names: each quoted
/// ODS name the key renames (KernelKeys.td's KeyRename: 'dw' -> 'grad_w').
std::string inKeyNames(StringRef keyText, StringRef diagnostics);

} // namespace mlir::moe

#endif // MOE_IR_KERNELKEY_H
