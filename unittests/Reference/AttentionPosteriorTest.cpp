//===- AttentionPosteriorTest.cpp - moe.attention_posterior vs libtorch ---===//
//
// Part of the MoE-MLIR project.
//
// Reference: the description of moe.attention_posterior in MoEOps.td
// (Mutual-Inform Lemma 1, eq 13-17), in float64 with torch ops:
//   m[b,h,j,:] = head_scale * v[b,h,j,:] wo[:, h*Dh:(h+1)*Dh]^T
//   z[b,h,i,j] = scores + <u_i, m_hj>/sigma^2 - |m_hj|^2/(2 sigma^2)
//   min_entropy: h* = argmin_h mean_i H(softmax_j scores[b,h,i,:]) over the
//     rows with a valid key (0 when none), lowest head on ties, NaN first;
//     p = softmax_j(z[b,h*]) e, head = h*;
//   all: H' = softmax_h(logsumexp_j(log_softmax(scores)_j + ll_j)),
//     p = sum_h H' softmax_j(z_h) e, head = -1;
//   a query row with no valid key gives p = 0.
// Also checked against the direct Gaussian density in float64 (small D) and
// against Proposition 1 (eq 18).
//
// Tolerances (op in f32, reference in f64): rtol 1e-4, atol 2e-5. The
// posterior logits z reach |u||m|/sigma^2 + |m|^2/(2 sigma^2) ~ 10-100 here;
// their f32 rounding (sums of D products) gives weight errors of ~1e-5
// relative; p is a convex combination of probabilities. Wider cases say why.
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
const double kPi = 3.14159265358979323846;

enum class Select { MinEntropy, All };

struct Inputs {
  at::Tensor scores, u, v, wo, e;
};

struct Options {
  double sigma = 1.0;
  Select select = Select::MinEntropy;
  std::optional<double> headScale;
};

/// Random inputs with posterior logits of moderate size.
Inputs randomInputs(int64_t B, int64_t H, int64_t N, int64_t Nk, int64_t D,
                    int64_t Dh, int64_t K) {
  Inputs in;
  in.scores = at::randn({B, H, N, Nk}) * 1.5;
  in.u = at::randn({B, N, D});
  in.v = at::randn({B, H, Nk, Dh});
  // Head means m ~ H * v wo_h^T: scale wo so that |m| ~ 1.
  in.wo = at::randn({D, H * Dh}) / (H * std::sqrt(double(Dh * D)));
  in.e = randomProbs({B, Nk, K});
  return in;
}

double effectiveHeadScale(const Inputs &in, const Options &o) {
  return o.headScale ? double(float(*o.headScale)) : double(in.scores.size(1));
}

/// Head means [B, H, Nk, D] in f64.
at::Tensor headMeans(const Inputs &in, const Options &o) {
  int64_t H = in.scores.size(1), Dh = in.v.size(3), D = in.wo.size(0);
  at::Tensor wo = in.wo.to(at::kDouble).view({D, H, Dh});
  return effectiveHeadScale(in, o) *
         at::einsum("bhjc,dhc->bhjd", {in.v.to(at::kDouble), wo});
}

/// Log-likelihood terms <u_i, m_hj>/s2 - |m_hj|^2/(2 s2): [B, H, N, Nk].
at::Tensor logLikelihood(const Inputs &in, const Options &o) {
  double s2 = double(float(o.sigma)) * double(float(o.sigma));
  at::Tensor m = headMeans(in, o);
  return (at::einsum("bid,bhjd->bhij", {in.u.to(at::kDouble), m}) -
          0.5 * (m * m).sum(-1).unsqueeze(2)) /
         s2;
}

/// Mean prior-attention entropy per (b, h), rows with no valid key left out.
at::Tensor meanEntropy(const at::Tensor &scores) {
  at::Tensor s = scores.to(at::kDouble);
  at::Tensor masked = (s == -kInf).all(-1); // [B, H, N]
  at::Tensor A = at::softmax(s, -1);
  at::Tensor ent = entropy(A);
  ent = at::where(masked, at::zeros_like(ent), ent);
  at::Tensor count = (~masked).sum(-1).to(at::kDouble);
  at::Tensor mean = ent.sum(-1) / count.clamp_min(1);
  return at::where(count > 0, mean, at::zeros_like(mean));
}

