//===- PipelineOptions.cpp - The pipelines' options backend ---------------===//
//
// Part of the MoE-MLIR project.
//
// -gen-moe-pipeline-options (include/MoE/Pipelines/Pipelines.td): for each
// Pipeline record, in a section guarded by GEN_PIPELINE_OPTIONS_<its name in
// upper case>, its options struct (a PassPipelineOptions): the static
// getArgument()/getSummary() of its registration, a member per Option record
// as upstream's pass generator declares a pass's (same type, argument, help
// and default), and, where the pipeline shows a pass's options
// (PassOptionsOf), a member per option of that pass's record, but the hidden
// ones, with the pass's help and default or the override's, and the method
// that hands their values to the pass's generated options struct. An option
// named twice, or a hidden or overridden option the pass lacks, is a tblgen
// error.
//
//===----------------------------------------------------------------------===//

#include "mlir/TableGen/GenInfo.h"
#include "mlir/TableGen/Pass.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/TableGen/Error.h"
#include "llvm/TableGen/Record.h"
#include "llvm/TableGen/TableGenBackend.h"

#include <optional>

using namespace llvm;
using mlir::tblgen::PassOption;

namespace {
/// One member of an options struct.
struct OptionMember {
  PassOption option;
  /// The help and default as the pipeline shows them.
  std::string help;
  std::optional<StringRef> defaultValue;
};

/// A pass whose options a pipeline shows (PassOptionsOf).
struct ShownPass {
  mlir::tblgen::Pass pass;
  std::vector<OptionMember> members;
  std::vector<StringRef> hidden;
};
} // namespace

/// `text` as a C++ string literal (a raw one, as upstream's pass generator
/// writes option help).
static std::string literal(StringRef text) {
  if (text.contains(")PO\""))
    PrintFatalError("option help holds the raw string's delimiter )PO\"");
  return ("R\"PO(" + text + ")PO\"").str();
}

/// `option` with the help and default its record gives it.
static OptionMember memberOf(const PassOption &option) {
  return {option, option.getDescription().trim().str(),
          option.getDefaultValue()};
}

/// The options of the pipeline's PassOptionsOf, if any: the pass's, in its
/// order, without the hidden ones, the overrides applied.
static std::optional<ShownPass> shownPassOf(const Record *pipeline) {
  if (pipeline->isValueUnset("passOptions"))
    return std::nullopt;
  const Record *shown = pipeline->getValueAsDef("passOptions");
  ShownPass result{mlir::tblgen::Pass(shown->getValueAsDef("pass")), {}, {}};
  StringRef passArg = result.pass.getArgument();
  StringSet<> passArgs;
  for (const PassOption &option : result.pass.getOptions())
    passArgs.insert(option.getArgument());
  auto checkKnown = [&](StringRef arg) {
    if (!passArgs.contains(arg))
      PrintFatalError(pipeline, passArg + " has no option '" + arg + "'");
  };
  StringSet<> hidden;
  for (StringRef arg : shown->getValueAsListOfStrings("hidden")) {
    checkKnown(arg);
    hidden.insert(arg);
    result.hidden.push_back(arg);
  }
  StringMap<const Record *> overrides;
  for (const Record *o : shown->getValueAsListOfDefs("overrides")) {
    StringRef arg = o->getValueAsString("argument");
    checkKnown(arg);
    if (hidden.contains(arg) || !overrides.try_emplace(arg, o).second)
      PrintFatalError(pipeline, "'" + arg + "' is overridden twice or hidden");
  }
  for (const PassOption &option : result.pass.getOptions()) {
    if (hidden.contains(option.getArgument()))
      continue;
    OptionMember member = memberOf(option);
    if (const Record *o = overrides.lookup(option.getArgument())) {
      member.help += o->getValueAsString("moreHelp");
      StringRef init = o->getValueAsString("defaultValue");
      member.defaultValue =
          init.empty() ? std::nullopt : std::optional<StringRef>(init);
    }
    result.members.push_back(std::move(member));
  }
  return result;
}

