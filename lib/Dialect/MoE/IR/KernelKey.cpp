//===- KernelKey.cpp - A torch op's kernel key as its moe op --------------===//
//
// Part of the MoE-MLIR project.
//
// The parser of the key, the lookups the generated builders make
// (KernelKeys.td, -gen-moe-kernel-keys), and the two things of a key that are
// no ODS argument: a custom score's region (`scoring=custom:<region>`), parsed
// here, and the results a kernel returns (keptResults).
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/KernelKey.h"

#include "MoE/Support/NestingDepth.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/AsmParser/AsmParser.h"
#include "mlir/Parser/Parser.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/MathExtras.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

using namespace mlir;
using namespace mlir::moe;

//===----------------------------------------------------------------------===//
// The key's text
//===----------------------------------------------------------------------===//

const std::string *KernelKey::attr(StringRef name) const {
  for (const auto &[n, v] : attrs)
    if (n == name)
      return &v;
  return nullptr;
}

std::optional<KernelKey> mlir::moe::parseKernelKey(StringRef text,
                                                   std::string &error) {
  SmallVector<StringRef> parts;
  text.split(parts, '|');
  KernelKey key;
  key.op = parts.front().str();
  if (key.op.empty()) {
    error = "the key names no op";
    return std::nullopt;
  }
  for (StringRef part : ArrayRef(parts).drop_front()) {
    if (part.consume_front("in:")) {
      SmallVector<StringRef> fields;
      part.split(fields, ':');
      if (fields.size() != 3 || fields[0].empty() || fields[1].empty()) {
        error = "malformed input 'in:" + part.str() +
                "' (expected in:<name>:<element type>:<dims>)";
        return std::nullopt;
      }
      KernelKey::Input input{fields[0].str(), fields[1].str(), {}};
      if (fields[2] != "scalar") {
        SmallVector<StringRef> dims;
        fields[2].split(dims, 'x');
        for (StringRef d : dims) {
          int64_t size;
          if (d == "?")
            input.shape.push_back(ShapedType::kDynamic);
          else if (!d.getAsInteger(10, size) && size >= 0)
            input.shape.push_back(size);
          else {
            error = "malformed dimension '" + d.str() + "' of input '" +
                    input.name + "'";
            return std::nullopt;
          }
        }
      }
      key.inputs.push_back(std::move(input));
      continue;
    }
    if (part.consume_front("out:")) {
      auto [name, elem] = part.split(':');
      if (name.empty() || elem.empty()) {
        error = "malformed output 'out:" + part.str() +
                "' (expected out:<name>:<element type>)";
        return std::nullopt;
      }
      key.outputs.emplace_back(name.str(), elem.str());
      continue;
    }
    auto [name, value] = part.split('=');
    if (name.empty() || name.size() == part.size()) {
      error = "malformed attribute '" + part.str() + "' (expected name=value)";
      return std::nullopt;
    }
    // The device picks the kernel's build, not its op.
    if (name == "device")
      continue;
    key.attrs.emplace_back(name.str(), value.str());
  }
  return key;
}

//===----------------------------------------------------------------------===//
// KernelKeyArgs
//===----------------------------------------------------------------------===//

void KernelKeyArgs::fail(const Twine &message) {
  if (!hasFailed)
    emitError(loc) << "kernel key '" << key.op << "': " << message;
  hasFailed = true;
}

void KernelKeyArgs::operand(StringRef name, bool optional,
                            SmallVectorImpl<Value> &operands,
                            SmallVectorImpl<int32_t> &segments) {
  for (auto [i, input] : llvm::enumerate(key.inputs)) {
    if (input.name != name || usedInputs[i])
      continue;
    usedInputs[i] = true;
    operands.push_back(inputs[i]);
    segments.push_back(1);
    return;
  }
  segments.push_back(0);
  if (!optional)
    fail("no input '" + name + "'");
}

const std::string *KernelKeyArgs::lookupAttr(StringRef name,
                                             KeyAttrKind kind) {
  for (auto [i, attr] : llvm::enumerate(key.attrs)) {
    if (attr.first != name)
      continue;
    usedAttrs[i] = true;
    if (kind == KeyAttrKind::Optional && attr.second == "none")
      return nullptr;
    return &attr.second;
  }
  if (kind == KeyAttrKind::Required)
    fail("no attribute '" + name + "'");
  return nullptr;
}

void KernelKeyArgs::ignoreAttr(StringRef name) {
  (void)lookupAttr(name, KeyAttrKind::Optional);
}