/// h* per batch element: lowest head among the minima, the first NaN if any.
at::Tensor selectHeads(const at::Tensor &meanEnt) {
  int64_t B = meanEnt.size(0), H = meanEnt.size(1);
  at::Tensor heads = at::empty({B}, at::kInt);
  for (int64_t b = 0; b < B; ++b) {
    int64_t best = 0;
    double bestValue = meanEnt[b][0].item<double>();
    for (int64_t h = 0; h < H && !std::isnan(bestValue); ++h) {
      double x = meanEnt[b][h].item<double>();
      if (std::isnan(x) || x < bestValue) {
        best = h;
        bestValue = x;
      }
    }
    heads[b] = best;
  }
  return heads;
}

/// The min-entropy selection over the posteriors Ap [B, H, N, Nk]: p[b] =
/// Ap[b, h*] e[b] with each sequence's head h* (selectHeads), and the heads.
std::pair<at::Tensor, at::Tensor> minEntropyPosterior(const Inputs &in,
                                                      const at::Tensor &Ap,
                                                      const at::Tensor &e) {
  at::Tensor heads = selectHeads(meanEntropy(in.scores));
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < in.scores.size(0); ++b)
    rows.push_back(Ap[b][heads[b].item<int64_t>()].matmul(e[b]));
  return {at::stack(rows), heads};
}

/// Posterior rows softmax_j(z) of every head, rows with no valid key zero.
at::Tensor posteriors(const Inputs &in, const Options &o) {
  at::Tensor s = in.scores.to(at::kDouble);
  at::Tensor z = s + logLikelihood(in, o);
  at::Tensor A = at::softmax(z, -1);
  at::Tensor masked = (s == -kInf).all(-1, /*keepdim=*/true);
  return at::where(masked, at::zeros_like(A), A); // [B, H, N, Nk]
}

/// The reference p (f64) and head (i32).
std::pair<at::Tensor, at::Tensor> reference(const Inputs &in,
                                            const Options &o) {
  int64_t B = in.scores.size(0);
  at::Tensor e = in.e.to(at::kDouble);
  at::Tensor Ap = posteriors(in, o);
  if (o.select == Select::MinEntropy)
    return minEntropyPosterior(in, Ap, e);
  at::Tensor s = in.scores.to(at::kDouble);
  at::Tensor zz = at::log_softmax(s, -1) + logLikelihood(in, o);
  at::Tensor lse = at::logsumexp(zz, -1); // [B, H, N]
  at::Tensor headMasked = (s == -kInf).all(-1);
  lse = at::where(headMasked, at::full_like(lse, -kInf), lse);
  at::Tensor Hp = at::softmax(lse, 1);
  at::Tensor rowMasked = headMasked.all(1, /*keepdim=*/true);
  Hp = at::where(rowMasked, at::zeros_like(Hp), Hp);
  at::Tensor p = at::einsum("bhi,bhij,bjk->bik", {Hp, Ap, e});
  return {p, at::full({B}, -1, at::kInt)};
}

std::string buildIR(const Inputs &in, const Options &o) {
  std::string ts = tensorType(in.scores), tu = tensorType(in.u),
              tv = tensorType(in.v), two = tensorType(in.wo),
              te = tensorType(in.e);
  std::string tp = tensorType({in.u.size(0), in.u.size(1), in.e.size(2)},
                              at::kFloat);
  std::string th = tensorType({in.u.size(0)}, at::kInt);
  std::string attrs = " sigma(" + floatLiteral(o.sigma) + ")";
  if (o.select == Select::All)
    attrs += " head_select(all)";
  if (o.headScale)
    attrs += " head_scale(" + floatLiteral(*o.headScale) + ")";
  return "func.func @f(%s: " + ts + ", %u: " + tu + ", %v: " + tv +
         ", %wo: " + two + ", %e: " + te + ") -> (" + tp + ", " + th +
         ") {\n  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e" +
         attrs + "\n      : " + ts + ", " + tu + ", " + tv + ", " + two +
         ", " + te + " -> " + tp + ", " + th + "\n  return %p, %h : " + tp +
         ", " + th + "\n}\n";
}

/// Runs the op: {p, head}, or {} on failure.
std::vector<at::Tensor> runOp(const Inputs &in, const Options &o) {
  return compileAndRun(buildIR(in, o), {in.scores, in.u, in.v, in.wo, in.e}, 2);
}

