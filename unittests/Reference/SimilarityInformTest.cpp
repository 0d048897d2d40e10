//===- SimilarityInformTest.cpp - moe.similarity_inform vs libtorch -------===//
//
// Part of the MoE-MLIR project.
//
// Reference: the description of moe.similarity_inform in MoEOps.td
// (Mutual-Inform eq 5 and 8), in float64 with torch ops:
//   S[b,i,:] = softmax_j(u_i^T W_s u_j / tau) over the valid keys j (causal:
//   j <= i; key_mask true), p[b,i,:] = sum_j S[b,i,j] e[b,j,:], rows with no
//   valid key give p = 0; NaN propagates to the rows that mix it.
//
// Tolerances (op in f32, reference in f64): rtol 1e-4, atol 2e-5 for logits up
// to ~100. A logit error d changes a softmax weight by a relative d; the f32
// logits u_i.u_j/tau (sums of D <= 64 products) carry d ~ 64 * 6e-8 * |logit|
// ~ 4e-4 at |logit| = 100, usually far less; p is a convex combination of
// probabilities (<= 1), hence the absolute term. Wider cases say why.
//
//===----------------------------------------------------------------------===//

#include "ReferenceUtils.h"

#include <cmath>
#include <limits>
#include <optional>

using namespace moe_ref;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Options {
  double tau = 1.0;
  bool causal = false;
  std::optional<at::Tensor> ws;
  std::optional<at::Tensor> keyMask;
};

/// The valid (query, key) pairs: [B, N, N] bool.
at::Tensor validPairs(int64_t B, int64_t N, const Options &o) {
  at::Tensor valid = at::ones({B, N, N}, at::kBool);
  if (o.causal)
    valid = valid & at::ones({N, N}, at::kBool).tril();
  if (o.keyMask)
    valid = valid & o.keyMask->to(at::kBool).unsqueeze(1);
  return valid;
}

/// The mixing matrix S (f64), rows with no valid key all zero.
at::Tensor mixingMatrix(const at::Tensor &u, const Options &o) {
  at::Tensor U = u.to(at::kDouble);
  at::Tensor q = o.ws ? U.matmul(o.ws->to(at::kDouble)) : U;
  at::Tensor logits = q.matmul(U.transpose(-1, -2)) / double(float(o.tau));
  at::Tensor valid = validPairs(u.size(0), u.size(1), o);
  at::Tensor S = at::softmax(logits.masked_fill(~valid, -kInf), -1);
  at::Tensor empty = ~valid.any(-1, /*keepdim=*/true);
  return at::where(empty, at::zeros_like(S), S);
}

at::Tensor reference(const at::Tensor &u, const at::Tensor &e,
                     const Options &o) {
  at::Tensor S = mixingMatrix(u, o);
  at::Tensor valid = validPairs(u.size(0), u.size(1), o);
  // Sum over the valid keys only, so that NaN in a masked key's e stays out.
  at::Tensor terms = S.unsqueeze(-1) * e.to(at::kDouble).unsqueeze(1);
  terms = at::where(valid.unsqueeze(-1), terms, at::zeros_like(terms));
  return terms.sum(2);
}

std::string buildIR(const at::Tensor &u, const at::Tensor &e, const Options &o,
                    std::initializer_list<int> dynamicDims) {
  std::string tu = tensorType(u, dynamicDims), te = tensorType(e, dynamicDims);
  std::vector<int64_t> pShape = e.sizes().vec();
  for (int d : dynamicDims)
    pShape[d] = -1;
  std::string tp = tensorType(pShape, at::kFloat);
  std::string args = "%u: " + tu + ", %e: " + te;
  std::string operands = "%u, %e";
  if (o.ws) {
    args += ", %ws: " + tensorType(*o.ws);
    operands += " ws(%ws : " + tensorType(*o.ws) + ")";
  }
  if (o.keyMask) {
    std::string tm = tensorType(*o.keyMask, dynamicDims);
    args += ", %m: " + tm;
    operands += " key_mask(%m : " + tm + ")";
  }
  std::string attrs = " tau(" + floatLiteral(o.tau) + ")";
  if (o.causal)
    attrs += " causal(true)";
  return "func.func @f(" + args + ") -> " + tp + " {\n  %p = " +
         "moe.similarity_inform " + operands + attrs + " : " + tu + ", " + te +
         " -> " + tp + "\n  return %p : " + tp + "\n}\n";
}

/// Runs the op; returns p (undefined tensor on failure).
at::Tensor runOp(const at::Tensor &u, const at::Tensor &e, const Options &o,
                 std::initializer_list<int> dynamicDims = {}) {
  std::vector<at::Tensor> inputs = {u, e};
  if (o.ws)
    inputs.push_back(*o.ws);
  if (o.keyMask)
    inputs.push_back(*o.keyMask);
  std::vector<at::Tensor> out =
      compileAndRun(buildIR(u, e, o, dynamicDims), inputs, 1);
  return out.empty() ? at::Tensor() : out[0];
}

