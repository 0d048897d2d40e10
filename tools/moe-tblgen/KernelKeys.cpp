//===- KernelKeys.cpp - The kernel-key table's backend --------------------===//
//
// Part of the MoE-MLIR project.
//
// -gen-moe-kernel-keys (include/MoE/IR/KernelKeys.td): for each KernelKey
// record, a builder of its op from a key (KernelKey.h's KernelKeyArgs),
// derived from the op's ODS arguments: each operand looked up by name
// (optional where ODS says so), each attribute converted from the key's text
// to the attribute's ODS return type and built with its ODS constant builder,
// the segment sizes of an op with optional operands; and the dispatch
// `buildFromKeyTable(b, keyOp, args, known)`. The includer defines
// `createInferred<OpT>(b, args, operands, attributes, numRegions)`.
//
//===----------------------------------------------------------------------===//

#include "mlir/TableGen/Attribute.h"
#include "mlir/TableGen/Format.h"
#include "mlir/TableGen/GenInfo.h"
#include "mlir/TableGen/Operator.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/TableGen/Error.h"
#include "llvm/TableGen/Record.h"
#include "llvm/TableGen/TableGenBackend.h"

using namespace llvm;
using mlir::tblgen::Operator;

namespace {
/// One KernelKey record with its op.
struct KeyEntry {
  const Record *record;
  std::string key;
  Operator op;
  StringMap<std::string> renames; // ODS name -> key name
  std::vector<StringRef> extraAttrs;

  std::string keyName(StringRef odsName, StringSet<> &used) const {
    auto it = renames.find(odsName);
    if (it == renames.end())
      return odsName.str();
    used.insert(odsName);
    return it->second;
  }
};
} // namespace

static std::vector<KeyEntry> collect(const RecordKeeper &records) {
  std::vector<KeyEntry> entries;
  StringSet<> seen;
  for (const Record *r : records.getAllDerivedDefinitions("KernelKey")) {
    // keyOp is an Op (the class's template argument type).
    KeyEntry entry{r, r->getValueAsString("keyName").str(),
                   Operator(r->getValueAsDef("keyOp")), {}, {}};
    if (!seen.insert(entry.key).second)
      PrintFatalError(r, "the key '" + entry.key + "' is given twice");
    for (const Record *rename : r->getValueAsListOfDefs("renames"))
      entry.renames[rename->getValueAsString("odsName")] =
          rename->getValueAsString("keyName").str();
    for (StringRef extra : r->getValueAsListOfStrings("extraAttrs"))
      entry.extraAttrs.push_back(extra);
    entries.push_back(std::move(entry));
  }
  return entries;
}

static void emitBuilder(const KeyEntry &entry, raw_ostream &os) {
  const Operator &op = entry.op;
  StringSet<> renamed;
  os << formatv("// {0}: {1}\nstatic ::mlir::Operation *buildKey_{0}("
                "::mlir::OpBuilder &b, KernelKeyArgs &args) {{\n",
                entry.key, op.getOperationName());
  os << "  ::llvm::SmallVector<::mlir::Value> operands;\n"
        "  ::llvm::SmallVector<int32_t> segments;\n";
  for (const mlir::tblgen::NamedTypeConstraint &operand : op.getOperands()) {
    if (operand.isVariadic() && !operand.isOptional())
      PrintFatalError(entry.record, "the variadic operand '" + operand.name +
                                        "' has no key form");
    std::string keyName = entry.keyName(operand.name, renamed);
    os << formatv("  args.operand(\"{0}\", {1}, operands, segments);\n",
                  keyName, operand.isOptional() ? "true" : "false");
    // The operand's ODS type constraint, checked here so that a wrong
    // element type is worded as the torch op words it (the verifier would say
    // "operand #i must be ...").
    mlir::tblgen::FmtContext typeCtx;
    typeCtx.withSelf("operands.back().getType()");
    os << formatv("  if (segments.back() && !args.failed())\n"
                  "    args.checkOperandType({0}, \"{1}\", \"{2}\", "
                  "operands.back());\n",
                  mlir::tblgen::tgfmt(
                      operand.constraint.getConditionTemplate(), &typeCtx),
                  keyName, operand.constraint.getSummary());
  }
  os << "  ::llvm::SmallVector<::mlir::NamedAttribute> attrs;\n";
  mlir::tblgen::FmtContext ctx;
  ctx.withBuilder("b");
  for (const mlir::tblgen::NamedAttribute &named : op.getAttributes()) {
    if (named.attr.isDerivedAttr())
      continue;
    mlir::tblgen::Attribute attr = named.attr;
    StringRef kind = attr.isOptional()          ? "Optional"
                     : attr.hasDefaultValue() ? "Defaulted"
                                              : "Required";
    mlir::tblgen::Attribute base = attr.getBaseAttr();
    StringRef builder = base.getConstBuilderTemplate();
    if (builder.empty())
      PrintFatalError(entry.record, "the attribute '" + named.name +
                                        "' has no constant builder");
    os << formatv("  if (auto v = args.attr<{0}>(\"{1}\", KeyAttrKind::{2}))\n"
                  "    attrs.push_back(b.getNamedAttr(\"{3}\", {4}));\n",
                  base.getReturnType(), entry.keyName(named.name, renamed),
                  kind, named.name,
                  mlir::tblgen::tgfmt(builder, &ctx, "(*v)"));
  }
  for (StringRef extra : entry.extraAttrs)
    os << formatv("  args.ignoreAttr(\"{0}\");\n", extra);
  for (const auto &rename : entry.renames)
    if (!renamed.contains(rename.getKey()))
      PrintFatalError(entry.record, "'" + rename.getKey() +
                                        "' is no operand or attribute of " +
                                        op.getOperationName());
  if (op.getTrait("::mlir::OpTrait::AttrSizedOperandSegments"))
    os << "  attrs.push_back(b.getNamedAttr(\"operandSegmentSizes\", "
          "b.getDenseI32ArrayAttr(segments)));\n";
  os << formatv("  if (args.failed() || !args.allUsed(\"{0}\"))\n"
                "    return nullptr;\n"
                "  return createInferred<{1}>(b, args, operands, attrs, {2});\n"
                "}\n\n",
                op.getOperationName(), op.getQualCppClassName(),
                op.getNumRegions());
}

