//===- ZeroSizedTest.cpp - moe ops with zero tokens through the API -------===//
//
// Part of the MoE-MLIR project.
//
// Issue #15: a dynamic size that is zero at run time (a decode step routing
// no token, an empty batch) goes through the execution API like any other:
// the compiled kernels (moe-lower-to-llvm, fast CPU kernels, threads) return
// empty results of the right shape or the defined values, and the same
// compiled function is right on the next non-empty call.
//
//===----------------------------------------------------------------------===//

#include "CompiledModuleTest.h"
#include "MoE/Runtime/Executor.h"

#include "gtest/gtest.h"

#include <cmath>
#include <vector>

using namespace mlir::moe;

namespace {

const char *kModule = R"mlir(
func.func @topk(%s: tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
func.func @similarity(%u: tensor<?x?x3xf32>, %e: tensor<?x?x2xf32>) -> tensor<?x?x2xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<?x?x3xf32>, tensor<?x?x2xf32> -> tensor<?x?x2xf32>
  return %p : tensor<?x?x2xf32>
}
func.func @posterior(%s: tensor<?x2x?x?xf32>, %u: tensor<?x?x3xf32>, %v: tensor<?x2x?x2xf32>, %wo: tensor<3x4xf32>,
                     %e: tensor<?x?x3xf32>) -> (tensor<?x?x3xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>
      -> tensor<?x?x3xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x3xf32>, tensor<?xi32>
}
func.func @mad(%x: tensor<?x3xf32>, %a: tensor<?xi32>) -> (tensor<2x3xf32>, tensor<2xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(2) : tensor<?x3xf32>, tensor<?xi32> -> tensor<2x3xf32>, tensor<2xi32>
  return %w, %c : tensor<2x3xf32>, tensor<2xi32>
}
func.func @adjacency(%a: tensor<2x2xf32>, %i: tensor<?x2xi32>) -> tensor<2x2xf32> {
  %n = moe.adjacency_update %a, %i beta(5.000000e-01) norm(none) : tensor<2x2xf32>, tensor<?x2xi32> -> tensor<2x2xf32>
  return %n : tensor<2x2xf32>
}
func.func @route(%l: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.route %l k(2) renormalize(true) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
func.func @plan(%idx: tensor<?x2xi32>) -> (tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
                                           tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(3) block_size(2)
      : tensor<?x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n
      : tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
)mlir";

class ZeroSizedTest : public CompiledModuleTest<ZeroSizedTest> {
public:
  static const char *source() { return kModule; }

protected:
  /// Calls `fn`; fails the test on an error.
  static std::vector<Tensor> call(llvm::StringRef fn,
                                  llvm::ArrayRef<HostTensor> inputs) {
    auto results = module->call(fn, inputs);
    if (!results) {
      ADD_FAILURE() << fn.str() << ": " << llvm::toString(results.takeError());
      return {};
    }
    return std::move(*results);
  }
};

using Shape = std::vector<int64_t>;
Shape shapeOf(const Tensor &t) { return Shape(t.shape().begin(), t.shape().end()); }
template <typename T> std::vector<T> valuesOf(const Tensor &t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numElements());
}

TEST_F(ZeroSizedTest, TopkWithoutTokensThenWithTokens) {
  auto r = call("topk", {HostTensor(DType::F32, {0, 4}, nullptr)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(shapeOf(r[0]), (Shape{0, 2}));
  EXPECT_EQ(shapeOf(r[1]), (Shape{0, 2}));
  // The same function on one token: experts 3 and 1, softmax over the two.
  std::vector<float> s = {0.0f, 1.0f, -1.0f, 2.0f};
  r = call("topk", {HostTensor(DType::F32, {1, 4}, s.data())});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(valuesOf<int32_t>(r[1]), (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r[0].data<float>()[0], 1.0f / (1.0f + std::exp(-1.0f)), 1e-6);
}

TEST_F(ZeroSizedTest, SimilarityWithoutSequencesOrTokens) {
  auto r = call("similarity", {HostTensor(DType::F32, {0, 5, 3}, nullptr),
                               HostTensor(DType::F32, {0, 5, 2}, nullptr)});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(shapeOf(r[0]), (Shape{0, 5, 2}));
  r = call("similarity", {HostTensor(DType::F32, {2, 0, 3}, nullptr),
                          HostTensor(DType::F32, {2, 0, 2}, nullptr)});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(shapeOf(r[0]), (Shape{2, 0, 2}));
}

TEST_F(ZeroSizedTest, PosteriorWithoutKeysIsZeroWithHeadZero) {
  // Nk = 0: every row fully masked (p = 0); every head's mean entropy is 0,
  // the lowest index wins.
  std::vector<float> u(2 * 3, 1.0f), wo(3 * 4, 1.0f);
  auto r = call("posterior", {HostTensor(DType::F32, {1, 2, 2, 0}, nullptr),
                              HostTensor(DType::F32, {1, 2, 3}, u.data()),
                              HostTensor(DType::F32, {1, 2, 0, 2}, nullptr),
                              HostTensor(DType::F32, {3, 4}, wo.data()),
                              HostTensor(DType::F32, {1, 0, 3}, nullptr)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(shapeOf(r[0]), (Shape{1, 2, 3}));
  EXPECT_EQ(valuesOf<float>(r[0]), std::vector<float>(6, 0.0f));
  EXPECT_EQ(valuesOf<int32_t>(r[1]), (std::vector<int32_t>{0}));
  // B = 0: empty p and head.
  r = call("posterior", {HostTensor(DType::F32, {0, 2, 2, 4}, nullptr),
                         HostTensor(DType::F32, {0, 2, 3}, nullptr),
                         HostTensor(DType::F32, {0, 2, 4, 2}, nullptr),
                         HostTensor(DType::F32, {3, 4}, wo.data()),
                         HostTensor(DType::F32, {0, 4, 3}, nullptr)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(shapeOf(r[0]), (Shape{0, 2, 3}));
  EXPECT_EQ(shapeOf(r[1]), (Shape{0}));
}

TEST_F(ZeroSizedTest, MadWithoutTokensIsIdentity) {
  auto r = call("mad", {HostTensor(DType::F32, {0, 3}, nullptr),
                        HostTensor(DType::I32, {0}, nullptr)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(valuesOf<float>(r[0]), std::vector<float>(6, 1.0f));
  EXPECT_EQ(valuesOf<int32_t>(r[1]), (std::vector<int32_t>{0, 0}));
}

TEST_F(ZeroSizedTest, AdjacencyWithoutTokensDecays) {
  std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f};
  auto r = call("adjacency", {HostTensor(DType::F32, {2, 2}, a.data()),
                              HostTensor(DType::I32, {0, 2}, nullptr)});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(valuesOf<float>(r[0]), (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
}

TEST_F(ZeroSizedTest, RouteWithoutTokens) {
  auto r = call("route", {HostTensor(DType::F32, {0, 8}, nullptr)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(shapeOf(r[0]), (Shape{0, 2}));
  EXPECT_EQ(shapeOf(r[1]), (Shape{0, 2}));
}

TEST_F(ZeroSizedTest, DispatchPlanWithoutTokens) {
  // N = 0 assignments, E = 3, block 2: N + E·(B-1) = 3 padding slots holding
  // N = 0, ceil(3/2) = 2 blocks of no expert, nothing used.
  auto r = call("plan", {HostTensor(DType::I32, {0, 2}, nullptr)});
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(valuesOf<int32_t>(r[0]), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(valuesOf<int32_t>(r[1]), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(shapeOf(r[2]), (Shape{0}));
  EXPECT_EQ(shapeOf(r[3]), (Shape{0}));
  EXPECT_EQ(valuesOf<int32_t>(r[4]), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(valuesOf<int32_t>(r[5]), (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(valuesOf<int32_t>(r[6]), (std::vector<int32_t>{0}));
}

// The other end of the sizes: a dynamic token count whose tensor has more
// than 2^31 - 1 elements (the kernels index with i32) is rejected before the
// call, naming the limit; so is one whose element count overflows int64. The
// data is never read: the check only looks at the shape.
TEST_F(ZeroSizedTest, OverI32ElementsIsRejectedNamingTheLimit) {
  float dummy[4] = {};
  for (int64_t rows : {int64_t(1) << 29, int64_t(1) << 62}) {
    auto r = module->call("topk", {HostTensor(DType::F32, {rows, 4}, dummy)});
    ASSERT_FALSE(static_cast<bool>(r)) << rows;
    std::string msg = llvm::toString(r.takeError());
    EXPECT_NE(msg.find("@topk: input #0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at most 2147483647 per tensor"), std::string::npos)
        << msg;
  }
  // The rejected calls leave the module usable.
  std::vector<float> s = {0.0f, 1.0f, -1.0f, 2.0f};
  auto ok = call("topk", {HostTensor(DType::F32, {1, 4}, s.data())});
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(valuesOf<int32_t>(ok[1]), (std::vector<int32_t>{3, 1}));
}

} // namespace
