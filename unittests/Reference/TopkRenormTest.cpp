//===- TopkRenormTest.cpp - moe.topk_renorm against libtorch --------------===//
//
// Part of the MoE-MLIR project.
//
// Reference: the description of moe.topk_renorm in MoEOps.td, written with
// torch ops. Selection is tie-aware (stable sort: lowest index first among
// equal values, NaN above every number), so the indices must match exactly.
//
// Tolerances: weights rtol 1e-5, atol 1e-7. The weights are softmaxes or
// ratios of at most K f32 values; the compiled code and libtorch use different
// exp implementations (libm expf vs. vectorized exp, each within ~1 ulp) and
// may sum in another order (<= K ulp relative for K <= 128).
//
//===----------------------------------------------------------------------===//

#include "ReferenceUtils.h"

#include <cmath>
#include <limits>

using namespace moe_ref;

namespace {

constexpr double kRtol = 1e-5, kAtol = 1e-7;
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Mode { Logits, Probs };

/// The reference: weights (f32) and indices (i32) of moe.topk_renorm.
std::pair<at::Tensor, at::Tensor> reference(const at::Tensor &scores, int64_t k,
                                            Mode mode, bool renormalize) {
  at::Tensor s = scores.to(at::kFloat); // accumulation in f32
  auto [vals, idx] = stableTopk(s, k);
  at::Tensor w;
  if (mode == Mode::Logits) {
    w = renormalize ? at::softmax(vals, -1)
                    : at::softmax(s, -1).gather(-1, idx);
    // A row whose every logit is -inf: zero weights (never NaN).
    at::Tensor allMasked = (s == -kInf).all(-1, /*keepdim=*/true);
    w = at::where(allMasked, at::zeros_like(w), w);
  } else if (renormalize) {
    at::Tensor sum = vals.sum(-1, /*keepdim=*/true);
    w = at::where(sum == 0, at::zeros_like(vals), vals / sum);
  } else {
    w = vals;
  }
  return {w.contiguous(), idx.to(at::kInt)};
}

std::string buildIR(const at::Tensor &scores, int64_t k, Mode mode,
                    bool renormalize, std::initializer_list<int> dynamicDims) {
  std::vector<int64_t> outShape = scores.sizes().vec();
  outShape.back() = k;
  for (int d : dynamicDims)
    outShape[d] = -1;
  std::string in = tensorType(scores, dynamicDims);
  std::string tw = tensorType(outShape, at::kFloat);
  std::string ti = tensorType(outShape, at::kInt);
  std::string attrs = "k(" + std::to_string(k) + ")";
  if (mode == Mode::Probs)
    attrs += " mode(probs)";
  if (!renormalize)
    attrs += " renormalize(false)";
  return "func.func @f(%s: " + in + ") -> (" + tw + ", " + ti + ") {\n" +
         "  %w, %i = moe.topk_renorm %s " + attrs + " : " + in + " -> " + tw +
         ", " + ti + "\n  return %w, %i : " + tw + ", " + ti + "\n}\n";
}

/// Compiles and runs the op on `scores` and compares with the reference.
void check(const at::Tensor &scores, int64_t k, Mode mode, bool renormalize,
           std::initializer_list<int> dynamicDims = {}) {
  SCOPED_TRACE("scores " + tensorType(scores) + " k=" + std::to_string(k) +
               (mode == Mode::Logits ? " logits" : " probs") +
               (renormalize ? " renormalize" : " raw"));
  std::vector<at::Tensor> out = compileAndRun(
      buildIR(scores, k, mode, renormalize, dynamicDims), {scores}, 2);
  if (out.empty())
    return;
  auto [w, idx] = reference(scores, k, mode, renormalize);
  EXPECT_TRUE(exactlyEqual(out[1], idx)) << "indices";
  EXPECT_TRUE(allClose(out[0], w, kRtol, kAtol)) << "weights";
  // Indices are always in [0, K).
  EXPECT_TRUE(out[1].ge(0).all().item<bool>());
  EXPECT_TRUE(out[1].lt(scores.size(-1)).all().item<bool>());
}

void checkAllModes(const at::Tensor &logits, int64_t k,
                   std::initializer_list<int> dynamicDims = {}) {
  at::Tensor probs = at::softmax(logits.to(at::kFloat), -1).to(logits.dtype());
  for (bool renorm : {true, false}) {
    check(logits, k, Mode::Logits, renorm, dynamicDims);
    check(probs, k, Mode::Probs, renorm, dynamicDims);
  }
}

class TopkRenorm : public ::testing::Test {
protected:
  void SetUp() override { seedFromTestName(); }
};

//===----------------------------------------------------------------------===//
// Random shapes, every mode
//===----------------------------------------------------------------------===//

TEST_F(TopkRenorm, RandomShapesAllModes) {
  checkAllModes(at::randn({7, 13}), 3);       // non-power-of-two sizes
  checkAllModes(at::randn({2, 5, 16}) * 3, 2); // rank 3
  checkAllModes(at::randn({4, 128, 16}), 2);  // the description's example
  checkAllModes(at::randn({33, 8}), 8);       // k = K
  checkAllModes(at::randn({6, 1}), 1);        // K = 1
  checkAllModes(at::randn({1, 10}), 4);       // N = 1
  checkAllModes(at::randn({11}), 5);          // no leading dimension
  checkAllModes(at::randn({3, 64}) * 10, 7);  // wide, spread logits
}

TEST_F(TopkRenorm, DynamicLeadingDimensions) {
  checkAllModes(at::randn({9, 16}), 2, {0});
  checkAllModes(at::randn({0, 6}), 2, {0}); // no token at all
}

TEST_F(TopkRenorm, TwoDynamicLeadingDimensions) {
  checkAllModes(at::randn({3, 5, 6}), 3, {0, 1});
}

TEST_F(TopkRenorm, HalfPrecisionInputs) {
  // The selection and accumulation run in f32 on the exact upcast values.
  checkAllModes(at::randn({5, 24}).to(at::kHalf), 4);
  checkAllModes(at::randn({5, 24}).to(at::kBFloat16), 4);
  checkAllModes(at::randn({2, 3, 10}).to(at::kBFloat16), 10);
}

//===----------------------------------------------------------------------===//
// Adversarial inputs
//===----------------------------------------------------------------------===//

TEST_F(TopkRenorm, ExactTiesBreakToTheLowestIndex) {
  // Few distinct values: most selections cut through a group of ties.
  at::Tensor logits = at::randint(0, 3, {40, 9}).to(at::kFloat);
  for (int64_t k : {1, 2, 4, 9}) {
    for (bool renorm : {true, false}) {
      check(logits, k, Mode::Logits, renorm);
      check(logits / 8.0, k, Mode::Probs, renorm);
    }
  }
  // A fully uniform row: indices 0..k-1, weights 1/k.
  at::Tensor uniform = at::full({3, 6}, 0.25f);
  check(uniform, 3, Mode::Logits, true);
  check(uniform, 3, Mode::Probs, true);
  check(uniform.to(at::kBFloat16), 6, Mode::Probs, false);
}

TEST_F(TopkRenorm, MaskedLogits) {
  at::Tensor logits = at::randn({6, 8});
  // Row 0: every expert masked; row 1: all but one; row 2: all but three; row
  // 3: the masked experts tie with each other below the selected ones.
  logits[0].fill_(-kInf);
  logits[1].fill_(-kInf);
  logits[1][5] = 0.5;
  logits[2].narrow(0, 0, 5).fill_(-kInf);
  logits[3].narrow(0, 4, 4).fill_(-kInf);
  for (int64_t k : {1, 3, 8})
    for (bool renorm : {true, false})
      check(logits, k, Mode::Logits, renorm);
}

TEST_F(TopkRenorm, FullyMaskedRowsGiveZerosAndFirstIndices) {
  at::Tensor logits = at::full({2, 5}, -kInf);
  auto module = compile(buildIR(logits, 3, Mode::Logits, true, {}));
  ASSERT_TRUE(module);
  auto out = run(*module, "f", {logits});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(exactlyEqual(out[0], at::zeros({2, 3})));
  EXPECT_TRUE(exactlyEqual(out[1], at::arange(3).repeat({2, 1}).to(at::kInt)));
}

TEST_F(TopkRenorm, NaNRanksFirstAndPropagates) {
  at::Tensor logits = at::randn({5, 7});
  logits[0][3] = kNaN;             // one NaN: selected first, weights NaN
  logits[1][2] = kNaN;             // two NaNs: in index order
  logits[1][6] = kNaN;
  logits[2].fill_(kNaN);           // all NaN: indices 0..k-1
  logits[3][4] = kInf;             // +inf: NaN weights (inf - inf)
  for (int64_t k : {1, 2, 3}) {
    for (bool renorm : {true, false}) {
      check(logits, k, Mode::Logits, renorm);
      // Probabilities with NaN (raw keeps NaN only where selected).
      at::Tensor probs = at::softmax(at::randn({5, 7}), -1);
      probs[0][3] = kNaN;
      probs[1][2] = kNaN;
      probs[1][6] = kNaN;
      check(probs, k, Mode::Probs, renorm);
    }
  }
}

TEST_F(TopkRenorm, ZeroProbabilitySumGivesZeroWeights) {
  at::Tensor probs = at::softmax(at::randn({4, 6}), -1);
  probs[1].zero_();
  probs[2].narrow(0, 0, 4).zero_(); // k = 6 selects the zeros too
  for (int64_t k : {1, 2, 6}) {
    check(probs, k, Mode::Probs, true);
    check(probs, k, Mode::Probs, false);
  }
}

TEST_F(TopkRenorm, LargeMagnitudes) {
  // Logits of +-1e30 and 1e4-apart values: softmax must not overflow.
  at::Tensor logits = at::randn({8, 12}) * 1e4;
  logits[0][0] = 1e30;
  logits[1][1] = -1e30;
  checkAllModes(logits, 3);
  check(logits.to(at::kHalf), 3, Mode::Logits, true); // f16 saturates to inf
}

TEST_F(TopkRenorm, RowPerLaneLayout) {
  // K a power of two <= 16 and k <= 8: one row per vector lane (blocks of 8
  // or 16 rows transposed in registers), the rows past the last block one by
  // one. Row counts around the block sizes; ties, NaN and masked rows inside
  // the blocks.
  for (int64_t rows : {15, 16, 17, 40, 67}) {
    checkAllModes(at::randn({rows, 8}), 2);
    checkAllModes(at::randn({rows, 16}) * 3, 4);
  }
  checkAllModes(at::randn({3, 11, 4}), 3, {0, 1}); // dynamic rows, k = 3
  checkAllModes(at::randn({19, 2}), 2);            // k = K = 2
  checkAllModes(at::randn({21, 16}), 8);           // k = 8
  checkAllModes(at::randn({34, 16}).to(at::kBFloat16), 5);
  at::Tensor ties = at::randint(0, 3, {48, 8}).to(at::kFloat);
  ties[5].fill_(kNaN);
  ties[6][3] = kNaN;
  ties[6][7] = kNaN;
  ties[9].fill_(-kInf);
  ties[10].narrow(0, 0, 7).fill_(-kInf);
  ties[11][2] = kInf;
  for (int64_t k : {1, 2, 3, 4, 8})
    for (bool renorm : {true, false})
      check(ties, k, Mode::Logits, renorm);
  at::Tensor probs = at::randint(0, 3, {33, 16}).to(at::kFloat) / 40.0;
  probs[3].zero_();
  probs[4][1] = kNaN;
  for (int64_t k : {1, 2, 7})
    for (bool renorm : {true, false})
      check(probs, k, Mode::Probs, renorm);
}

TEST_F(TopkRenorm, SoftmaxTopkEqualsTopkSoftmaxRenormalized) {
  // Mutual-Inform App. A.3 (eq 24/25): logits mode with renormalization is
  // softmax -> top-k -> renormalize; both forms compiled, compared to each
  // other (indices exactly, weights within the tolerance).
  at::Tensor logits = at::randn({17, 10}) * 2;
  at::Tensor probs = at::softmax(logits, -1);
  auto m1 = compile(buildIR(logits, 3, Mode::Logits, true, {}));
  auto m2 = compile(buildIR(probs, 3, Mode::Probs, true, {}));
  ASSERT_TRUE(m1 && m2);
  auto a = run(*m1, "f", {logits});
  auto b = run(*m2, "f", {probs});
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_TRUE(exactlyEqual(a[1], b[1]));
  EXPECT_TRUE(allClose(a[0], b[0], kRtol, 1e-6));
  // Weights sum to 1.
  EXPECT_TRUE(allClose(a[0].sum(-1), at::ones({17}), 0, 1e-6));
}

} // namespace