static void emitMember(const OptionMember &member, raw_ostream &os) {
  const PassOption &option = member.option;
  os << formatv("  ::mlir::detail::PassOptions::{0}<{1}> {2}{{*this, \"{3}\", "
                "::llvm::cl::desc({4})",
                option.isListOption() ? "ListOption" : "Option",
                option.getType(), option.getCppVariableName(),
                option.getArgument(), literal(member.help));
  if (member.defaultValue)
    os << ", ::llvm::cl::init(" << *member.defaultValue << ")";
  if (std::optional<StringRef> flags = option.getAdditionalFlags())
    os << ", " << *flags;
  os << "};\n";
}

static void emitPipeline(const Record *pipeline, raw_ostream &os) {
  StringRef argument = pipeline->getValueAsString("argument");
  StringRef name = pipeline->getValueAsString("cppOptionsName");
  std::vector<OptionMember> own;
  for (const Record *def : pipeline->getValueAsListOfDefs("options"))
    own.push_back(memberOf(PassOption(def)));
  std::optional<ShownPass> shown = shownPassOf(pipeline);

  StringSet<> args, cppNames;
  auto checkUnique = [&](const OptionMember &member) {
    if (!args.insert(member.option.getArgument()).second ||
        !cppNames.insert(member.option.getCppVariableName()).second)
      PrintFatalError(pipeline, "the option '" + member.option.getArgument() +
                                    "' (" + member.option.getCppVariableName() +
                                    ") is declared twice");
  };
  llvm::for_each(own, checkUnique);
  if (shown)
    llvm::for_each(shown->members, checkUnique);

  std::string guard = "GEN_PIPELINE_OPTIONS_" + pipeline->getName().upper();
  os << formatv("#ifdef {0}\n", guard);
  os << formatv("/// The options of the {0} pipeline (Pipelines.td): its "
                "command-line options and the C++ API's.\n",
                argument);
  os << formatv("struct {0} : public ::mlir::PassPipelineOptions<{0}> {{\n",
                name);
  os << formatv("  /// The pipeline's name and summary, as registered.\n"
                "  static constexpr ::llvm::StringLiteral getArgument() {{\n"
                "    return ::llvm::StringLiteral(\"{0}\");\n  }\n"
                "  static constexpr ::llvm::StringLiteral getSummary() {{\n"
                "    return ::llvm::StringLiteral({1});\n  }\n\n",
                argument,
                literal(pipeline->getValueAsString("summary").trim()));
  for (const OptionMember &member : own)
    emitMember(member, os);
  if (shown) {
    StringRef passName = shown->pass.getDef()->getName();
    std::string hidden =
        shown->hidden.empty() ? "" : " but " + llvm::join(shown->hidden, ", ");
    os << formatv("\n  // {0}'s options (Passes.td){1}.\n",
                  shown->pass.getArgument(), hidden);
    for (const OptionMember &member : shown->members)
      emitMember(member, os);
    std::string method = passName.take_front(1).lower() +
                         passName.drop_front(1).str() + "Options";
    os << formatv("\n  /// {0}'s options: Passes.td's defaults with the "
                  "values of the pipeline's options of the pass put in.\n"
                  "  {1}Options {2}() const {{\n    {1}Options options;\n",
                  shown->pass.getArgument(), passName, method);
    for (const OptionMember &member : shown->members) {
      StringRef field = member.option.getCppVariableName();
      if (member.option.isListOption())
        os << formatv("    options.{0}.assign({0}.begin(), {0}.end());\n",
                      field);
      else
        os << formatv("    options.{0} = {0}.getValue();\n", field);
    }
    os << "    return options;\n  }\n";
  }
  os << formatv("};\n#undef {0}\n#endif // {0}\n\n", guard);
}

static bool emitPipelineOptions(const RecordKeeper &records, raw_ostream &os) {
  emitSourceFileHeader("The pipelines' options (Pipelines.td)", os, records);
  for (const Record *pipeline : records.getAllDerivedDefinitions("Pipeline"))
    emitPipeline(pipeline, os);
  return false;
}

static mlir::GenRegistration
    genPipelineOptions("gen-moe-pipeline-options",
                       "Define the pipelines' options structs (Pipelines.td)",
                       emitPipelineOptions);
