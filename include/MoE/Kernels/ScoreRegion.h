//===- ScoreRegion.h - Inline and differentiate a score region --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The custom score f of moe.route / moe.route_grad (MoERoutingOps.td, "Custom
// scores") is the body of a one-block region: the f32 logit in, the f32 score
// out through moe.yield, in between ScoreRegion.h's (MoE/IR) elementwise
// arith/math ops. Every lowering inlines that body where it computes a preset
// score (the CPU kernel on vector<16xf32> chunks, the GPU kernels on a lane's
// scalars, the portable lowering in a linalg.generic body), and the backward
// kernels emit f' next to f with a forward-mode symbolic derivative.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_SCOREREGION_H
#define MOE_KERNELS_SCOREREGION_H

#include "MoE/Kernels/Builder.h"

#include <utility>

namespace mlir::moe::kernels {

/// f(x) from the score region's block `body`, emitted at kb's insertion
/// point on x's type (f32, or a vector of f32: every op is elementwise, so a
/// clone with its result type reshaped computes f lane by lane). math.exp goes
/// through kb.exp, the target's exp (the CPU's polynomial), as the sigmoid
/// preset's does.
Value emitScoreBody(KernelBuilder &kb, Block &body, Value x);

/// f(x) and f'(x) (forward mode over the block: each value's derivative with
/// respect to the logit next to it). The ops are those the verifier of
/// moe.route_grad accepts (MoE/IR/ScoreRegion.h: Differentiable).
std::pair<Value, Value> emitScoreAndDerivative(KernelBuilder &kb, Block &body,
                                               Value x);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_SCOREREGION_H