void check(const Inputs &in, const Options &o, double rtol = 1e-4,
           double atol = 2e-5) {
  SCOPED_TRACE("scores " + tensorType(in.scores) + " u " + tensorType(in.u) +
               " v " + tensorType(in.v) + " e " + tensorType(in.e) +
               " sigma " + std::to_string(o.sigma) +
               (o.select == Select::All ? " all" : " min_entropy") +
               (o.headScale ? " head_scale " + std::to_string(*o.headScale)
                            : ""));
  std::vector<at::Tensor> out = runOp(in, o);
  if (out.size() != 2)
    return;
  auto [p, head] = reference(in, o);
  EXPECT_TRUE(exactlyEqual(out[1], head)) << "head";
  EXPECT_TRUE(allClose(out[0], p, rtol, atol)) << "p";
}

/// check(in, o) with each head selection (the min-entropy head, all heads).
void checkEachHeadSelect(const Inputs &in) {
  for (Select select : {Select::MinEntropy, Select::All}) {
    Options o;
    o.select = select;
    check(in, o);
  }
}

void checkAllModes(const Inputs &in) {
  for (Select select : {Select::MinEntropy, Select::All})
    for (double sigma : {1.0, 2.0, 0.7}) {
      Options o;
      o.select = select;
      o.sigma = sigma;
      check(in, o);
      o.headScale = 1.0;
      check(in, o);
    }
}

class AttentionPosterior : public ::testing::Test {
protected:
  void SetUp() override { seedFromTestName(); }
};

//===----------------------------------------------------------------------===//
// Random shapes, every mode
//===----------------------------------------------------------------------===//

TEST_F(AttentionPosterior, RandomShapesAllModes) {
  // (B, H, N, Nk, D, Dh, K)
  checkAllModes(randomInputs(2, 3, 5, 5, 8, 4, 6));
  checkAllModes(randomInputs(1, 4, 7, 11, 12, 3, 5)); // Nk != N
  checkAllModes(randomInputs(3, 1, 6, 6, 5, 5, 3));   // H = 1
  checkAllModes(randomInputs(2, 2, 1, 1, 4, 2, 4));   // N = Nk = 1
  checkAllModes(randomInputs(1, 3, 4, 4, 6, 2, 1));   // K = 1
}

TEST_F(AttentionPosterior, LargerShape) {
  Inputs in = randomInputs(2, 8, 40, 40, 64, 8, 16);
  Options o;
  check(in, o);
  o.select = Select::All;
  check(in, o);
}

TEST_F(AttentionPosterior, HalfPrecisionInputs) {
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    Inputs in = randomInputs(2, 3, 6, 6, 8, 4, 5);
    in.scores = in.scores.to(t);
    in.u = in.u.to(t);
    in.v = in.v.to(t);
    in.wo = in.wo.to(t);
    in.e = in.e.to(t);
    checkEachHeadSelect(in);
  }
}

//===----------------------------------------------------------------------===//
// Masks, ties, NaN
//===----------------------------------------------------------------------===//

TEST_F(AttentionPosterior, CausalMask) {
  Inputs in = randomInputs(2, 4, 9, 9, 8, 4, 5);
  at::Tensor future = at::ones({9, 9}, at::kBool).triu(1);
  in.scores = in.scores.masked_fill(future, -kInf);
  checkEachHeadSelect(in);
}

TEST_F(AttentionPosterior, FullyMaskedQueryRows) {
  // Padded queries (rows 1 and 4 of batch 0) in every head: p = 0 there, and
  // they are left out of the head's mean entropy.
  Inputs in = randomInputs(2, 3, 6, 6, 8, 4, 5);
  in.scores.select(0, 0).select(1, 1).fill_(-kInf);
  in.scores.select(0, 0).select(1, 4).fill_(-kInf);
  for (Select select : {Select::MinEntropy, Select::All}) {
    Options o;
    o.select = select;
    std::vector<at::Tensor> out = runOp(in, o);
    ASSERT_EQ(out.size(), 2u);
    auto [p, head] = reference(in, o);
    EXPECT_TRUE(exactlyEqual(out[1], head));
    EXPECT_TRUE(allClose(out[0], p, 1e-4, 2e-5));
    EXPECT_TRUE(exactlyEqual(out[0][0][1], at::zeros({5})));
    EXPECT_TRUE(exactlyEqual(out[0][0][4], at::zeros({5})));
    EXPECT_FALSE(out[0].isnan().any().item<bool>());
  }
}

