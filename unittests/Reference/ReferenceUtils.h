//===- ReferenceUtils.h - Helpers of the libtorch reference tests -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The reference tests build the IR of one moe op for the shapes and attributes
// of a case, compile it with the Executor, run it twice (the two runs must be
// bit-identical) and compare the results with a libtorch reference written
// from the op's description in MoEOps.td.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_UNITTESTS_REFERENCE_REFERENCEUTILS_H
#define MOE_UNITTESTS_REFERENCE_REFERENCEUTILS_H

#include "MoE/Runtime/Executor.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace moe_ref {

using mlir::moe::CompiledModule;
using mlir::moe::DType;
using mlir::moe::HostTensor;

/// "f32", "bf16", "i1", ... for a torch dtype.
std::string mlirElementType(at::ScalarType type);

/// "tensor<2x3xf32>"; a size of -1 prints as `?`.
std::string tensorType(llvm::ArrayRef<int64_t> shape, at::ScalarType type);
std::string tensorType(const at::Tensor &t);
/// `t`'s type with the dimensions in `dynamicDims` written as `?`.
std::string tensorType(const at::Tensor &t,
                       std::initializer_list<int> dynamicDims);

/// A float attribute literal that round-trips f32 exactly ("5.000000000e-01").
std::string floatLiteral(double value);

/// A view of a contiguous CPU tensor.
HostTensor view(const at::Tensor &t);

/// Compiles `ir`; on failure records a test failure (with the diagnostics and
/// the IR) and returns nullptr.
std::unique_ptr<CompiledModule> compile(const std::string &ir);

/// Calls `fn` on `inputs` (made contiguous) twice, checks that the two runs are
/// bit-identical and returns the results. Records a failure and returns {} when
/// a call fails.
std::vector<at::Tensor> run(const CompiledModule &module, const std::string &fn,
                            std::vector<at::Tensor> inputs);

/// Compiles `ir` and runs its @f on `inputs` (compile, then run): the
/// results, or {} with a recorded failure when it does not compile, a call
/// fails, or it returns other than `numResults` results.
std::vector<at::Tensor> compileAndRun(const std::string &ir,
                                      std::vector<at::Tensor> inputs,
                                      size_t numResults);

/// Calls `fn` and expects it to fail; returns the error text ("" and a test
/// failure when it succeeded).
std::string runExpectingError(const CompiledModule &module,
                              const std::string &fn,
                              std::vector<at::Tensor> inputs);

/// Elementwise |actual - expected| <= atol + rtol * |expected| (in float64),
/// same shape, NaN exactly where expected has NaN, infinities equal. The
/// message names the worst element.
::testing::AssertionResult allClose(const at::Tensor &actual,
                                    const at::Tensor &expected, double rtol,
                                    double atol);

/// Same shape and exactly equal values (integers, or floats bit for bit up to
/// NaN payloads).
::testing::AssertionResult exactlyEqual(const at::Tensor &actual,
                                        const at::Tensor &expected);

/// The tie-aware top-k of every row of `scores` ([..., K]), as the moe dialect
/// defines it: descending value, NaN above every number, ties (and NaNs) in
/// ascending index order. Returns the selected values (same dtype) and their
/// int64 indices, both [..., k]. torch.topk leaves the order of ties
/// unspecified, hence a stable sort.
std::pair<at::Tensor, at::Tensor> stableTopk(const at::Tensor &scores,
                                             int64_t k);

/// Shannon entropy (natural log) of the last dimension, with 0 log 0 = 0.
at::Tensor entropy(const at::Tensor &probs);

/// A random row-stochastic tensor (softmax of Gaussian logits scaled by
/// `temperature`), float32.
at::Tensor randomProbs(llvm::ArrayRef<int64_t> shape, double temperature = 1.0);

/// Seeds libtorch's generator from the test's name, so that every test case
/// has its own reproducible inputs.
void seedFromTestName();

} // namespace moe_ref

#endif // MOE_UNITTESTS_REFERENCE_REFERENCEUTILS_H
