//===- moe-tblgen.cpp - The project's TableGen backends -------------------===//
//
// Part of the MoE-MLIR project.
//
// mlir-tblgen's driver with the backends of the lowering table
// (include/MoE/Conversion/Lowerings.td), for one conversion at a time
// (-lowering-target=<its LoweringTarget record>):
//   -gen-moe-lowering-decls         one populate function per Lowering record
//                                   of the target, and populateLowerings; for
//                                   each default one, what its pattern needs
//                                   declared (the target's defaultDecl);
//   -gen-moe-lowering-registration  the default populate functions (adding
//                                   the target's defaultPattern), and
//                                   populateLowerings, calling them all in
//                                   the table's order.
// The kernel-key table's backend is in KernelKeys.cpp, the pipelines'
// options' (include/MoE/Pipelines/Pipelines.td) in PipelineOptions.cpp.
// It links the static TableGen libraries (not libLLVM.so/libMLIR.so, which do
// not export them), as mlir-tblgen does.
//
//===----------------------------------------------------------------------===//

#include "mlir/TableGen/GenInfo.h"
#include "mlir/TableGen/Operator.h"
#include "mlir/Tools/mlir-tblgen/MlirTblgenMain.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/TableGen/Error.h"
#include "llvm/TableGen/Record.h"
#include "llvm/TableGen/TableGenBackend.h"

#include <map>

using namespace llvm;

static cl::OptionCategory loweringCat("Options for -gen-moe-lowering-*");
static cl::opt<std::string>
    loweringTarget("lowering-target",
                   cl::desc("The LoweringTarget record to generate for"),
                   cl::cat(loweringCat));

namespace {
/// One Lowering record as a target sees it.
struct LoweringEntry {
  std::string name;    // populate<name>Lowering
  std::string opsText; // the ops it rewrites, for the comment
  const Record *record;
  /// The default populate function's pattern and the declaration it needs,
  /// placeholders substituted; empty when the op's file defines it.
  std::string pattern, decl;
  /// The options field that guards the default pattern (OnlyWith), if any.
  std::string option;
};

/// The target's namespace and options type, and its lowerings in the table's
/// order; a missing or unknown target, an op that is not an ODS op, a name
/// given twice for one target, or an OnlyWith on a target without options or
/// without a default is a tblgen error.
struct TargetTable {
  std::string cppNamespace, optionsType, defaultPattern, defaultDecl;
  /// The traits a record may set and their defaults (traitDefaults).
  std::map<std::string, std::string> traitDefaults;
  std::vector<LoweringEntry> entries;
};
} // namespace

static TargetTable collect(const RecordKeeper &records) {
  if (loweringTarget.empty())
    PrintFatalError("-lowering-target=<LoweringTarget record> is required");
  const Record *target = records.getDef(loweringTarget);
  if (!target || !target->isSubClassOf("LoweringTarget"))
    PrintFatalError("no LoweringTarget named '" + loweringTarget + "'");
  TargetTable table;
  table.cppNamespace =
      target->getValueAsString("cppNamespace").ltrim(':').str();
  table.optionsType = target->getValueAsString("optionsType").str();
  table.defaultPattern = target->getValueAsString("defaultPattern").str();
  table.defaultDecl = target->getValueAsString("defaultDecl").str();
  auto splitTrait = [](const Record *where, StringRef trait) {
    auto [name, value] = trait.split('=');
    if (name.empty() || value.empty() || name.size() == trait.size())
      PrintFatalError(where, "trait '" + trait + "' is not name=value");
    return std::make_pair(name.str(), value.str());
  };
  for (StringRef trait : target->getValueAsListOfStrings("traitDefaults"))
    table.traitDefaults.insert(splitTrait(target, trait));
  // A record's trait is one target's (another target ignores it); a name no
  // target knows is an error.
  StringSet<> knownTraits;
  for (const Record *t : records.getAllDerivedDefinitions("LoweringTarget"))
    for (StringRef trait : t->getValueAsListOfStrings("traitDefaults"))
      knownTraits.insert(splitTrait(t, trait).first);
  StringSet<> seen;
  for (const Record *lowering : records.getAllDerivedDefinitions("Lowering")) {
    if (!llvm::is_contained(lowering->getValueAsListOfDefs("loweringTargets"),
                            target))
      continue;
    std::vector<const Record *> ops =
        lowering->getValueAsListOfDefs("loweredOps");
    if (ops.empty())
      PrintFatalError(lowering, "a lowering needs at least one op");
    LoweringEntry entry{lowering->getValueAsString("loweringName").str(), "",
                        lowering};
    for (const Record *op : ops) {
      if (!op->isSubClassOf("Op"))
        PrintFatalError(lowering, "'" + op->getName() + "' is not an op");
      mlir::tblgen::Operator odsOp(op);
      if (!entry.opsText.empty())
        entry.opsText += ", ";
      entry.opsText += odsOp.getOperationName();
    }
    if (entry.name.empty()) {
      if (ops.size() != 1)
        PrintFatalError(lowering, "a lowering of several ops needs a name");
      StringRef cls = mlir::tblgen::Operator(ops.front()).getCppClassName();
      cls.consume_back("Op");
      entry.name = cls.str();
    }
    if (!seen.insert(entry.name).second)
      PrintFatalError(lowering, "populate" + entry.name +
                                    "Lowering is declared twice for " +
                                    loweringTarget);
    for (const Record *guard : lowering->getValueAsListOfDefs("onlyWith")) {
      if (guard->getValueAsDef("target") != target)
        continue;
      if (table.optionsType.empty() || table.defaultPattern.empty())
        PrintFatalError(
            lowering,
            "OnlyWith<" + loweringTarget + ">: the target has no " +
                (table.optionsType.empty() ? "options" : "default pattern"));
      entry.option = guard->getValueAsString("option").str();
    }
    if (!table.defaultPattern.empty() &&
        !llvm::is_contained(lowering->getValueAsListOfDefs("customPopulate"),
                            target)) {
      std::string op =
          mlir::tblgen::Operator(ops.front()).getQualCppClassName();
      std::map<std::string, std::string> traits = table.traitDefaults;
      for (StringRef trait : lowering->getValueAsListOfStrings("traits")) {
        auto [name, value] = splitTrait(lowering, trait);
        if (!knownTraits.contains(name))
          PrintFatalError(lowering, "no target has the trait '" + name + "'");
        if (table.traitDefaults.count(name))
          traits[name] = value;
      }
      auto substitute = [&](StringRef text) {
        std::string result;
        while (!text.empty()) {
          auto trait = llvm::find_if(traits, [&](const auto &t) {
            return text.starts_with("$" + t.first);
          });
          if (trait != traits.end()) {
            result += trait->second;
            text = text.drop_front(trait->first.size() + 1);
          } else if (text.consume_front("$op"))
            result += op;
          else if (text.consume_front("$name"))
            result += entry.name;
          else {
            result += text.front();
            text = text.drop_front();
          }
        }
        return result;
      };
      entry.pattern = substitute(table.defaultPattern);
      entry.decl = substitute(table.defaultDecl);
    } else if (!entry.option.empty()) {
      PrintFatalError(lowering, "OnlyWith<" + loweringTarget +
                                    "> on a custom populate function");
    }
    table.entries.push_back(std::move(entry));
  }
  return table;
}