TEST_F(AttentionPosterior, HeadWithNoValidRowHasMeanZero) {
  // Head 2 of batch 1 has every key masked for every query: its mean entropy
  // is 0, the minimum, so it is selected and p is zero for that batch.
  Inputs in = randomInputs(2, 3, 5, 5, 6, 2, 4);
  in.scores[1][2].fill_(-kInf);
  Options o;
  std::vector<at::Tensor> out = runOp(in, o);
  ASSERT_EQ(out.size(), 2u);
  auto [p, head] = reference(in, o);
  EXPECT_EQ(head[1].item<int>(), 2);
  EXPECT_TRUE(exactlyEqual(out[1], head));
  EXPECT_TRUE(allClose(out[0], p, 1e-4, 2e-5));
  EXPECT_TRUE(exactlyEqual(out[0][1], at::zeros({5, 4})));
}

TEST_F(AttentionPosterior, EntropyTiesBreakToTheLowestHead) {
  // Heads 1 and 3 share the sharpest attention (identical scores), the other
  // heads are flatter: h* = 1. With all heads identical: h* = 0.
  Inputs in = randomInputs(2, 4, 6, 6, 8, 2, 3);
  at::Tensor sharp = at::randn({2, 6, 6}) * 6;
  in.scores.select(1, 1).copy_(sharp);
  in.scores.select(1, 3).copy_(sharp);
  in.scores.select(1, 0).mul_(0.1);
  in.scores.select(1, 2).mul_(0.1);
  Options o;
  std::vector<at::Tensor> out = runOp(in, o);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(exactlyEqual(out[1], at::full({2}, 1, at::kInt)));
  check(in, o);

  Inputs same = randomInputs(2, 3, 4, 4, 6, 2, 3);
  same.scores = at::randn({2, 1, 4, 4}).expand({2, 3, 4, 4}).contiguous();
  out = runOp(same, o);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(exactlyEqual(out[1], at::zeros({2}, at::kInt)));
  check(same, o);
  // Uniform attention everywhere (e.g. zero W_Q/W_K).
  same.scores.zero_();
  check(same, o);
}

TEST_F(AttentionPosterior, NaNEntropyCountsAsTheMinimum) {
  Inputs in = randomInputs(2, 4, 5, 5, 6, 2, 3);
  in.scores[0][2][3][1] = kNaN; // head 2 of batch 0: NaN mean entropy
  in.scores[1][1][0][0] = kNaN; // heads 1 and 3 of batch 1: the first wins
  in.scores[1][3][2][2] = kNaN;
  Options o;
  std::vector<at::Tensor> out = runOp(in, o);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1][0].item<int>(), 2);
  EXPECT_EQ(out[1][1].item<int>(), 1);
  check(in, o);
}

//===----------------------------------------------------------------------===//
// Magnitudes and the direct density formula
//===----------------------------------------------------------------------===//

TEST_F(AttentionPosterior, LargeMagnitudesD512Sigma01) {
  // D = 512, sigma = 0.1: |m|^2/(2 sigma^2) ~ 1e5 and the density
  // (2 pi sigma^2)^(-D/2) is far outside f32 (and f64) range. The posterior
  // is one-hot up to e^-(logit gaps ~ 1e3); f32 rounding of logits of 1e5 is
  // ~1e-2, far below the gaps, hence atol 1e-4.
  Inputs in = randomInputs(2, 4, 12, 12, 512, 16, 8);
  in.wo = in.wo * 4;
  for (Select select : {Select::MinEntropy, Select::All}) {
    Options o;
    o.sigma = 0.1;
    o.select = select;
    std::vector<at::Tensor> out = runOp(in, o);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(out[0].isfinite().all().item<bool>()) << "NaN or inf in p";
    EXPECT_TRUE(allClose(out[0].sum(-1), at::ones({2, 12}), 0, 1e-5));
    auto [p, head] = reference(in, o);
    EXPECT_TRUE(exactlyEqual(out[1], head));
    EXPECT_TRUE(allClose(out[0], p, 0, 1e-4));
  }
}