bool KernelKeyArgs::allUsed(StringRef opName) {
  for (auto [i, input] : llvm::enumerate(key.inputs))
    if (!usedInputs[i]) {
      fail("'" + input.name + "' is no operand of " + opName);
      return false;
    }
  for (auto [i, attr] : llvm::enumerate(key.attrs))
    if (!usedAttrs[i]) {
      fail("'" + attr.first + "' is no attribute of " + opName);
      return false;
    }
  return true;
}

/// The element types of an ODS tensor constraint's summary ("ranked tensor
/// of 32-bit float or 16-bit float or bfloat16 type values") as the torch ops
/// name them ("f32, f16 or bf16").
static std::string elementWords(StringRef summary) {
  summary.consume_front("ranked tensor of ");
  summary.consume_back(" values");
  summary.consume_back(" type");
  SmallVector<StringRef> types;
  summary.split(types, " or ");
  SmallVector<std::string> words;
  for (StringRef t : types) {
    t = t.trim();
    t.consume_back(" type");
    int64_t bits;
    if (t == "bfloat16")
      words.push_back("bf16");
    else if (t.consume_back("-bit float") && !t.getAsInteger(10, bits))
      words.push_back(("f" + t).str());
    else if (t == "1-bit signless integer")
      words.push_back("bool (i1)");
    else if (t.consume_back("-bit signless integer") &&
             !t.getAsInteger(10, bits))
      words.push_back(("i" + t).str());
    else
      words.push_back(t.str());
  }
  std::string out;
  for (auto [i, w] : llvm::enumerate(words))
    out += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + w;
  return out;
}

void KernelKeyArgs::checkOperandType(bool ok, StringRef name,
                                     StringRef summary, Value v) {
  if (ok)
    return;
  std::string elem;
  llvm::raw_string_ostream os(elem);
  os << cast<ShapedType>(v.getType()).getElementType();
  fail("'" + name + "' must be " + elementWords(summary) + ", got " + elem);
}

/// Every static result of `op` within the kernels' size limit
/// (moe::checkKernelLimits), `names` its results' ODS names, in the words of
/// the torch ops: checked after the verifier (a size argument out of its range
/// is its own error), before the call allocates the results.
static LogicalResult checkResults(Operation *op, ArrayRef<StringRef> names,
                                  StringRef keyOp, Location loc) {
  for (OpResult result : op->getResults()) {
    auto type = dyn_cast<RankedTensorType>(result.getType());
    if (!type || !type.hasStaticShape())
      continue;
    int64_t count = 1;
    bool overflow = false;
    for (int64_t size : type.getShape())
      overflow |= llvm::MulOverflow(count, size, count);
    if (!overflow && count <= kMaxKernelElements)
      continue;
    std::string shape = "[";
    for (auto [i, size] : llvm::enumerate(type.getShape()))
      shape += (i ? ", " : "") + std::to_string(size);
    shape += "]";
    StringRef name = result.getResultNumber() < names.size()
                         ? names[result.getResultNumber()]
                         : StringRef("result");
    emitError(loc) << "kernel key '" << keyOp << "': the result '" << name
                   << "' of shape " << shape << " would have "
                   << (overflow ? std::string("more than 2^63")
                                : std::to_string(count))
                   << " elements, more than the kernels support: at most "
                   << kMaxKernelElements
                   << " per tensor (2^31 - 1: the kernels index with i32)";
    return failure();
  }
  return success();
}

std::optional<bool> KernelKeyArgs::parseBool(StringRef text) {
  if (text == "1" || text == "true")
    return true;
  if (text == "0" || text == "false")
    return false;
  return std::nullopt;
}

std::optional<llvm::APFloat> KernelKeyArgs::parseF32(StringRef text) {
  // The key holds doubles in their shortest round-trip form (shortestDecimal),
  // `inf`/`nan` included: one rounding to f32, as the eager ops' f32 maths.
  std::string s = text.str();
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size())
    return std::nullopt;
  return llvm::APFloat(static_cast<float>(v));
}

std::optional<int64_t> KernelKeyArgs::parseInt(StringRef text) {
  int64_t v;
  if (text.getAsInteger(10, v))
    return std::nullopt;
  return v;
}

//===----------------------------------------------------------------------===//
// The generated builders
//===----------------------------------------------------------------------===//

