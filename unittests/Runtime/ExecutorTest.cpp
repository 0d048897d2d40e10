//===- ExecutorTest.cpp - Tests of the moe execution API ------------------===//
//
// Part of the MoE-MLIR project.
//
// Plain linalg/arith/tensor functions (no moe op): compile, call, and every
// misuse of the API gives a clear llvm::Error instead of a crash.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/Executor.h"
#include "CompiledModuleTest.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

using namespace mlir::moe;

namespace {

/// The text of an Error (consumed), or "" for success.
std::string errorText(llvm::Error err) {
  if (!err)
    return "";
  return llvm::toString(std::move(err));
}

/// The error of compiling `source`, which must fail: "" (and a failure) when
/// it compiles.
std::string compileErrorText(const char *source) {
  auto compiled = Executor::compile(source);
  if (compiled) {
    ADD_FAILURE() << "compiled, expected an error";
    return "";
  }
  return llvm::toString(compiled.takeError());
}

/// `msg` (an error's text) holds `part`; the failure shows the whole message.
::testing::AssertionResult hasText(const std::string &msg, const char *part) {
  if (msg.find(part) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' is not in: " << msg;
}

const char *kModule = R"mlir(
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @add(%a: tensor<4x?xf32>, %b: tensor<4x?xf32>) -> tensor<4x?xf32> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %a, %c1 : tensor<4x?xf32>
  %init = tensor.empty(%n) : tensor<4x?xf32>
  %r = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<4x?xf32>, tensor<4x?xf32>) outs(%init : tensor<4x?xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  } -> tensor<4x?xf32>
  return %r : tensor<4x?xf32>
}

func.func @matmul(%a: tensor<3x5xf32>, %b: tensor<5x2xf32>) -> tensor<3x2xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<3x2xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<3x2xf32>) -> tensor<3x2xf32>
  %r = linalg.matmul ins(%a, %b : tensor<3x5xf32>, tensor<5x2xf32>) outs(%fill : tensor<3x2xf32>) -> tensor<3x2xf32>
  return %r : tensor<3x2xf32>
}

// Two results of other element types: a row sum as i32 and a positivity mask.
func.func @stats(%x: tensor<?x3xi32>) -> (tensor<?xi32>, tensor<?x3xi1>) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0 : i32
  %n = tensor.dim %x, %c0 : tensor<?x3xi32>
  %init = tensor.empty(%n) : tensor<?xi32>
  %fill = linalg.fill ins(%zero : i32) outs(%init : tensor<?xi32>) -> tensor<?xi32>
  %sum = linalg.reduce ins(%x : tensor<?x3xi32>) outs(%fill : tensor<?xi32>) dimensions = [1]
    (%in: i32, %acc: i32) {
      %s = arith.addi %in, %acc : i32
      linalg.yield %s : i32
    }
  %minit = tensor.empty(%n) : tensor<?x3xi1>
  %mask = linalg.map ins(%x : tensor<?x3xi32>) outs(%minit : tensor<?x3xi1>)
    (%in: i32, %o: i1) {
      %p = arith.cmpi sgt, %in, %zero : i32
      linalg.yield %p : i1
    }
  return %sum, %mask : tensor<?xi32>, tensor<?x3xi1>
}

// Writes into its argument at the tensor level: the caller's buffer must stay intact.
func.func @poke(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c0 = arith.constant 0 : index
  %v = arith.constant 42.0 : f32
  %r = tensor.insert %v into %x[%c0] : tensor<4xf32>
  return %r : tensor<4xf32>
}

func.func @scalar_sum(%x: tensor<5xf64>) -> tensor<f64> {
  %zero = arith.constant 0.0 : f64
  %init = tensor.empty() : tensor<f64>
  %fill = linalg.fill ins(%zero : f64) outs(%init : tensor<f64>) -> tensor<f64>
  %r = linalg.reduce ins(%x : tensor<5xf64>) outs(%fill : tensor<f64>) dimensions = [0]
    (%in: f64, %acc: f64) {
      %s = arith.addf %in, %acc : f64
      linalg.yield %s : f64
    }
  return %r : tensor<f64>
}

