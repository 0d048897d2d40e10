//===- ReferenceUtils.cpp - Helpers of the libtorch reference tests -------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "ReferenceUtils.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>

namespace moe_ref {

/// The element types the reference tests pass: libtorch's and the execution
/// API's (whose dtypeName is the MLIR spelling).
static constexpr std::pair<at::ScalarType, DType> kElementTypes[] = {
    {at::kFloat, DType::F32},     {at::kHalf, DType::F16},
    {at::kBFloat16, DType::BF16}, {at::kDouble, DType::F64},
    {at::kBool, DType::I1},       {at::kChar, DType::I8},
    {at::kInt, DType::I32},       {at::kLong, DType::I64}};

static std::optional<DType> findDType(at::ScalarType type) {
  for (auto [scalar, dtype] : kElementTypes)
    if (scalar == type)
      return dtype;
  return std::nullopt;
}

std::string mlirElementType(at::ScalarType type) {
  if (std::optional<DType> dtype = findDType(type))
    return dtypeName(*dtype).str();
  ADD_FAILURE() << "no MLIR element type for " << type;
  return "?";
}

static DType toDType(at::ScalarType type) {
  if (std::optional<DType> dtype = findDType(type))
    return *dtype;
  ADD_FAILURE() << "no DType for " << type;
  return DType::F32;
}

static at::ScalarType toScalarType(DType dtype) {
  for (auto [scalar, d] : kElementTypes)
    if (d == dtype)
      return scalar;
  return at::kFloat;
}

std::string tensorType(llvm::ArrayRef<int64_t> shape, at::ScalarType type) {
  std::string s = "tensor<";
  for (int64_t d : shape)
    s += (d < 0 ? std::string("?") : std::to_string(d)) + "x";
  return s + mlirElementType(type) + ">";
}

std::string tensorType(const at::Tensor &t) {
  return tensorType(t.sizes().vec(), t.scalar_type());
}

std::string tensorType(const at::Tensor &t,
                       std::initializer_list<int> dynamicDims) {
  std::vector<int64_t> shape = t.sizes().vec();
  for (int d : dynamicDims)
    shape[d] = -1;
  return tensorType(shape, t.scalar_type());
}

std::string floatLiteral(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9e", static_cast<double>(float(value)));
  return buf;
}

HostTensor view(const at::Tensor &t) {
  EXPECT_TRUE(t.is_contiguous());
  return HostTensor(toDType(t.scalar_type()), t.sizes().vec(), t.data_ptr());
}

std::unique_ptr<CompiledModule> compile(const std::string &ir) {
  auto compiled = mlir::moe::Executor::compile(ir);
  if (!compiled) {
    ADD_FAILURE() << llvm::toString(compiled.takeError()) << "\nIR:\n" << ir;
    return nullptr;
  }
  return std::move(*compiled);
}

static std::vector<HostTensor> views(std::vector<at::Tensor> &inputs) {
  std::vector<HostTensor> out;
  for (at::Tensor &t : inputs) {
    t = t.contiguous();
    out.push_back(view(t));
  }
  return out;
}

static at::Tensor toAten(mlir::moe::Tensor &t) {
  at::Tensor out = at::empty(t.shape().vec(), toScalarType(t.dtype()));
  if (t.sizeInBytes())
    std::memcpy(out.data_ptr(), t.data(), t.sizeInBytes());
  return out;
}

std::vector<at::Tensor> run(const CompiledModule &module, const std::string &fn,
                            std::vector<at::Tensor> inputs) {
  std::vector<HostTensor> in = views(inputs);
  std::vector<at::Tensor> runs[2];
  for (auto &results : runs) {
    auto out = module.call(fn, in);
    if (!out) {
      ADD_FAILURE() << llvm::toString(out.takeError());
      return {};
    }
    for (mlir::moe::Tensor &t : *out)
      results.push_back(toAten(t));
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    const at::Tensor &a = runs[0][i], &b = runs[1][i];
    size_t bytes = a.numel() * a.element_size();
    // memcmp's pointers must be valid even for 0 bytes; an empty result's data_ptr() is null.
    EXPECT_TRUE(a.sizes() == b.sizes() &&
                (bytes == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), bytes) == 0))
        << "result #" << i << " of @" << fn
        << " differs between two runs on the same inputs";
  }
  return runs[0];
}

std::vector<at::Tensor> compileAndRun(const std::string &ir,
                                      std::vector<at::Tensor> inputs,
                                      size_t numResults) {
  std::unique_ptr<CompiledModule> module = compile(ir);
  if (!module)
    return {};
  std::vector<at::Tensor> out = run(*module, "f", std::move(inputs));
  if (out.empty() && numResults != 0)
    return {}; // run recorded the failure
  if (out.size() != numResults) {
    ADD_FAILURE() << "@f returned " << out.size() << " results, expected "
                  << numResults;
    return {};
  }
  return out;
}