namespace {
/// `OpT` on `operands` and `attributes` with `numRegions` empty regions and
/// the result types its inference gives; null after an emitted error.
template <typename OpT>
Operation *createInferred(OpBuilder &b, KernelKeyArgs &args,
                          ValueRange operands,
                          ArrayRef<NamedAttribute> attributes,
                          unsigned numRegions) {
  MLIRContext *context = b.getContext();
  Location loc = args.getLoc();
  DictionaryAttr dict = DictionaryAttr::get(context, attributes);
  typename OpT::Properties properties;
  if (failed(OpT::setPropertiesFromAttr(properties, dict, [&] {
        return emitError(loc) << OpT::getOperationName() << ": ";
      })))
    return nullptr;
  // The defaults of the attributes the key leaves out, as ODS's builders set
  // them (inference reads them).
  OpT::populateDefaultProperties(OperationName(OpT::getOperationName(), context),
                                 properties);
  SmallVector<std::unique_ptr<Region>> regions;
  for (unsigned i = 0; i < numRegions; ++i)
    regions.push_back(std::make_unique<Region>());
  SmallVector<Type> types;
  if (failed(OpT::inferReturnTypes(context, loc, operands, dict,
                                   OpaqueProperties(&properties),
                                   RegionRange(regions), types)))
    return nullptr;
  OperationState state(loc, OpT::getOperationName());
  state.addOperands(operands);
  state.addTypes(types);
  state.useProperties(properties);
  for (std::unique_ptr<Region> &region : regions)
    state.addRegion(std::move(region));
  return b.create(state);
}

#include "MoE/IR/KernelKeys.cpp.inc"

constexpr StringLiteral kCustomPrefix = "custom:";

/// Parses the body of a custom score (`^bb0(%x: f32): ... moe.yield %s : f32`)
/// into `region`, which the caller's verifier then checks.
LogicalResult parseScoreRegion(StringRef body, Region &region, Location loc) {
  MLIRContext *context = loc->getContext();
  // The parser recurses once per bracket level (MoE/Support/NestingDepth.h).
  if (findExcessiveNesting(body)) {
    emitError(loc) << "kernel key 'route': the custom score's region nests "
                      "brackets deeper than "
                   << kMaxNestingDepth << " levels";
    return failure();
  }
  std::string text =
      ("\"builtin.module\"() ({\n" + body + "\n}) : () -> ()").str();
  Block holder;
  ParserConfig config(context, /*verifyAfterParse=*/false);
  if (failed(parseSourceString(text, &holder, config)) ||
      holder.getOperations().size() != 1) {
    emitError(loc) << "kernel key 'route': the custom score's region does "
                      "not parse";
    return failure();
  }
  region.takeBody(holder.front().getRegion(0));
  return success();
}

/// The results the kernel returns (its caller's output buffers): all, except
/// hyper_router_backward's d_w1 and d_w2 (results 1 and 3) without
/// weight_grads (unused results, which the lowering skips), and the capacity
/// plan's inverse and dropped (results 3 and 7).
SmallVector<unsigned> keptResults(const KernelKey &key, unsigned n) {
  if (key.op == "hyper_router_backward") {
    const std::string *grads = key.attr("weight_grads");
    if (grads && *grads == "0")
      return {0, 2, 4};
  }
  if (key.op == "apply_capacity")
    return {3, 7};
  return llvm::to_vector(llvm::seq<unsigned>(0, n));
}
} // namespace

Operation *mlir::moe::buildKernelKeyOp(OpBuilder &b, Location loc,
                                       const KernelKey &key,
                                       ValueRange inputs) {
  KernelKey adjusted = key;
  std::optional<std::string> scoreBody;
  for (auto &[name, value] : adjusted.attrs)
    if (name == "scoring" && StringRef(value).starts_with(kCustomPrefix)) {
      scoreBody = value.substr(kCustomPrefix.size());
      value = "custom";
    }
  SmallVector<Value> operands(inputs);
  // The capacity kernel takes the weights either way; the op only where they
  // order the slots.
  if (key.op == "apply_capacity") {
    const std::string *drop = key.attr("drop");
    if (!drop || *drop != "probability")
      for (auto [i, input] : llvm::enumerate(key.inputs))
        if (input.name == "weights") {
          adjusted.inputs.erase(adjusted.inputs.begin() + i);
          operands.erase(operands.begin() + i);
          break;
        }
  }
  KernelKeyArgs args(adjusted, operands, loc);
  bool known = false;
  Operation *op = buildFromKeyTable(b, adjusted.op, args, known);
  if (!known) {
    emitError(loc) << "kernel key '" << key.op << "' names no op (known: "
                   << llvm::join(ArrayRef(kKernelKeyOps), ", ") << ")";
    return nullptr;
  }
  if (op && scoreBody) {
    if (op->getNumRegions() != 1 ||
        failed(parseScoreRegion(*scoreBody, op->getRegion(0), loc))) {
      if (op->getNumRegions() != 1)
        emitError(loc) << "kernel key '" << key.op
                       << "': a custom score needs an op with a score region";
      op->erase();
      return nullptr;
    }
  }
  return op;
}

