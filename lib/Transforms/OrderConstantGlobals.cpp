//===- OrderConstantGlobals.cpp - Deterministic constant globals ----------===//
//
// Part of the MoE-MLIR project.
//
// Upstream one-shot module bufferization visits the functions without calls
// in the iteration order of a DenseMap keyed by FuncOp (an address), and each
// function's tensor constants become module globals in that order: the text
// of a lowered module changed from run to run. This pass fixes the order (and
// the `_N` suffixes) by the first use in the IR, which the input determines.
//
//===----------------------------------------------------------------------===//

#include "MoE/Transforms/Passes.h"

#include "mlir/IR/SymbolTable.h"

#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEORDERCONSTANTGLOBALS
#include "MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

static constexpr StringLiteral kPrefix = "__constant_";

/// `__constant_` + the memref's shape, as bufferization spells it
/// (memref<5x4xf32> -> __constant_5x4xf32).
static std::string baseName(memref::GlobalOp global) {
  std::string name = kPrefix.str();
  llvm::raw_string_ostream os(name);
  MemRefType type = global.getType();
  for (int64_t size : type.getShape())
    os << size << 'x';
  os << type.getElementType();
  return name;
}

void moe::orderConstantGlobals(ModuleOp module) {
  SymbolTable table(module);
  // Bufferization's constant globals, in the order of their first use.
  llvm::SetVector<memref::GlobalOp> order;
  module.walk([&](memref::GetGlobalOp get) {
    auto global = table.lookup<memref::GlobalOp>(get.getName());
    if (global && global.getConstant() && global.isPrivate() &&
        global.getSymName().starts_with(kPrefix))
      order.insert(global);
  });
  if (order.empty())
    return;
  // Two steps, so that no new name meets an old one of this set.
  MLIRContext *ctx = module.getContext();
  for (auto [i, global] : llvm::enumerate(order))
    (void)table.rename(global,
                       StringAttr::get(ctx, "__moe_constant_" + Twine(i)));
  llvm::StringMap<unsigned> uses;
  Operation *previous = nullptr;
  for (memref::GlobalOp global : order) {
    std::string base = baseName(global);
    std::string name;
    // The n-th global of a shape is base_{n-2} after the unsuffixed first
    // (bufferization's scheme); skip names some other symbol holds.
    while (true) {
      unsigned n = uses[base]++;
      name = n == 0 ? base : base + "_" + std::to_string(n - 1);
      if (!table.lookup(name))
        break;
    }
    (void)table.rename(global, StringAttr::get(ctx, name));
    if (previous)
      global->moveAfter(previous);
    else
      global->moveBefore(&module.getBody()->front());
    previous = global;
  }
}

namespace {
struct MoEOrderConstantGlobals
    : moe::impl::MoEOrderConstantGlobalsBase<MoEOrderConstantGlobals> {
  void runOnOperation() override { moe::orderConstantGlobals(getOperation()); }
};
} // namespace
