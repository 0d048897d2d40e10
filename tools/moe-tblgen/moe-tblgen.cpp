//===- moe-tblgen.cpp - The project's TableGen backends -------------------===//
//
// Part of the MoE-MLIR project.
//
// mlir-tblgen's driver with the backends of the lowering table
// (include/MoE/Conversion/Lowerings.td), for one conversion at a time
// (-lowering-target=<its LoweringTarget record>):
//   -gen-moe-lowering-decls         one populate function per Lowering record
//                                   of the target, and populateLowerings;
//   -gen-moe-lowering-registration  populateLowerings, calling them in the
//                                   table's order.
// It links the static TableGen libraries (not libLLVM.so/libMLIR.so, which do
// not export them), as mlir-tblgen does.
//
//===----------------------------------------------------------------------===//

#include "mlir/TableGen/GenInfo.h"
#include "mlir/TableGen/Operator.h"
#include "mlir/Tools/mlir-tblgen/MlirTblgenMain.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/TableGen/Error.h"
#include "llvm/TableGen/Record.h"
#include "llvm/TableGen/TableGenBackend.h"

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
};

/// The target's namespace and options type, and its lowerings in the table's
/// order; a missing or unknown target, an op that is not an ODS op, or a name
/// given twice for one target is a tblgen error.
struct TargetTable {
  std::string cppNamespace, optionsType;
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
  for (const LoweringEntry &entry : table.entries)
    os << formatv("/// The patterns of {0}.\nvoid populate{1}Lowering({2});\n",
                  entry.opsText, entry.name, params(table));
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
