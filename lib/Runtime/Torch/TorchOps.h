//===- TorchOps.h - The kernels that TorchOps.def registers -----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// What the op table (TorchOps.def) names, for Registration.cpp, by the file
// that defines it: each op's backend kernel (one for CPU and CUDA tensors:
// the kernel key names the device), and the Autograd kernels (the ops' C++
// autograd, and the boxed kernel of the ops without one). The arguments are
// the op's schema's (python/moe_mlir/ops/), in order; a schema `int` is
// c10::SymInt at the Autograd key and int64_t below it.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_TORCHOPS_H
#define MOE_LIB_RUNTIME_TORCH_TORCHOPS_H

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace torch {
class CppFunction;
} // namespace torch

namespace moe_torch {

using at::Tensor;

//===----------------------------------------------------------------------===//
// The dialect's mixing and seed-router ops (TorchOps.cpp)
//===----------------------------------------------------------------------===//

std::tuple<Tensor, Tensor>
topkRenorm(const Tensor &scores, int64_t k, c10::string_view mode,
           bool renormalize, std::optional<at::ScalarType> indicesDtype);
Tensor similarityInform(const Tensor &u, const Tensor &e,
                        const std::optional<Tensor> &ws,
                        const std::optional<Tensor> &mask, double tau,
                        bool causal);
std::tuple<Tensor, Tensor>
similarityInformTopk(const Tensor &u, const Tensor &e, int64_t k,
                     const std::optional<Tensor> &ws,
                     const std::optional<Tensor> &mask, double tau, bool causal,
                     bool renormalize);
/// similarity_inform for training: p and the row log-sum-exp [B, N] that its
/// backward reads.
std::tuple<Tensor, Tensor>
similarityInformFwd(const Tensor &u, const Tensor &e,
                    const std::optional<Tensor> &ws,
                    const std::optional<Tensor> &mask, double tau, bool causal);
std::tuple<Tensor, Tensor> attentionPosterior(const Tensor &scores,
                                              const Tensor &u, const Tensor &v,
                                              const Tensor &wo, const Tensor &e,
                                              double sigma,
                                              c10::string_view headSelect,
                                              std::optional<double> headScale);
std::tuple<Tensor, Tensor, Tensor>
attentionPosteriorTopk(const Tensor &scores, const Tensor &u, const Tensor &v,
                       const Tensor &wo, const Tensor &e, int64_t k,
                       double sigma, c10::string_view headSelect,
                       std::optional<double> headScale, bool renormalize);
std::tuple<Tensor, Tensor>
madDispersion(const Tensor &tokens, const Tensor &assign, int64_t numExperts,
              double eps, double clip, c10::string_view normalize,
              c10::string_view measure, c10::string_view empty);
Tensor adjacencyUpdate(const Tensor &a, const Tensor &idx, double beta,
                       c10::string_view norm, bool includeSelf);
std::tuple<Tensor, Tensor> hyperRouter(const Tensor &emb, const Tensor &w1,
                                       const Tensor &b1, const Tensor &w2,
                                       const Tensor &b2, int64_t numExperts);

//===----------------------------------------------------------------------===//
// Production routing (RoutingOps.cpp)
//===----------------------------------------------------------------------===//

std::tuple<Tensor, Tensor>
route(const Tensor &logits, const std::optional<Tensor> &bias, int64_t k,
      c10::string_view scoring, c10::string_view order, int64_t nGroup,
      int64_t topkGroup, c10::string_view groupScore, bool renormalize,
      double routedScalingFactor, const std::optional<Tensor> &replay,
      std::optional<at::ScalarType> indicesDtype);
Tensor routeBackward(const Tensor &gradW, const Tensor &logits,
                     const Tensor &indices, c10::string_view scoring,
                     bool renormalize, double routedScalingFactor);
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
dispatchPlan(const Tensor &indices, int64_t numExperts, int64_t blockSize);

//===----------------------------------------------------------------------===//
// The backward ops (GradOps.cpp)
//===----------------------------------------------------------------------===//

std::tuple<Tensor, Tensor, Tensor>
similarityInformBackward(const Tensor &dp, const Tensor &u, const Tensor &e,
                         const std::optional<Tensor> &ws,
                         const std::optional<Tensor> &mask, double tau,
                         bool causal, const std::optional<Tensor> &p,
                         const std::optional<Tensor> &lse);
Tensor topkRenormBackward(const Tensor &gradW, const Tensor &scores,
                          const Tensor &indices, c10::string_view mode,
                          bool renormalize);
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>
hyperRouterBackward(const Tensor &gradW, const Tensor &gradB, const Tensor &emb,
                    const Tensor &w1, const Tensor &b1, const Tensor &w2,
                    const Tensor &b2, int64_t numExperts, bool weightGrads);
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> attentionPosteriorBackward(
    const Tensor &dp, const Tensor &scores, const Tensor &u, const Tensor &v,
    const Tensor &wo, const Tensor &e, const std::optional<Tensor> &head,
    double sigma, c10::string_view headSelect, std::optional<double> headScale);

//===----------------------------------------------------------------------===//
// The load-balancing losses (BalanceOps.cpp)
//===----------------------------------------------------------------------===//

std::tuple<Tensor, Tensor, Tensor>
routerStatsFwd(const Tensor &logits, int64_t topK,
               const std::optional<Tensor> &mask);
std::tuple<Tensor, Tensor> routerStats(const Tensor &logits, int64_t topK,
                                       const std::optional<Tensor> &mask);
Tensor loadBalancingLoss(const Tensor &logits, int64_t topK,
                         const std::optional<Tensor> &mask);
Tensor routerStatsBackward(const Tensor &gradProbs, const Tensor &logits,
                           const std::optional<Tensor> &mask,
                           const Tensor &weightSum);
Tensor routerZLoss(const Tensor &logits);
Tensor routerZLossBackward(const Tensor &grad, const Tensor &logits);
Tensor sequenceBalanceLoss(const Tensor &scores, const Tensor &indices,
                           int64_t topK);
Tensor sequenceBalanceLossBackward(const Tensor &grad, const Tensor &scores,
                                   const Tensor &indices, int64_t topK);

//===----------------------------------------------------------------------===//
// Capacity and bias balancing (CapacityOps.cpp)
//===----------------------------------------------------------------------===//

std::tuple<Tensor, Tensor> applyCapacity(const Tensor &indices,
                                         const Tensor &weights,
                                         int64_t numExperts, int64_t capacity,
                                         c10::string_view drop);
Tensor biasUpdate(const Tensor &bias, const Tensor &counts, double rate);

//===----------------------------------------------------------------------===//
// The Autograd kernels (AutogradCPU, AutogradCUDA)
//===----------------------------------------------------------------------===//

// The differentiable dialect ops' C++ autograd (Autograd.cpp).
std::tuple<Tensor, Tensor>
topkRenormAutograd(const Tensor &scores, c10::SymInt k, c10::string_view mode,
                   bool renormalize, std::optional<at::ScalarType> indicesDtype);
Tensor similarityInformAutograd(const Tensor &u, const Tensor &e,
                                const std::optional<Tensor> &ws,
                                const std::optional<Tensor> &mask, double tau,
                                bool causal);
std::tuple<Tensor, Tensor>
similarityInformTopkAutograd(const Tensor &u, const Tensor &e, c10::SymInt k,
                             const std::optional<Tensor> &ws,
                             const std::optional<Tensor> &mask, double tau,
                             bool causal, bool renormalize);
std::tuple<Tensor, Tensor>
attentionPosteriorAutograd(const Tensor &scores, const Tensor &u,
                           const Tensor &v, const Tensor &wo, const Tensor &e,
                           double sigma, c10::string_view headSelect,
                           std::optional<double> headScale);
std::tuple<Tensor, Tensor, Tensor> attentionPosteriorTopkAutograd(
    const Tensor &scores, const Tensor &u, const Tensor &v, const Tensor &wo,
    const Tensor &e, c10::SymInt k, double sigma, c10::string_view headSelect,
    std::optional<double> headScale, bool renormalize);
std::tuple<Tensor, Tensor>
hyperRouterAutograd(const Tensor &emb, const Tensor &w1, const Tensor &b1,
                    const Tensor &w2, const Tensor &b2, c10::SymInt numExperts);

// The load-balancing losses' C++ autograd (BalanceOps.cpp).
Tensor loadBalancingLossAutograd(const Tensor &logits, c10::SymInt topK,
                                 const std::optional<Tensor> &mask);
std::tuple<Tensor, Tensor>
routerStatsAutograd(const Tensor &logits, c10::SymInt topK,
                    const std::optional<Tensor> &mask);
Tensor routerZLossAutograd(const Tensor &logits);
Tensor sequenceBalanceLossAutograd(const Tensor &scores, const Tensor &indices,
                                   c10::SymInt topK);

/// The boxed Autograd kernel of an op without a C++ autograd (TorchOps.cpp):
/// straight to the op's backend kernel when no gradient is wanted, else, for
/// a `differentiable` op, the op's Python autograd; a stop-gradient op
/// (`differentiable` false) never records one.
torch::CppFunction autogradKernel(bool differentiable);

} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_TORCHOPS_H
