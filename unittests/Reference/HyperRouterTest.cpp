//===- HyperRouterTest.cpp - moe.hyper_router vs libtorch -----------------===//
//
// Part of the MoE-MLIR project.
//
// Reference: the description of moe.hyper_router in MoEOps.td (HyperRouter
// eq 2, App. C.1), in float64 with torch ops:
//   out = w2 relu(w1 emb + b1) + b2, reshaped row-major to [E, D+1];
//   w = out[:, :D], b = out[:, D].
//
// Tolerances (op accumulates in f32, reference in f64): rtol 1e-4, atol 1e-4.
// Each output is two chained dot products of length De and Dh (<= 256) of
// O(1) terms: f32 rounding gives |error| <~ sqrt(n) * eps * sum|terms| ~ 1e-5.
//
//===----------------------------------------------------------------------===//

#include "ReferenceUtils.h"

#include <sstream>

using namespace moe_ref;

namespace {

struct Inputs {
  at::Tensor emb, w1, b1, w2, b2;
  int64_t E;
};

Inputs randomInputs(int64_t E, int64_t D, int64_t De, int64_t Dh) {
  Inputs in;
  in.E = E;
  in.emb = at::randn({De});
  in.w1 = at::randn({Dh, De}) / std::sqrt(double(De));
  in.b1 = at::randn({Dh}) * 0.1;
  in.w2 = at::randn({E * (D + 1), Dh}) / std::sqrt(double(Dh));
  in.b2 = at::randn({E * (D + 1)}) * 0.1;
  return in;
}

std::pair<at::Tensor, at::Tensor> reference(const Inputs &in) {
  at::Tensor h = at::relu(in.w1.to(at::kDouble).matmul(in.emb.to(at::kDouble)) +
                          in.b1.to(at::kDouble));
  at::Tensor out =
      in.w2.to(at::kDouble).matmul(h) + in.b2.to(at::kDouble); // [E*(D+1)]
  int64_t D = in.w2.size(0) / in.E - 1;
  out = out.view({in.E, D + 1});
  return {out.narrow(1, 0, D).contiguous(), out.select(1, D).contiguous()};
}

std::string resultTypes(const Inputs &in, std::string &tw, std::string &tb) {
  int64_t D = in.w2.size(0) / in.E - 1;
  tw = tensorType({in.E, D}, at::kFloat);
  tb = tensorType({in.E}, at::kFloat);
  return "(" + tw + ", " + tb + ")";
}

std::string opText(const Inputs &in, const std::string &tw,
                   const std::string &tb) {
  return "%w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(" +
         std::to_string(in.E) + ")\n      : " + tensorType(in.emb) + ", " +
         tensorType(in.w1) + ", " + tensorType(in.b1) + ", " +
         tensorType(in.w2) + ", " + tensorType(in.b2) + " -> " + tw + ", " +
         tb + "\n";
}

std::string buildIR(const Inputs &in) {
  std::string tw, tb;
  std::string results = resultTypes(in, tw, tb);
  return "func.func @f(%emb: " + tensorType(in.emb) + ", %w1: " +
         tensorType(in.w1) + ", %b1: " + tensorType(in.b1) + ", %w2: " +
         tensorType(in.w2) + ", %b2: " + tensorType(in.b2) + ") -> " +
         results + " {\n  " + opText(in, tw, tb) + "  return %w, %b : " + tw +
         ", " + tb + "\n}\n";
}

/// A dense literal holding `t`'s values exactly (f32 printed with 9 digits).
std::string denseLiteral(const at::Tensor &t) {
  at::Tensor f = t.to(at::kFloat).contiguous().reshape({-1});
  std::ostringstream os;
  os << "dense<[";
  for (int64_t i = 0; i < f.numel(); ++i)
    os << (i ? ", " : "") << floatLiteral(f.data_ptr<float>()[i]);
  os << "]>";
  return os.str();
}

/// The same op with every operand an arith.constant (inference: it folds).
std::string buildConstantIR(const Inputs &in) {
  std::string tw, tb;
  std::string results = resultTypes(in, tw, tb);
  std::string body;
  auto constant = [&](const std::string &name, const at::Tensor &t) {
    std::string flat = tensorType({t.numel()}, at::kFloat);
    if (t.dim() == 1) {
      body += "  %" + name + " = arith.constant " + denseLiteral(t) + " : " +
              flat + "\n";
      return;
    }
    body += "  %" + name + "_flat = arith.constant " + denseLiteral(t) + " : " +
            flat + "\n";
    body += "  %" + name + " = tensor.expand_shape %" + name +
            "_flat [[0, 1]] output_shape [" + std::to_string(t.size(0)) +
            ", " + std::to_string(t.size(1)) + "] : " + flat + " into " +
            tensorType(t) + "\n";
  };
  constant("emb", in.emb);
  constant("w1", in.w1);
  constant("b1", in.b1);
  constant("w2", in.w2);
  constant("b2", in.b2);
  return "func.func @f() -> " + results + " {\n" + body + "  " +
         opText(in, tw, tb) + "  return %w, %b : " + tw + ", " + tb + "\n}\n";
}

void check(const Inputs &in, double rtol = 1e-4, double atol = 1e-4) {
  SCOPED_TRACE("emb " + tensorType(in.emb) + " w1 " + tensorType(in.w1) +
               " w2 " + tensorType(in.w2) + " E=" + std::to_string(in.E));
  std::vector<at::Tensor> out =
      compileAndRun(buildIR(in), {in.emb, in.w1, in.b1, in.w2, in.b2}, 2);
  if (out.empty())
    return;
  auto [w, b] = reference(in);
  EXPECT_TRUE(allClose(out[0], w, rtol, atol)) << "w";
  EXPECT_TRUE(allClose(out[1], b, rtol, atol)) << "b";
}

class HyperRouter : public ::testing::Test {
protected:
  void SetUp() override { seedFromTestName(); }
};

TEST_F(HyperRouter, RandomShapes) {
  // (E, D, De, Dh)
  check(randomInputs(2, 3, 5, 7));   // non-powers of two
  check(randomInputs(1, 4, 6, 3));   // E = 1
  check(randomInputs(5, 1, 2, 9));   // D = 1
  check(randomInputs(3, 10, 1, 1));  // De = Dh = 1
  check(randomInputs(8, 33, 17, 12));
}

TEST_F(HyperRouter, PaperConfiguration) {
  // D = 256, E = 16, De = Dh = 256: w2 is [4112, 256].
  check(randomInputs(16, 256, 256, 256));
}

TEST_F(HyperRouter, ReluCutsEverything) {
  // w1 emb + b1 < 0 everywhere: the hidden layer is 0 and out = b2.
  Inputs in = randomInputs(3, 4, 5, 6);
  in.b1 = at::full({6}, -100.0f);
  check(in);
  auto [w, b] = reference(in);
  EXPECT_TRUE(allClose(b, in.b2.view({3, 5}).select(1, 4), 0, 1e-7));
}

TEST_F(HyperRouter, HalfPrecisionOperands) {
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    Inputs in = randomInputs(4, 6, 8, 5);
    for (at::Tensor *x : {&in.emb, &in.w1, &in.b1, &in.w2, &in.b2})
      *x = x->to(t);
    check(in);
  }
}

TEST_F(HyperRouter, ConstantOperandsFold) {
  // Inference: every operand is a constant, the op folds to two constants
  // (App. C.4) and the function returns them.
  Inputs in = randomInputs(3, 4, 5, 6);
  auto module = compile(buildConstantIR(in));
  ASSERT_TRUE(module);
  std::vector<at::Tensor> out = run(*module, "f", {});
  ASSERT_EQ(out.size(), 2u);
  auto [w, b] = reference(in);
  EXPECT_TRUE(allClose(out[0], w, 1e-4, 1e-4));
  EXPECT_TRUE(allClose(out[1], b, 1e-4, 1e-4));
}

} // namespace
