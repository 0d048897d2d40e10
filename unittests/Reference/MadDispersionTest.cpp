//===- MadDispersionTest.cpp - moe.mad_dispersion vs libtorch -------------===//
//
// Part of the MoE-MLIR project.
//
// Reference: the description of moe.mad_dispersion in MoEOps.td (ACMoE Def. 1
// and "Implementation details"), in float64 with torch ops:
//   mu = per-cluster mean; s = mean |x - mu| (mad) or (x - mu)^2 (variance);
//   W = 1/(s + eps); clip > 0: W = min(W, clip * mean(W)); then mean 1 per
//   feature column / expert row / globally. empty = identity: clusters with
//   fewer than 2 tokens get W = 1 and stay out of every statistic; raw: they
//   enter them with mu = s = 0.
//
// Tolerances (op in f32 with fixed-order sums, reference in f64): rtol 1e-4,
// atol 1e-5. f32 cluster sums over <= a few hundred O(1) tokens are exact to
// ~1e-6 relative; 1/(s + eps) amplifies a relative error of s by
// s/(s + eps) <= 1, each mean adds ~E*D ulp. counts are exact.
//
//===----------------------------------------------------------------------===//

#include "ReferenceUtils.h"

#include <cmath>
#include <limits>

using namespace moe_ref;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Normalize { Feature, Expert, Global };
enum class Measure { Mad, Variance };
enum class Empty { Identity, Raw };

struct Options {
  int64_t numExperts = 4;
  double eps = 1e-4;
  double clip = 10.0;
  Normalize normalize = Normalize::Feature;
  Measure measure = Measure::Mad;
  Empty empty = Empty::Identity;
};

std::pair<at::Tensor, at::Tensor> reference(const at::Tensor &tokens,
                                            const at::Tensor &assign,
                                            const Options &o) {
  int64_t E = o.numExperts, D = tokens.size(1);
  at::Tensor x = tokens.to(at::kDouble);
  at::Tensor a = assign.to(at::kLong);
  at::Tensor counts = at::bincount(a, {}, E).to(at::kDouble); // [E]
  at::Tensor n = counts.unsqueeze(1).clamp_min(1);
  at::Tensor mu = at::zeros({E, D}, at::kDouble).index_add(0, a, x) / n;
  at::Tensor dev = x - mu.index_select(0, a);
  dev = o.measure == Measure::Mad ? dev.abs() : dev * dev;
  at::Tensor s = at::zeros({E, D}, at::kDouble).index_add(0, a, dev) / n;
  at::Tensor W = 1.0 / (s + double(float(o.eps)));

  at::Tensor valid = o.empty == Empty::Identity
                         ? (counts >= 2).unsqueeze(1).expand({E, D})
                         : at::ones({E, D}, at::kBool);
  at::Tensor validF = valid.to(at::kDouble);
  // NaN must propagate through the statistics: multiply by the mask only
  // where it is 1 (0 * NaN would be NaN for the excluded rows too).
  at::Tensor Wv = at::where(valid, W, at::zeros_like(W));
  auto mean = [&](at::OptionalIntArrayRef dims) {
    return Wv.sum(dims, true) / validF.sum(dims, true);
  };
  if (o.clip > 0) {
    at::Tensor thr = double(float(o.clip)) * mean(at::IntArrayRef{0, 1});
    W = at::minimum(W, thr);
    Wv = at::where(valid, W, at::zeros_like(W));
  }
  switch (o.normalize) {
  case Normalize::Feature:
    W = W / mean(at::IntArrayRef{0});
    break;
  case Normalize::Expert:
    W = W / mean(at::IntArrayRef{1});
    break;
  case Normalize::Global:
    W = W / mean(at::IntArrayRef{0, 1});
    break;
  }
  W = at::where(valid, W, at::ones_like(W));
  return {W, counts.to(at::kInt)};
}