void check(const at::Tensor &u, const at::Tensor &e, const Options &o,
           double rtol = 1e-4, double atol = 2e-5,
           std::initializer_list<int> dynamicDims = {}) {
  SCOPED_TRACE("u " + tensorType(u) + " e " + tensorType(e) + " tau " +
               std::to_string(o.tau) + (o.causal ? " causal" : "") +
               (o.ws ? " ws" : "") + (o.keyMask ? " key_mask" : ""));
  at::Tensor p = runOp(u, e, o, dynamicDims);
  if (!p.defined())
    return;
  EXPECT_TRUE(allClose(p, reference(u, e, o), rtol, atol));
}

/// Every attribute mode on one input.
void checkAllModes(const at::Tensor &u, const at::Tensor &e) {
  int64_t B = u.size(0), N = u.size(1), D = u.size(2);
  at::Tensor ws = at::randn({D, D}) / std::sqrt(double(D)) +
                  at::eye(D, at::kFloat);
  at::Tensor mask = at::rand({B, N}) > 0.3;
  for (double tau : {1.0, 0.5, 3.0})
    for (bool causal : {false, true}) {
      Options o;
      o.tau = tau;
      o.causal = causal;
      check(u, e, o);
      o.ws = ws;
      check(u, e, o);
      o.keyMask = mask;
      check(u, e, o);
      o.ws.reset();
      check(u, e, o);
    }
}

class SimilarityInform : public ::testing::Test {
protected:
  void SetUp() override { seedFromTestName(); }
};

//===----------------------------------------------------------------------===//
// Random shapes, every mode
//===----------------------------------------------------------------------===//

TEST_F(SimilarityInform, RandomShapesAllModes) {
  // (B, N, D, K): non-powers of two, K = 1, a larger sequence.
  checkAllModes(at::randn({2, 7, 5}), randomProbs({2, 7, 3}));
  checkAllModes(at::randn({3, 13, 16}), randomProbs({3, 13, 8}));
  checkAllModes(at::randn({1, 33, 24}) * 0.5, randomProbs({1, 33, 5}, 2.0));
  checkAllModes(at::randn({2, 6, 4}), at::ones({2, 6, 1}));
}

TEST_F(SimilarityInform, LongerSequence) {
  // More keys than one tile of an online softmax is likely to hold.
  Options o;
  o.tau = 8.0; // LayerNorm'd u: |u|^2 ~ D
  at::Tensor u = at::layer_norm(at::randn({2, 130, 64}), {64});
  check(u, randomProbs({2, 130, 16}), o);
  o.causal = true;
  check(u, randomProbs({2, 130, 16}), o);
}

TEST_F(SimilarityInform, SingleTokenMixesOnlyItself) {
  // N = 1: S = [[1]], p = e.
  at::Tensor u = at::randn({3, 1, 8}), e = randomProbs({3, 1, 4});
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    at::Tensor p = runOp(u, e, o);
    ASSERT_TRUE(p.defined());
    EXPECT_TRUE(allClose(p, e, 1e-6, 0));
  }
}

TEST_F(SimilarityInform, LargeTauAveragesTheSequence) {
  // tau -> infinity: S uniform, p_i = mean_j e_j (non-causal).
  Options o;
  o.tau = 1e7;
  at::Tensor u = at::randn({2, 9, 6}), e = randomProbs({2, 9, 5});
  at::Tensor p = runOp(u, e, o);
  ASSERT_TRUE(p.defined());
  EXPECT_TRUE(allClose(p, e.mean(1, /*keepdim=*/true).expand_as(e), 0, 1e-6));
}

TEST_F(SimilarityInform, DynamicBatchAndTokens) {
  Options o;
  o.causal = true;
  o.keyMask = at::rand({3, 11}) > 0.2;
  check(at::randn({3, 11, 8}), randomProbs({3, 11, 4}), o, 1e-4, 2e-5, {0, 1});
}

TEST_F(SimilarityInform, DynamicTokensOnly) {
  Options o;
  check(at::randn({2, 10, 8}), randomProbs({2, 10, 4}), o, 1e-4, 2e-5, {1});
}

TEST_F(SimilarityInform, HalfPrecisionInputs) {
  // bf16/f16 operands are upcast exactly; everything accumulates in f32.
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    at::Tensor u = at::randn({2, 9, 8}).to(t);
    at::Tensor e = randomProbs({2, 9, 6}).to(t);
    Options o;
    check(u, e, o);
    o.causal = true;
    o.ws = (at::eye(8) + 0.1 * at::randn({8, 8})).to(t);
    o.keyMask = at::rand({2, 9}) > 0.3;
    check(u, e, o);
  }
}

//===----------------------------------------------------------------------===//
// Adversarial inputs
//===----------------------------------------------------------------------===//

TEST_F(SimilarityInform, FullyMaskedRowsGiveZeros) {
  at::Tensor u = at::randn({3, 6, 4}), e = randomProbs({3, 6, 5});
  at::Tensor mask = at::ones({3, 6}, at::kBool);
  mask[1].fill_(false); // every key of sequence 1
  mask[2][0] = false;   // with causal: row 0 of sequence 2 has no key
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    o.keyMask = mask;
    at::Tensor p = runOp(u, e, o);
    ASSERT_TRUE(p.defined());
    EXPECT_TRUE(allClose(p, reference(u, e, o), 1e-4, 2e-5));
    EXPECT_TRUE(exactlyEqual(p[1], at::zeros({6, 5})));
    if (causal) {
      EXPECT_TRUE(exactlyEqual(p[2][0], at::zeros({5})));
    }
    EXPECT_FALSE(p.isnan().any().item<bool>());
  }
}