/// p from the Gaussian density itself (Lemma 1 as written), in float64.
std::pair<at::Tensor, at::Tensor> directDensity(const Inputs &in,
                                                const Options &o) {
  int64_t B = in.scores.size(0), H = in.scores.size(1), D = in.u.size(2);
  double s2 = double(float(o.sigma)) * double(float(o.sigma));
  at::Tensor A = at::softmax(in.scores.to(at::kDouble), -1); // prior
  at::Tensor m = headMeans(in, o);                           // [B,H,Nk,D]
  at::Tensor diff = in.u.to(at::kDouble).unsqueeze(1).unsqueeze(3) -
                    m.unsqueeze(2); // [B,H,N,Nk,D]
  at::Tensor density = at::exp(-(diff * diff).sum(-1) / (2 * s2)) *
                       std::pow(2 * kPi * s2, -0.5 * double(D));
  at::Tensor joint = A * density; // [B,H,N,Nk]
  at::Tensor Ap = joint / joint.sum(-1, /*keepdim=*/true);
  at::Tensor e = in.e.to(at::kDouble);
  if (o.select == Select::MinEntropy)
    return minEntropyPosterior(in, Ap, e);
  at::Tensor prior = at::full({B, H, in.scores.size(2)}, 1.0 / H,
                              at::kDouble); // H[i,h] = 1/H
  at::Tensor Hp = prior * joint.sum(-1);
  Hp = Hp / Hp.sum(1, /*keepdim=*/true);
  return {at::einsum("bhi,bhij,bjk->bik", {Hp, Ap, e}),
          at::full({B}, -1, at::kInt)};
}

TEST_F(AttentionPosterior, MatchesTheDirectGaussianDensityInFloat64) {
  // Small D so that the density is representable in f64. The op runs in f32:
  // rtol 1e-4, atol 2e-5 as above.
  for (int64_t D : {2, 3, 5}) {
    Inputs in = randomInputs(2, 3, 5, 6, D, 2, 4);
    for (Select select : {Select::MinEntropy, Select::All})
      for (double sigma : {1.0, 1.5}) {
        Options o;
        o.select = select;
        o.sigma = sigma;
        std::vector<at::Tensor> out = runOp(in, o);
        ASSERT_EQ(out.size(), 2u);
        auto [p, head] = directDensity(in, o);
        EXPECT_TRUE(exactlyEqual(out[1], head));
        EXPECT_TRUE(allClose(out[0], p, 1e-4, 2e-5))
            << "D=" << D << " sigma=" << sigma;
        // The log-space reference agrees with the density to f64 rounding.
        EXPECT_TRUE(allClose(reference(in, o).first, p, 1e-9, 1e-12));
      }
  }
}

//===----------------------------------------------------------------------===//
// Mutual-Inform Proposition 1 (eq 18)
//===----------------------------------------------------------------------===//

TEST_F(AttentionPosterior, Proposition1EntropyBound) {
  // With s_i = A'_{h*}[i,:]: H(p_i) <= sum_j s_ij H(e_j) + H(s_i). p is the
  // compiled result, s the f64 reference posterior; slack 1e-5 for f32.
  for (int trial = 0; trial < 6; ++trial) {
    Inputs in = randomInputs(2, 2 + trial % 3, 4 + trial, 4 + trial,
                             4 + 2 * trial, 3, 3 + trial);
    in.e = randomProbs({2, 4 + trial, 3 + trial}, 0.5 + trial);
    Options o;
    o.sigma = 0.5 + 0.3 * trial;
    std::vector<at::Tensor> out = runOp(in, o);
    ASSERT_EQ(out.size(), 2u);
    at::Tensor Ap = posteriors(in, o);
    at::Tensor heads = selectHeads(meanEntropy(in.scores));
    at::Tensor eEnt = entropy(in.e.to(at::kDouble));
    for (int64_t b = 0; b < 2; ++b) {
      at::Tensor s = Ap[b][heads[b].item<int64_t>()];
      at::Tensor lhs = entropy(out[0][b].to(at::kDouble));
      at::Tensor rhs = s.matmul(eEnt[b]) + entropy(s);
      EXPECT_TRUE((lhs <= rhs + 1e-5).all().item<bool>())
          << "trial " << trial << " batch " << b << ": max violation "
          << (lhs - rhs).max().item<double>();
    }
  }
}

} // namespace
