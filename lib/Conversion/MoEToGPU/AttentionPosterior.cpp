#include "KernelUtils.h"
#include "Lowerings.h"
using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
LogicalResult mlir::moe::gpu_lowering::lowerAttentionPosterior(Operation *op, ModuleOp, const LoweringOptions &) { return op->emitOpError("GPU lowering not implemented yet"); }