func.func @half_to_float(%x: tensor<3xf16>, %y: tensor<3xbf16>) -> tensor<3xf32> {
  %init = tensor.empty() : tensor<3xf32>
  %r = linalg.map ins(%x, %y : tensor<3xf16>, tensor<3xbf16>) outs(%init : tensor<3xf32>)
    (%a: f16, %b: bf16, %o: f32) {
      %fa = arith.extf %a : f16 to f32
      %fb = arith.extf %b : bf16 to f32
      %s = arith.addf %fa, %fb : f32
      linalg.yield %s : f32
    }
  return %r : tensor<3xf32>
}

func.func @takes_scalar(%x: f32) -> tensor<1xf32> {
  %r = tensor.from_elements %x : tensor<1xf32>
  return %r : tensor<1xf32>
}

func.func private @helper() -> ()
)mlir";

class ExecutorTest : public CompiledModuleTest<ExecutorTest> {
public:
  static const char *source() { return kModule; }
};

TEST_F(ExecutorTest, ListsCallableFunctions) {
  std::vector<std::string> names;
  for (const FunctionSignature &sig : module->functions())
    names.push_back(sig.name);
  EXPECT_EQ(names, (std::vector<std::string>{"add", "matmul", "stats", "poke", "scalar_sum", "half_to_float",
                                             "takes_scalar"}));
  const FunctionSignature *add = module->signature("add");
  ASSERT_NE(add, nullptr);
  ASSERT_EQ(add->inputs.size(), 2u);
  EXPECT_EQ(add->inputs[0].typeStr, "tensor<4x?xf32>");
  EXPECT_EQ(add->inputs[0].shape[1], kDynamicSize);
  EXPECT_EQ(module->signature("helper"), nullptr);
}

TEST_F(ExecutorTest, AddWithDynamicSize) {
  const int64_t n = 7; // not a power of two
  std::vector<float> a(4 * n), b(4 * n), out(4 * n, -1.0f);
  std::iota(a.begin(), a.end(), 0.0f);
  for (int64_t i = 0; i < 4 * n; ++i)
    b[i] = 0.5f * i;
  HostTensor ta(DType::F32, {4, n}, a.data()), tb(DType::F32, {4, n}, b.data());
  HostTensor to(DType::F32, {4, n}, out.data());
  ASSERT_EQ(errorText(module->call("add", {ta, tb}, {to})), "");
  for (int64_t i = 0; i < 4 * n; ++i)
    EXPECT_EQ(out[i], a[i] + b[i]) << i;
}

TEST_F(ExecutorTest, EmptyDynamicSize) {
  HostTensor ta(DType::F32, {4, 0}, nullptr), tb(DType::F32, {4, 0}, nullptr);
  auto results = module->call("add", {ta, tb});
  ASSERT_TRUE(bool(results)) << llvm::toString(results.takeError());
  ASSERT_EQ(results->size(), 1u);
  EXPECT_EQ((*results)[0].shape(), (llvm::ArrayRef<int64_t>{4, 0}));
}

TEST_F(ExecutorTest, Matmul) {
  std::vector<float> a(15), b(10), out(6);
  for (int i = 0; i < 15; ++i)
    a[i] = std::sin(1.0f + i);
  for (int i = 0; i < 10; ++i)
    b[i] = std::cos(2.0f * i);
  ASSERT_EQ(errorText(module->call(
                "matmul",
                {HostTensor(DType::F32, {3, 5}, a.data()),
                 HostTensor(DType::F32, {5, 2}, b.data())},
                {HostTensor(DType::F32, {3, 2}, out.data())})),
            "");
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      double ref = 0;
      for (int k = 0; k < 5; ++k)
        ref += double(a[i * 5 + k]) * b[k * 2 + j];
      EXPECT_NEAR(out[i * 2 + j], ref, 1e-5);
    }
}