std::string buildIR(const at::Tensor &tokens, const at::Tensor &assign,
                    const Options &o, bool dynamicTokens) {
  std::string tx = dynamicTokens ? tensorType(tokens, {0}) : tensorType(tokens);
  std::string ta = dynamicTokens ? tensorType(assign, {0}) : tensorType(assign);
  std::string tw = tensorType({o.numExperts, tokens.size(1)}, at::kFloat);
  std::string tc = tensorType({o.numExperts}, at::kInt);
  std::string attrs = " num_experts(" + std::to_string(o.numExperts) +
                      ") eps(" + floatLiteral(o.eps) + ") clip(" +
                      floatLiteral(o.clip) + ")";
  attrs += o.normalize == Normalize::Feature  ? " normalize(feature)"
           : o.normalize == Normalize::Expert ? " normalize(expert)"
                                              : " normalize(global)";
  attrs += o.measure == Measure::Mad ? " measure(mad)" : " measure(variance)";
  attrs += o.empty == Empty::Identity ? " empty(identity)" : " empty(raw)";
  return "func.func @f(%x: " + tx + ", %a: " + ta + ") -> (" + tw + ", " + tc +
         ") {\n  %w, %c = moe.mad_dispersion %x, %a" + attrs + "\n      : " +
         tx + ", " + ta + " -> " + tw + ", " + tc + "\n  return %w, %c : " +
         tw + ", " + tc + "\n}\n";
}

std::string describe(const Options &o) {
  return "E=" + std::to_string(o.numExperts) + " eps=" +
         std::to_string(o.eps) + " clip=" + std::to_string(o.clip) +
         (o.normalize == Normalize::Feature  ? " feature"
          : o.normalize == Normalize::Expert ? " expert"
                                             : " global") +
         (o.measure == Measure::Mad ? " mad" : " variance") +
         (o.empty == Empty::Identity ? " identity" : " raw");
}

void check(const at::Tensor &tokens, const at::Tensor &assign,
           const Options &o, bool dynamicTokens = false, double rtol = 1e-4,
           double atol = 1e-5) {
  SCOPED_TRACE("tokens " + tensorType(tokens) + " assign " +
               tensorType(assign) + " " + describe(o));
  std::vector<at::Tensor> out = compileAndRun(
      buildIR(tokens, assign, o, dynamicTokens), {tokens, assign}, 2);
  if (out.empty())
    return;
  auto [W, counts] = reference(tokens, assign, o);
  EXPECT_TRUE(exactlyEqual(out[1], counts)) << "counts";
  EXPECT_TRUE(allClose(out[0], W, rtol, atol)) << "weights";
}

void checkAllModes(const at::Tensor &tokens, const at::Tensor &assign,
                   int64_t E, double clip = 10.0) {
  Options o;
  o.numExperts = E;
  o.clip = clip;
  for (Normalize nz : {Normalize::Feature, Normalize::Expert, Normalize::Global})
    for (Measure m : {Measure::Mad, Measure::Variance})
      for (Empty em : {Empty::Identity, Empty::Raw}) {
        o.normalize = nz;
        o.measure = m;
        o.empty = em;
        check(tokens, assign, o);
      }
}

class MadDispersion : public ::testing::Test {
protected:
  void SetUp() override { seedFromTestName(); }
};

//===----------------------------------------------------------------------===//
// Random shapes, every mode
//===----------------------------------------------------------------------===//

TEST_F(MadDispersion, RandomAllModes) {
  // Every cluster populated; non-power-of-two T and D.
  at::Tensor assign = at::cat({at::arange(5), at::randint(0, 5, {32})})
                          .to(at::kInt);
  assign = assign.index_select(0, at::randperm(37));
  checkAllModes(at::randn({37, 7}), assign, 5);
  // More tokens, LayerNorm'd features.
  at::Tensor x = at::layer_norm(at::randn({300, 24}), {24});
  checkAllModes(x, at::randint(0, 8, {300}).to(at::kInt), 8);
}

TEST_F(MadDispersion, ClippingEngaged) {
  // A near-constant feature gives W ~ 1/eps: with clip = 1.5 many entries are
  // clipped, with clip = 0 none.
  at::Tensor x = at::randn({60, 6});
  x.select(1, 2).fill_(0.25);
  x.select(1, 4).mul_(1e-3);
  at::Tensor assign = at::randint(0, 3, {60}).to(at::kInt);
  checkAllModes(x, assign, 3, 1.5);
  checkAllModes(x, assign, 3, 0.0);
}