ArrayRef<StringLiteral> mlir::moe::kernelKeyOps() { return kKernelKeyOps; }

std::string mlir::moe::inKeyNames(StringRef keyText, StringRef diagnostics) {
  std::string out = diagnostics.str();
  for (auto [ods, key] : keyRenames(keyText.split('|').first)) {
    std::string from = "'" + ods.str() + "'", to = "'" + key.str() + "'";
    for (size_t at = out.find(from); at != std::string::npos;
         at = out.find(from, at + to.size()))
      out.replace(at, from.size(), to);
  }
  return out;
}

/// The element types the key's `out:` entries give results of `op` (by ODS
/// name); the verifier of the module then checks that the op takes them.
static LogicalResult setOutputTypes(Operation *op, const KernelKey &key,
                                    Location loc) {
  ArrayRef<StringRef> names = keyResultNames(key.op);
  for (const auto &[name, elemText] : key.outputs) {
    const auto *at = llvm::find(names, name);
    Type elem = findExcessiveNesting(elemText)
                    ? Type()
                    : parseType(elemText, op->getContext(), nullptr,
                                /*isKnownNullTerminated=*/false);
    if (at == names.end() || !elem ||
        static_cast<unsigned>(at - names.begin()) >= op->getNumResults()) {
      op->erase();
      return emitError(loc) << "kernel key '" << key.op << "': no result '"
                            << name << "' of element type '" << elemText
                            << "'";
    }
    OpResult result = op->getResult(at - names.begin());
    auto type = cast<RankedTensorType>(result.getType());
    result.setType(RankedTensorType::get(type.getShape(), elem));
  }
  return success();
}

OwningOpRef<ModuleOp> mlir::moe::buildKernelModule(MLIRContext *context,
                                                   StringRef text) {
  context->loadDialect<MoEDialect, func::FuncDialect>();
  Location loc = UnknownLoc::get(context);
  std::string error;
  std::optional<KernelKey> key = parseKernelKey(text, error);
  if (!key) {
    emitError(loc) << "malformed kernel key: " << error;
    return nullptr;
  }
  SmallVector<Type> inputTypes;
  for (const KernelKey::Input &input : key->inputs) {
    Type elem = findExcessiveNesting(input.elem)
                    ? Type()
                    : parseType(input.elem, context, nullptr,
                                /*isKnownNullTerminated=*/false);
    // Any element type a tensor takes: the op's type constraints name the
    // ones its operands take (a complex or f64 input is the torch op's
    // TypeError, not a malformed key).
    if (!elem || !RankedTensorType::isValidElementType(elem)) {
      emitError(loc) << "kernel key '" << key->op << "': input '"
                     << input.name << "' has no element type '" << input.elem
                     << "'";
      return nullptr;
    }
    inputTypes.push_back(RankedTensorType::get(input.shape, elem));
  }
  OpBuilder b(context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto func = func::FuncOp::create(b, loc, "kernel",
                                   b.getFunctionType(inputTypes, {}));
  Block *body = func.addEntryBlock();
  b.setInsertionPointToEnd(body);
  Operation *op = buildKernelKeyOp(b, loc, *key, body->getArguments());
  if (!op || failed(setOutputTypes(op, *key, loc)))
    return nullptr;
  SmallVector<Value> results;
  for (unsigned i : keptResults(*key, op->getNumResults())) {
    // The capacity plan keeps its dropped counts: an op built without a
    // capacity has none.
    if (i >= op->getNumResults()) {
      emitError(loc) << "kernel key '" << key->op << "': the op has no result "
                     << i << " to return (" << op->getName()
                     << " has " << op->getNumResults() << ")";
      return nullptr;
    }
    results.push_back(op->getResult(i));
  }
  func::ReturnOp::create(b, loc, results);
  func.setFunctionType(
      b.getFunctionType(inputTypes, ValueRange(results).getTypes()));
  if (failed(verify(*module)) ||
      failed(checkResults(op, keyResultNames(key->op), key->op, loc)))
    return nullptr;
  return module;
}