/// The parameter list of the target's populate functions.
static std::string params(const TargetTable &table) {
  std::string result = "::mlir::RewritePatternSet &patterns";
  if (!table.optionsType.empty())
    result += ", const " + table.optionsType + " &options";
  return result;
}

static bool emitDecls(const RecordKeeper &records, raw_ostream &os) {
  TargetTable table = collect(records);
  emitSourceFileHeader(
      "The " + loweringTarget + " lowerings' populate functions", os, records);
  os << "namespace " << table.cppNamespace << " {\n\n";
  for (const LoweringEntry &entry : table.entries) {
    if (!entry.decl.empty())
      os << formatv("/// The lowering of {0}.\n{1}\n", entry.opsText,
                    entry.decl);
    os << formatv(
        "/// The patterns of {0}{1}.\nvoid populate{2}Lowering({3});\n",
        entry.opsText,
        entry.pattern.empty() ? " (defined in the op's file)" : "", entry.name,
        params(table));
  }
  os << formatv("\n/// Every lowering of the table (Lowerings.td) for {0}, in "
                "its order.\nvoid populateLowerings({1});\n",
                loweringTarget, params(table));
  os << "\n} // namespace " << table.cppNamespace << "\n";
  return false;
}

static bool emitRegistration(const RecordKeeper &records, raw_ostream &os) {
  TargetTable table = collect(records);
  emitSourceFileHeader("The " + loweringTarget + " lowerings' registration", os,
                       records);
  for (const LoweringEntry &entry : table.entries) {
    if (entry.pattern.empty())
      continue;
    os << formatv("void {0}::populate{1}Lowering({2}) {{\n", table.cppNamespace,
                  entry.name, params(table));
    std::string indent = "  ";
    if (!entry.option.empty()) {
      os << formatv("  if (options.{0})\n", entry.option);
      indent += "  ";
    }
    os << formatv("{0}patterns.add<{1}>(patterns.getContext(){2});\n}\n\n",
                  indent, entry.pattern,
                  table.optionsType.empty() ? "" : ", options");
  }
  os << formatv("void {0}::populateLowerings({1}) {{\n", table.cppNamespace,
                params(table));
  for (const LoweringEntry &entry : table.entries)
    os << formatv("  {0}::populate{1}Lowering(patterns{2});\n",
                  table.cppNamespace, entry.name,
                  table.optionsType.empty() ? "" : ", options");
  os << "}\n";
  return false;
}

static mlir::GenRegistration
    genDecls("gen-moe-lowering-decls",
             "Declare a conversion's populate functions (Lowerings.td)",
             emitDecls);
static mlir::GenRegistration
    genRegistration("gen-moe-lowering-registration",
                    "Define a conversion's populateLowerings (Lowerings.td)",
                    emitRegistration);

int main(int argc, char **argv) { return mlir::MlirTblgenMain(argc, argv); }