TEST_F(MadDispersion, EpsilonAndScale) {
  Options o;
  o.eps = 1e-2;
  check(at::randn({40, 5}) * 3, at::randint(0, 4, {40}).to(at::kInt), o);
  o.eps = 1.0;
  o.normalize = Normalize::Global;
  check(at::randn({40, 5}) * 100, at::randint(0, 4, {40}).to(at::kInt), o);
}

TEST_F(MadDispersion, Int64Assign) {
  Options o;
  o.numExperts = 6;
  check(at::randn({50, 9}), at::randint(0, 6, {50}).to(at::kLong), o);
}

TEST_F(MadDispersion, DynamicTokenCount) {
  Options o;
  o.numExperts = 3;
  check(at::randn({23, 4}), at::randint(0, 3, {23}).to(at::kInt), o, true);
}

TEST_F(MadDispersion, HalfPrecisionTokens) {
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    at::Tensor x = at::randn({45, 6}).to(t);
    checkAllModes(x, at::randint(0, 4, {45}).to(at::kInt), 4);
  }
}

//===----------------------------------------------------------------------===//
// Empty and single-token clusters
//===----------------------------------------------------------------------===//

TEST_F(MadDispersion, EmptyAndSingletonClusters) {
  // Cluster 1 is empty, cluster 3 has one token, cluster 4 has two.
  at::Tensor assign = at::tensor({0, 2, 0, 3, 2, 0, 4, 2, 4, 5, 5, 0, 5},
                                 at::kInt);
  at::Tensor x = at::randn({13, 5});
  checkAllModes(x, assign, 6);
  checkAllModes(x, assign, 6, 0.0);
  // identity: rows of clusters with < 2 tokens are exactly 1.
  Options o;
  o.numExperts = 6;
  auto module = compile(buildIR(x, assign, o, false));
  ASSERT_TRUE(module);
  auto out = run(*module, "f", {x, assign});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(exactlyEqual(out[0][1], at::ones({5})));
  EXPECT_TRUE(exactlyEqual(out[0][3], at::ones({5})));
  EXPECT_TRUE(exactlyEqual(out[1], at::tensor({4, 0, 3, 1, 2, 3}, at::kInt)));
}

TEST_F(MadDispersion, NoClusterHasTwoTokens) {
  // identity: every row is 1 (no statistic to take); raw: every s = 0.
  at::Tensor x = at::randn({3, 4});
  at::Tensor assign = at::tensor({2, 0, 4}, at::kInt);
  checkAllModes(x, assign, 5);
  checkAllModes(at::randn({1, 4}), at::tensor({0}, at::kInt), 1); // T = 1
}

TEST_F(MadDispersion, SingleExpert) {
  checkAllModes(at::randn({9, 3}), at::zeros({9}, at::kInt), 1);
}

//===----------------------------------------------------------------------===//
// NaN and out-of-range assignments
//===----------------------------------------------------------------------===//

TEST_F(MadDispersion, NaNPropagates) {
  // NaN in a token poisons its cluster and, through the statistics, W.
  at::Tensor x = at::randn({20, 4});
  x[7][2] = kNaN;
  at::Tensor assign = at::randint(0, 3, {20}).to(at::kInt);
  checkAllModes(x, assign, 3);
  checkAllModes(x, assign, 3, 0.0);
}

TEST_F(MadDispersion, OutOfRangeAssignIsARuntimeError) {
  for (int64_t bad : {4, -1, 1000}) {
    at::Tensor x = at::randn({6, 3});
    at::Tensor assign = at::tensor({0, 1, 2, 3, 0, 1}, at::kInt);
    assign[4] = bad;
    Options o;
    auto module = compile(buildIR(x, assign, o, false));
    ASSERT_TRUE(module);
    std::string msg = runExpectingError(*module, "f", {x, assign});
    EXPECT_NE(msg.find("moe.mad_dispersion: 'assign' element 4 is " +
                       std::to_string(bad) + ", outside [0, 4)"),
              std::string::npos)
        << msg;
    // The next call with valid inputs is clean.
    assign[4] = 0;
    auto out = run(*module, "f", {x, assign});
    EXPECT_EQ(out.size(), 2u);
  }
}

} // namespace