static bool emitKernelKeys(const RecordKeeper &records, raw_ostream &os) {
  std::vector<KeyEntry> entries = collect(records);
  emitSourceFileHeader("The torch ops' kernel keys as ops (KernelKeys.td)", os,
                       records);
  for (const KeyEntry &entry : entries)
    emitBuilder(entry, os);
  os << "/// The op of the key `keyOp` (`known` false for a key of no op).\n"
        "static ::mlir::Operation *buildFromKeyTable(::mlir::OpBuilder &b, "
        "::llvm::StringRef keyOp, KernelKeyArgs &args, bool &known) {\n"
        "  known = true;\n";
  for (const KeyEntry &entry : entries)
    os << formatv("  if (keyOp == \"{0}\")\n    return buildKey_{0}(b, args);\n",
                  entry.key);
  os << "  known = false;\n  return nullptr;\n}\n\n";
  // The results' ODS names, which the size-limit check names.
  os << "/// The ODS names of the results of the op of the key `keyOp`.\n"
        "static ::llvm::ArrayRef<::llvm::StringRef> "
        "keyResultNames(::llvm::StringRef keyOp) {\n";
  for (const KeyEntry &entry : entries) {
    os << formatv("  if (keyOp == \"{0}\") {{\n"
                  "    static const ::llvm::StringRef names[] = {{",
                  entry.key);
    for (int i = 0, e = entry.op.getNumResults(); i < e; ++i)
      os << formatv("{0}\"{1}\"", i ? ", " : "", entry.op.getResultName(i));
    os << "};\n    return names;\n  }\n";
  }
  os << "  return {};\n}\n\n";
  // The ODS names the key renames (KeyRename), for the diagnostics.
  os << "/// (ODS name, key name) of each name the key `keyOp` renames.\n"
        "static ::llvm::ArrayRef<std::pair<::llvm::StringRef, "
        "::llvm::StringRef>> keyRenames(::llvm::StringRef keyOp) {\n";
  for (const KeyEntry &entry : entries) {
    if (entry.renames.empty())
      continue;
    os << formatv("  if (keyOp == \"{0}\") {{\n"
                  "    static const std::pair<::llvm::StringRef, "
                  "::llvm::StringRef> renames[] = {{",
                  entry.key);
    bool first = true;
    for (const auto &rename : entry.renames) {
      os << formatv("{0}{{\"{1}\", \"{2}\"}", first ? "" : ", ",
                    rename.getKey(), rename.getValue());
      first = false;
    }
    os << "};\n    return renames;\n  }\n";
  }
  os << "  return {};\n}\n\n"
        "/// Every key of the table, in its order.\n"
        "static constexpr ::llvm::StringLiteral kKernelKeyOps[] = {\n";
  for (const KeyEntry &entry : entries)
    os << formatv("    \"{0}\",\n", entry.key);
  os << "};\n";
  return false;
}

static mlir::GenRegistration
    genKernelKeys("gen-moe-kernel-keys",
                  "Define the builders of the ops of the torch ops' kernel "
                  "keys (KernelKeys.td)",
                  emitKernelKeys);
