//===- AdjacencyUpdateTest.cpp - moe.adjacency_update vs libtorch ---------===//
//
// Part of the MoE-MLIR project.
//
// Reference: the description of moe.adjacency_update in MoEOps.td (Symphony
// Alg. 1 lines 3-9, 15-16; eq 6-7), in float64 with torch ops (as in
// shared/spec/004_symphony_ref.py):
//   S[t,j] = 1[j in idx[t,:]] (a repeated index counts once), C = S^T S,
//   include_self = false zeroes diag(C); Norm: row / col sums (a zero row or
//   column stays zero) or none; a_next = beta a + (1 - beta) Norm(C).
//
// Tolerances: rtol 1e-6, atol 1e-6. C is exact (integer counts); the op does
// one division and one multiply-add in f32 (a few ulp of values <= T).
//
//===----------------------------------------------------------------------===//

#include "ReferenceUtils.h"

using namespace moe_ref;

namespace {

enum class Norm { Row, Col, None };

struct Options {
  double beta = 0.9;
  Norm norm = Norm::Row;
  bool includeSelf = true;
};

at::Tensor reference(const at::Tensor &a, const at::Tensor &idx,
                     const Options &o) {
  int64_t E = a.size(0), T = idx.size(0);
  at::Tensor S = at::zeros({T, E}, at::kDouble)
                     .scatter_(1, idx.to(at::kLong), 1.0);
  at::Tensor C = S.t().matmul(S);
  if (!o.includeSelf)
    C.fill_diagonal_(0);
  at::Tensor normed = C;
  if (o.norm != Norm::None) {
    at::Tensor d = C.sum(o.norm == Norm::Row ? 1 : 0, /*keepdim=*/true);
    normed = at::where(d > 0, C / d.clamp_min(1), at::zeros_like(C));
  }
  double beta = double(float(o.beta));
  return beta * a.to(at::kDouble) + (1.0 - beta) * normed;
}

std::string buildIR(const at::Tensor &a, const at::Tensor &idx,
                    const Options &o, bool dynamicTokens) {
  std::string ta = tensorType(a);
  std::string ti = dynamicTokens ? tensorType(idx, {0}) : tensorType(idx);
  std::string tr = tensorType(a.sizes().vec(), at::kFloat);
  std::string attrs = " beta(" + floatLiteral(o.beta) + ")";
  attrs += o.norm == Norm::Row   ? " norm(row)"
           : o.norm == Norm::Col ? " norm(col)"
                                 : " norm(none)";
  if (!o.includeSelf)
    attrs += " include_self(false)";
  return "func.func @f(%a: " + ta + ", %idx: " + ti + ") -> " + tr +
         " {\n  %r = moe.adjacency_update %a, %idx" + attrs + " : " + ta +
         ", " + ti + " -> " + tr + "\n  return %r : " + tr + "\n}\n";
}

void check(const at::Tensor &a, const at::Tensor &idx, const Options &o,
           bool dynamicTokens = false) {
  SCOPED_TRACE("a " + tensorType(a) + " idx " + tensorType(idx) + " beta " +
               std::to_string(o.beta) +
               (o.norm == Norm::Row   ? " row"
                : o.norm == Norm::Col ? " col"
                                      : " none") +
               (o.includeSelf ? "" : " no-self"));
  std::vector<at::Tensor> out =
      compileAndRun(buildIR(a, idx, o, dynamicTokens), {a, idx}, 1);
  if (out.empty())
    return;
  EXPECT_TRUE(allClose(out[0], reference(a, idx, o), 1e-6, 1e-6));
}

void checkAllModes(const at::Tensor &a, const at::Tensor &idx,
                   bool dynamicTokens = false) {
  for (Norm norm : {Norm::Row, Norm::Col, Norm::None})
    for (bool self : {true, false})
      for (double beta : {0.9, 0.0, 0.99}) {
        Options o;
        o.norm = norm;
        o.includeSelf = self;
        o.beta = beta;
        check(a, idx, o, dynamicTokens);
      }
}

/// Each token's top-k of random logits (distinct indices per row).
at::Tensor randomTopk(int64_t T, int64_t E, int64_t k) {
  return std::get<1>(at::randn({T, E}).topk(k)).to(at::kInt);
}

at::Tensor randomGraph(int64_t E) { return at::softmax(at::randn({E, E}), -1); }

class AdjacencyUpdate : public ::testing::Test {
protected:
  void SetUp() override { seedFromTestName(); }
};

TEST_F(AdjacencyUpdate, RandomAllModes) {
  checkAllModes(randomGraph(8), randomTopk(50, 8, 2));
  checkAllModes(randomGraph(5), randomTopk(37, 5, 1));  // k = 1
  checkAllModes(randomGraph(6), randomTopk(11, 6, 6));  // k = E
  checkAllModes(randomGraph(16), randomTopk(300, 16, 3));
  checkAllModes(at::zeros({1, 1}), at::zeros({4, 1}, at::kInt)); // E = 1
}

TEST_F(AdjacencyUpdate, RepeatedIndicesCountOnce) {
  at::Tensor idx = at::tensor({0, 0, 1, 2, 2, 2, 3, 1, 3}, at::kInt).view({3, 3});
  checkAllModes(randomGraph(4), idx);
}

TEST_F(AdjacencyUpdate, ExpertsNoTokenChoseKeepZeroRows) {
  // Experts 2 and 5 are never selected: their rows and columns of C are zero.
  at::Tensor idx = at::tensor({0, 1, 1, 3, 4, 0, 3, 1}, at::kInt).view({4, 2});
  checkAllModes(randomGraph(6), idx);
}

TEST_F(AdjacencyUpdate, ZeroTokens) {
  // T = 0 (dynamic): C = 0, a_next = beta a.
  checkAllModes(randomGraph(5), at::zeros({0, 2}, at::kInt), true);
}

TEST_F(AdjacencyUpdate, DynamicTokenCount) {
  checkAllModes(randomGraph(7), randomTopk(19, 7, 2), true);
}

TEST_F(AdjacencyUpdate, Int64IndicesAndHalfPrecisionGraph) {
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    Options o;
    check(randomGraph(6).to(t), randomTopk(25, 6, 2).to(at::kLong), o);
    o.norm = Norm::Col;
    o.includeSelf = false;
    check(randomGraph(6).to(t), randomTopk(25, 6, 3), o);
  }
}