TEST_F(SimilarityInform, NaNPropagatesToTheRowsThatMixIt) {
  at::Tensor u = at::randn({2, 7, 4}), e = randomProbs({2, 7, 3});
  u[0][3][1] = kNaN; // a token of sequence 0
  e[1][2][0] = kNaN; // a key's probabilities in sequence 1
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    at::Tensor p = runOp(u, e, o);
    ASSERT_TRUE(p.defined());
    EXPECT_TRUE(allClose(p, reference(u, e, o), 1e-4, 2e-5));
    // Causal rows before the NaN token do not mix it.
    if (causal) {
      EXPECT_FALSE(p[0].narrow(0, 0, 3).isnan().any().item<bool>());
      EXPECT_TRUE(p[0].narrow(0, 3, 4).isnan().all().item<bool>());
    } else {
      EXPECT_TRUE(p[0].isnan().all().item<bool>());
    }
  }
  // A masked key's NaN reaches no other row (token 3 of sequence 0 is still a
  // query with a NaN u: its own row is NaN).
  Options o;
  o.keyMask = at::ones({2, 7}, at::kBool);
  (*o.keyMask)[0][3] = false;
  (*o.keyMask)[1][2] = false;
  at::Tensor p = runOp(u, e, o);
  ASSERT_TRUE(p.defined());
  EXPECT_TRUE(p[0][3].isnan().all().item<bool>());
  EXPECT_EQ(p.isnan().sum().item<int64_t>(), 3);
  EXPECT_TRUE(allClose(p, reference(u, e, o), 1e-4, 2e-5));
}

TEST_F(SimilarityInform, IdenticalTokensMixUniformly) {
  // Exact ties in S: identical u rows give equal logits.
  at::Tensor u = at::randn({1, 1, 5}).expand({2, 8, 5}).contiguous();
  at::Tensor e = randomProbs({2, 8, 4});
  Options o;
  at::Tensor p = runOp(u, e, o);
  ASSERT_TRUE(p.defined());
  EXPECT_TRUE(allClose(p, e.mean(1, true).expand_as(e), 1e-5, 1e-6));
}

TEST_F(SimilarityInform, LargeMagnitudesDoNotOverflow) {
  // |u|^2 / tau ~ 64 * 100 / 0.1 = 6.4e4: logits far beyond exp's f32 range.
  // S is then one-hot up to e^-(logit gaps) ~ 0, in f32 and f64 alike; a logit
  // error of ~1e-2 (f32 at 6e4) matters only for near-tied gaps, which random
  // inputs do not have. Hence atol 1e-4.
  Options o;
  o.tau = 0.1;
  at::Tensor u = at::randn({2, 17, 64}) * 10, e = randomProbs({2, 17, 8});
  for (bool causal : {false, true}) {
    o.causal = causal;
    at::Tensor p = runOp(u, e, o);
    ASSERT_TRUE(p.defined());
    EXPECT_TRUE(p.isfinite().all().item<bool>());
    EXPECT_TRUE(allClose(p, reference(u, e, o), 0, 1e-4));
    EXPECT_TRUE(allClose(p.sum(-1), at::ones({2, 17}), 0, 1e-5));
  }
}

//===----------------------------------------------------------------------===//
// Mutual-Inform Proposition 1 (eq 18), a property of the mixing
//===----------------------------------------------------------------------===//

TEST_F(SimilarityInform, Proposition1EntropyBound) {
  // H(p_i) <= sum_j S(i,j) H(e_j) + H(S_i) for row-stochastic S and e. p is
  // the compiled result; S comes from the f64 reference. Slack 1e-5 covers the
  // f32 rounding of p (entropy is Lipschitz away from 0 with |log p| <~ 20).
  for (int trial = 0; trial < 6; ++trial) {
    int64_t B = 2, N = 5 + 3 * trial, D = 4 + trial, K = 3 + trial;
    at::Tensor u = at::randn({B, N, D}) * (0.3 + 0.4 * trial);
    at::Tensor e = randomProbs({B, N, K}, 0.5 + trial);
    Options o;
    o.tau = 0.25 + 0.5 * trial;
    o.causal = trial % 2 == 1;
    at::Tensor p = runOp(u, e, o);
    ASSERT_TRUE(p.defined());
    at::Tensor S = mixingMatrix(u, o);
    at::Tensor lhs = entropy(p.to(at::kDouble));
    at::Tensor rhs = S.matmul(entropy(e.to(at::kDouble)).unsqueeze(-1))
                         .squeeze(-1) +
                     entropy(S);
    EXPECT_TRUE((lhs <= rhs + 1e-5).all().item<bool>())
        << "trial " << trial << ": max violation "
        << (lhs - rhs).max().item<double>();
  }
}

} // namespace