TEST_F(ExecutorTest, MultipleResultsOfIntegerAndBoolTypes) {
  std::vector<int32_t> x = {1, -2, 3, 0, 0, 0, -5, 6, 7, 100, -100, 1};
  auto results =
      module->call("stats", {HostTensor(DType::I32, {4, 3}, x.data())});
  ASSERT_TRUE(bool(results)) << llvm::toString(results.takeError());
  ASSERT_EQ(results->size(), 2u);
  const Tensor &sum = (*results)[0], &mask = (*results)[1];
  EXPECT_EQ(sum.dtype(), DType::I32);
  EXPECT_EQ(sum.shape(), (llvm::ArrayRef<int64_t>{4}));
  EXPECT_EQ(mask.dtype(), DType::I1);
  EXPECT_EQ(mask.shape(), (llvm::ArrayRef<int64_t>{4, 3}));
  std::vector<int32_t> sums(sum.data<int32_t>(), sum.data<int32_t>() + 4);
  EXPECT_EQ(sums, (std::vector<int32_t>{2, 0, 8, 1}));
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(mask.data<uint8_t>()[i], x[i] > 0 ? 1 : 0) << i;

  // The same through caller-provided outputs.
  std::vector<int32_t> s(4);
  std::vector<uint8_t> m(12);
  ASSERT_EQ(errorText(module->call("stats",
                                   {HostTensor(DType::I32, {4, 3}, x.data())},
                                   {HostTensor(DType::I32, {4}, s.data()),
                                    HostTensor(DType::I1, {4, 3}, m.data())})),
            "");
  EXPECT_EQ(s, sums);
}

TEST_F(ExecutorTest, RankZeroF64AndHalfTypes) {
  std::vector<double> x = {1, 2, 3, 4, 5.5};
  double out = 0;
  ASSERT_EQ(errorText(module->call("scalar_sum",
                                   {HostTensor(DType::F64, {5}, x.data())},
                                   {HostTensor(DType::F64, {}, &out)})),
            "");
  EXPECT_EQ(out, 15.5);

  // f16 1.5 = 0x3E00, bf16 2.0 = 0x4000.
  std::vector<uint16_t> h = {0x3E00, 0x3E00, 0x0000}, bf = {0x4000, 0, 0x4000};
  std::vector<float> r(3);
  ASSERT_EQ(errorText(module->call("half_to_float",
                                   {HostTensor(DType::F16, {3}, h.data()),
                                    HostTensor(DType::BF16, {3}, bf.data())},
                                   {HostTensor(DType::F32, {3}, r.data())})),
            "");
  EXPECT_EQ(r, (std::vector<float>{3.5f, 1.5f, 2.0f}));
}

TEST_F(ExecutorTest, InputsAreNeverWritten) {
  std::vector<float> x = {1, 2, 3, 4}, out(4);
  ASSERT_EQ(errorText(module->call("poke",
                                   {HostTensor(DType::F32, {4}, x.data())},
                                   {HostTensor(DType::F32, {4}, out.data())})),
            "");
  EXPECT_EQ(out, (std::vector<float>{42, 2, 3, 4}));
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3, 4}));
}

TEST(ExecutorCompileTest, ResultsThatAreArgumentsOrConstants) {
  // Bufferization returns a clone of an argument or a constant (the caller
  // owns every result), so the executor may free every result it gets.
  // Neither may crash or free the caller's buffer; repeat to catch a double
  // free.
  auto compiled = Executor::compile(R"mlir(
func.func @identity(%x: tensor<3xf32>) -> tensor<3xf32> {
  return %x : tensor<3xf32>
}
func.func @constant() -> tensor<2xi64> {
  %c = arith.constant dense<[7, -9]> : tensor<2xi64>
  return %c : tensor<2xi64>
}
func.func @twice(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>) {
  return %x, %x : tensor<3xf32>, tensor<3xf32>
})mlir");
  ASSERT_TRUE(bool(compiled)) << llvm::toString(compiled.takeError());
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> x = {1, 2, 3}, out(3), out2(3);
    ASSERT_EQ(errorText((*compiled)->call(
                  "identity", {HostTensor(DType::F32, {3}, x.data())},
                  {HostTensor(DType::F32, {3}, out.data())})),
              "");
    EXPECT_EQ(out, x);
    std::vector<int64_t> c(2);
    ASSERT_EQ(errorText((*compiled)->call(
                  "constant", {}, {HostTensor(DType::I64, {2}, c.data())})),
              "");
    EXPECT_EQ(c, (std::vector<int64_t>{7, -9}));
    ASSERT_EQ(errorText((*compiled)->call(
                  "twice", {HostTensor(DType::F32, {3}, x.data())},
                  {HostTensor(DType::F32, {3}, out.data()),
                   HostTensor(DType::F32, {3}, out2.data())})),
              "");
    EXPECT_EQ(out2, x);
  }
}