TEST_F(AdjacencyUpdate, BetaOneFreezesTheGraph) {
  Options o;
  o.beta = 1.0;
  at::Tensor a = randomGraph(5);
  check(a, randomTopk(10, 5, 2), o);
}

TEST_F(AdjacencyUpdate, SymphonyReferenceExample) {
  // shared/spec/004_symphony_ref.py: the logits L, k = 2, beta = 0.9, A0 = 0.
  at::Tensor L = at::tensor({2.0, 1.0, 0.0, -1.0, 0.5, 2.5, 1.5, 0.0, 1.0, 0.0,
                             3.0, 2.0, 3.0, -1.0, 0.0, 2.0, 0.0, 1.0, 2.0, -0.5},
                            at::kFloat)
                     .view({5, 4});
  at::Tensor idx = stableTopk(L, 2).second.to(at::kInt);
  Options o;
  auto module = compile(buildIR(at::zeros({4, 4}), idx, o, false));
  ASSERT_TRUE(module);
  auto a1 = run(*module, "f", {at::zeros({4, 4}), idx});
  ASSERT_EQ(a1.size(), 1u);
  // Every row of Norm(C) sums to 1, so rows of a1 sum to 1 - beta.
  EXPECT_TRUE(allClose(a1[0].sum(1), at::full({4}, 0.1), 1e-6, 1e-7));
  auto a2 = run(*module, "f", {a1[0], idx});
  ASSERT_EQ(a2.size(), 1u);
  EXPECT_TRUE(allClose(a2[0].sum(1), at::full({4}, 0.19), 1e-6, 1e-7));
  EXPECT_TRUE(allClose(a2[0], reference(a1[0], idx, o), 1e-6, 1e-6));
}

TEST_F(AdjacencyUpdate, OutOfRangeIndexIsARuntimeError) {
  for (int64_t bad : {5, -1}) {
    at::Tensor idx = randomTopk(4, 5, 2);
    idx[2][1] = bad;
    Options o;
    auto module = compile(buildIR(randomGraph(5), idx, o, false));
    ASSERT_TRUE(module);
    std::string msg = runExpectingError(*module, "f", {randomGraph(5), idx});
    EXPECT_NE(msg.find("moe.adjacency_update: 'idx' element 5 is " +
                       std::to_string(bad) + ", outside [0, 5)"),
              std::string::npos)
        << msg;
  }
}

} // namespace