std::string runExpectingError(const CompiledModule &module,
                              const std::string &fn,
                              std::vector<at::Tensor> inputs) {
  std::vector<HostTensor> in = views(inputs);
  auto out = module.call(fn, in);
  if (out) {
    ADD_FAILURE() << "@" << fn << " succeeded, an error was expected";
    return "";
  }
  return llvm::toString(out.takeError());
}

static std::string indexString(const at::Tensor &t, int64_t flat) {
  std::string s = "[";
  auto sizes = t.sizes();
  std::vector<int64_t> idx(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = sizes[d] ? flat % sizes[d] : 0;
    flat = sizes[d] ? flat / sizes[d] : 0;
  }
  for (size_t d = 0; d < idx.size(); ++d)
    s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

::testing::AssertionResult allClose(const at::Tensor &actual,
                                    const at::Tensor &expected, double rtol,
                                    double atol) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream os;
    os << "shape " << actual.sizes() << " != expected " << expected.sizes();
    return ::testing::AssertionFailure() << os.str();
  }
  at::Tensor a = actual.to(at::kDouble).contiguous().reshape({-1});
  at::Tensor e = expected.to(at::kDouble).contiguous().reshape({-1});
  const double *pa = a.data_ptr<double>(), *pe = e.data_ptr<double>();
  int64_t worst = -1, failures = 0;
  double worstExcess = 0;
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    double x = pa[i], y = pe[i];
    bool ok;
    double excess = 0;
    if (std::isnan(y) || std::isnan(x))
      ok = std::isnan(x) && std::isnan(y);
    else if (std::isinf(y) || std::isinf(x))
      ok = x == y;
    else {
      excess = std::fabs(x - y) - (atol + rtol * std::fabs(y));
      ok = excess <= 0;
    }
    if (!ok) {
      ++failures;
      if (worst < 0 || excess > worstExcess || std::isnan(x) != std::isnan(y)) {
        worst = i;
        worstExcess = std::isnan(excess) ? 1e300 : excess;
      }
    }
  }
  if (failures == 0)
    return ::testing::AssertionSuccess();
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%lld of %lld elements differ (rtol %g, atol %g); worst at %s: "
                "actual %.9g, expected %.9g",
                static_cast<long long>(failures),
                static_cast<long long>(a.numel()), rtol, atol,
                indexString(expected, worst).c_str(), pa[worst], pe[worst]);
  return ::testing::AssertionFailure() << buf;
}

::testing::AssertionResult exactlyEqual(const at::Tensor &actual,
                                        const at::Tensor &expected) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream os;
    os << "shape " << actual.sizes() << " != expected " << expected.sizes();
    return ::testing::AssertionFailure() << os.str();
  }
  if (actual.is_floating_point() || expected.is_floating_point())
    return allClose(actual, expected, 0, 0);
  at::Tensor a = actual.to(at::kLong).contiguous().reshape({-1});
  at::Tensor e = expected.to(at::kLong).contiguous().reshape({-1});
  for (int64_t i = 0, n = a.numel(); i < n; ++i)
    if (a.data_ptr<int64_t>()[i] != e.data_ptr<int64_t>()[i])
      return ::testing::AssertionFailure()
             << "at " << indexString(expected, i) << ": actual "
             << a.data_ptr<int64_t>()[i] << ", expected "
             << e.data_ptr<int64_t>()[i];
  return ::testing::AssertionSuccess();
}

std::pair<at::Tensor, at::Tensor> stableTopk(const at::Tensor &scores,
                                             int64_t k) {
  // A stable descending sort keeps equal values in index order and puts NaN
  // first (checked on torch 2.15: sort([1, nan, 3, 3, -inf, nan, inf]) gives
  // indices [1, 5, 6, 2, 3, 0, 4]).
  auto [values, indices] =
      at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  return {values.narrow(-1, 0, k).contiguous(),
          indices.narrow(-1, 0, k).contiguous()};
}

at::Tensor entropy(const at::Tensor &probs) {
  return -at::xlogy(probs, probs).sum(-1);
}

at::Tensor randomProbs(llvm::ArrayRef<int64_t> shape, double temperature) {
  return at::softmax(at::randn(shape.vec(), at::kFloat) * temperature, -1);
}

void seedFromTestName() {
  const ::testing::TestInfo *info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." +
                                info->name()
                          : "";
  at::manual_seed(std::hash<std::string>()(name) & 0x7fffffff);
  at::set_num_threads(1);
}

} // namespace moe_ref