TEST_F(ExecutorTest, TwoRunsAreBitIdentical) {
  std::vector<float> a(15), b(10);
  for (int i = 0; i < 15; ++i)
    a[i] = std::exp(std::sin(3.0f * i)) * 1e3f;
  for (int i = 0; i < 10; ++i)
    b[i] = std::cos(0.7f * i) * 1e-3f;
  std::vector<float> out1(6), out2(6);
  for (std::vector<float> *out : {&out1, &out2})
    ASSERT_EQ(errorText(module->call(
                  "matmul",
                  {HostTensor(DType::F32, {3, 5}, a.data()),
                   HostTensor(DType::F32, {5, 2}, b.data())},
                  {HostTensor(DType::F32, {3, 2}, out->data())})),
              "");
  EXPECT_EQ(std::memcmp(out1.data(), out2.data(), 6 * sizeof(float)), 0);
}

//===----------------------------------------------------------------------===//
// Misuse: every case is an Error that names the function and the argument.
//===----------------------------------------------------------------------===//

TEST_F(ExecutorTest, UnknownFunction) {
  std::string msg = errorText(module->call("nope", {}, {}));
  EXPECT_TRUE(hasText(msg, "no callable function @nope"));
  // A private declaration is not callable either.
  msg = errorText(module->call("helper", {}, {}));
  EXPECT_TRUE(hasText(msg, "@helper"));
}

TEST_F(ExecutorTest, WrongNumberOfInputsOrOutputs) {
  std::vector<float> a(12), out(12);
  HostTensor t(DType::F32, {4, 3}, a.data()), o(DType::F32, {4, 3}, out.data());
  std::string msg = errorText(module->call("add", {t}, {o}));
  EXPECT_TRUE(hasText(msg, "@add takes 2 input(s), got 1"));
  msg = errorText(module->call("add", {t, t, t}, {o}));
  EXPECT_TRUE(hasText(msg, "got 3"));
  msg = errorText(module->call("add", {t, t}, {}));
  EXPECT_TRUE(hasText(msg, "@add returns 1 result(s), got 0 output(s)"));
  msg = errorText(module->call("add", {t, t}, {o, o}));
  EXPECT_TRUE(hasText(msg, "got 2 output(s)"));
}

TEST_F(ExecutorTest, WrongRank) {
  std::vector<float> a(12), out(12);
  HostTensor good(DType::F32, {4, 3}, a.data());
  HostTensor bad(DType::F32, {4, 3, 1}, a.data());
  std::string msg = errorText(module->call(
      "add", {good, bad}, {HostTensor(DType::F32, {4, 3}, out.data())}));
  EXPECT_TRUE(hasText(msg,
                      "@add: input #1 (tensor<4x?xf32>) has rank 3 (shape [4, "
                      "3, 1]), expected rank 2"));
  msg = errorText(module->call("add", {good, good},
                               {HostTensor(DType::F32, {12}, out.data())}));
  EXPECT_TRUE(hasText(msg, "output #0"));
  EXPECT_TRUE(hasText(msg, "expected rank 2"));
}

TEST_F(ExecutorTest, WrongStaticSize) {
  std::vector<float> a(15), b(10), out(6);
  std::string msg = errorText(module->call(
      "matmul",
      {HostTensor(DType::F32, {3, 5}, a.data()),
       HostTensor(DType::F32, {2, 5}, b.data())},
      {HostTensor(DType::F32, {3, 2}, out.data())}));
  EXPECT_TRUE(hasText(msg,
                      "@matmul: input #1 (tensor<5x2xf32>) has shape [2, 5]: "
                      "dimension 0 is 2, expected 5"));
  msg = errorText(module->call("matmul",
                               {HostTensor(DType::F32, {3, 5}, a.data()),
                                HostTensor(DType::F32, {5, 2}, b.data())},
                               {HostTensor(DType::F32, {2, 3}, out.data())}));
  EXPECT_TRUE(hasText(msg, "output #0 (tensor<3x2xf32>) has shape [2, 3]"));
  msg = errorText(module->call("matmul",
                               {HostTensor(DType::F32, {3, -5}, a.data()),
                                HostTensor(DType::F32, {5, 2}, b.data())},
                               {HostTensor(DType::F32, {3, 2}, out.data())}));
  EXPECT_TRUE(hasText(msg, "negative"));
}

TEST_F(ExecutorTest, WrongDynamicResultSize) {
  // The output's dynamic size is only known after the call.
  std::vector<float> a(4 * 5), out(4 * 6);
  HostTensor t(DType::F32, {4, 5}, a.data());
  std::string msg = errorText(
      module->call("add", {t, t}, {HostTensor(DType::F32, {4, 6}, out.data())}));
  EXPECT_TRUE(hasText(msg,
                      "@add: result #0 has shape [4, 5], but output #0 has "
                      "shape [4, 6]"));
}

TEST_F(ExecutorTest, WrongDType) {
  std::vector<double> a(12);
  std::vector<float> b(12), out(12);
  std::string msg = errorText(module->call(
      "add",
      {HostTensor(DType::F64, {4, 3}, a.data()),
       HostTensor(DType::F32, {4, 3}, b.data())},
      {HostTensor(DType::F32, {4, 3}, out.data())}));
  EXPECT_TRUE(hasText(msg, "@add: input #0 (tensor<4x?xf32>) has dtype f64, "
                           "expected f32"));
  std::vector<int32_t> x(6);
  msg = errorText(module->call("stats", {HostTensor(DType::I32, {2, 3}, x.data())},
                               {HostTensor(DType::I32, {2}, x.data()),
                                HostTensor(DType::I8, {2, 3}, x.data())}));
  EXPECT_TRUE(
      hasText(msg, "output #1 (tensor<?x3xi1>) has dtype i8, expected i1"));
}

TEST_F(ExecutorTest, NullDataAndUnsupportedArgumentTypes) {
  std::vector<float> out(12);
  std::string msg = errorText(module->call(
      "add",
      {HostTensor(DType::F32, {4, 3}, nullptr),
       HostTensor(DType::F32, {4, 3}, out.data())},
      {HostTensor(DType::F32, {4, 3}, out.data())}));
  EXPECT_TRUE(hasText(msg, "input #0 (tensor<4x?xf32>): data pointer is null"));
  float x = 1, r = 0;
  msg = errorText(module->call("takes_scalar",
                               {HostTensor(DType::F32, {}, &x)},
                               {HostTensor(DType::F32, {1}, &r)}));
  EXPECT_TRUE(hasText(msg,
                      "@takes_scalar: input #0 (f32): only ranked tensors can "
                      "be passed"));
}

//===----------------------------------------------------------------------===//
// Compilation errors and run-time errors of the compiled code.
//===----------------------------------------------------------------------===//

TEST(ExecutorCompileTest, ParseError) {
  std::string msg = compileErrorText("func.func @f( {");
  EXPECT_TRUE(hasText(msg, "cannot parse the module"));
  EXPECT_TRUE(hasText(msg, "error:"));
}

TEST(ExecutorCompileTest, DeepNestingIsAnErrorNotAStackOverflow) {
  std::string text = "func.func private @f(%a: " + std::string(100000, '(') + ")";
  auto compiled = Executor::compile(text);
  ASSERT_FALSE(bool(compiled));
  std::string msg = llvm::toString(compiled.takeError());
  EXPECT_NE(msg.find("nested deeper than 1024 levels"), std::string::npos) << msg;
}

TEST(ExecutorCompileTest, VerifierErrorOfAMoEOp) {
  // k > K: the moe verifier rejects it at parse time, with its own message.
  std::string msg = compileErrorText(R"mlir(
func.func @f(%x: tensor<4x3xf32>) -> (tensor<4x5xf32>, tensor<4x5xi32>) {
  %w, %i = moe.topk_renorm %x k(5) : tensor<4x3xf32> -> tensor<4x5xf32>, tensor<4x5xi32>
  return %w, %i : tensor<4x5xf32>, tensor<4x5xi32>
})mlir");
  EXPECT_TRUE(hasText(msg, "cannot parse the module"));
  EXPECT_TRUE(hasText(msg, "topk_renorm"));
}

TEST(ExecutorCompileTest, RuntimeIndexErrorBecomesAnError) {
  // Stands in for a lowered moe op that met an out-of-range index: it reports
  // through the run-time ABI of ErrorReporting.h, skips the element and goes on.
  auto compiled = Executor::compile(R"mlir(
func.func private @moeReportIndexError(i32, i64, i64, i64)
func.func @check(%idx: tensor<3xi32>) -> tensor<3xi32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %bound = arith.constant 16 : i32
  %zero = arith.constant 0 : i32
  %op = arith.constant 2 : i32
  %r = scf.for %i = %c0 to %c3 step %c1 iter_args(%acc = %idx) -> tensor<3xi32> {
    %v = tensor.extract %idx[%i] : tensor<3xi32>
    %lo = arith.cmpi slt, %v, %zero : i32
    %hi = arith.cmpi sge, %v, %bound : i32
    %bad = arith.ori %lo, %hi : i1
    %next = scf.if %bad -> tensor<3xi32> {
      %pos = arith.index_cast %i : index to i64
      %v64 = arith.extsi %v : i32 to i64
      %b64 = arith.extsi %bound : i32 to i64
      func.call @moeReportIndexError(%op, %pos, %v64, %b64) : (i32, i64, i64, i64) -> ()
      %z = tensor.insert %zero into %acc[%i] : tensor<3xi32>
      scf.yield %z : tensor<3xi32>
    } else {
      scf.yield %acc : tensor<3xi32>
    }
    scf.yield %next : tensor<3xi32>
  }
  return %r : tensor<3xi32>
})mlir");
  ASSERT_TRUE(bool(compiled)) << llvm::toString(compiled.takeError());
  std::vector<int32_t> good = {0, 5, 15}, bad = {1, 17, -1}, out(3);
  std::string msg = errorText((*compiled)->call(
      "check", {HostTensor(DType::I32, {3}, bad.data())},
      {HostTensor(DType::I32, {3}, out.data())}));
  EXPECT_TRUE(hasText(msg,
                      "@check: run-time error: moe.adjacency_update: 'idx' "
                      "element 1 is 17, outside [0, 16)"));
  // The error was taken: the next call is clean.
  ASSERT_EQ(errorText((*compiled)->call(
                "check", {HostTensor(DType::I32, {3}, good.data())},
                {HostTensor(DType::I32, {3}, out.data())})),
            "");
  EXPECT_EQ(out, good);
  // The same through the allocating call.
  auto results =
      (*compiled)->call("check", {HostTensor(DType::I32, {3}, bad.data())});
  ASSERT_FALSE(bool(results));
  msg = llvm::toString(results.takeError());
  EXPECT_TRUE(hasText(msg, "run-time error"));
}

TEST(ExecutorCompileTest, CompileTwiceIndependently) {
  const char *text = R"mlir(
func.func @neg(%x: tensor<2xf32>) -> tensor<2xf32> {
  %init = tensor.empty() : tensor<2xf32>
  %r = linalg.map ins(%x : tensor<2xf32>) outs(%init : tensor<2xf32>)
    (%a: f32, %o: f32) {
      %n = arith.negf %a : f32
      linalg.yield %n : f32
    }
  return %r : tensor<2xf32>
})mlir";
  auto m1 = Executor::compile(text);
  auto m2 = Executor::compile(text, CompileOptions{/*optLevel=*/0});
  ASSERT_TRUE(bool(m1)) << llvm::toString(m1.takeError());
  ASSERT_TRUE(bool(m2)) << llvm::toString(m2.takeError());
  std::vector<float> x = {1, -2}, o1(2), o2(2);
  ASSERT_EQ(errorText((*m1)->call("neg", {HostTensor(DType::F32, {2}, x.data())},
                                  {HostTensor(DType::F32, {2}, o1.data())})),
            "");
  m1->reset();
  ASSERT_EQ(errorText((*m2)->call("neg", {HostTensor(DType::F32, {2}, x.data())},
                                  {HostTensor(DType::F32, {2}, o2.data())})),
            "");
  EXPECT_EQ(o1, (std::vector<float>{-1, 2}));
  EXPECT_EQ(o2, o1);
}

} // namespace
