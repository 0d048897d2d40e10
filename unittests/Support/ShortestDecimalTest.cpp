//===- ShortestDecimalTest.cpp - shortestDecimal against std::to_chars ----===//
//
// Part of the MoE-MLIR project.
//
// shortestDecimal (MoE/Support/ShortestDecimal.h) replaces std::to_chars in
// kernel keys and printed attributes so that the wheel's pieces link against
// GCC 10's libstdc++; a key must read the same whichever wrote it. Compared
// here with this build's std::to_chars (GCC 12) on the values keys hold
// (short decimals, integers, specials) and on values that are hard for a
// shortest-representation search: random bit patterns, powers of two (the
// asymmetric gap) and their neighbours, subnormals, the extremes.
//
//===----------------------------------------------------------------------===//

#include "MoE/Support/ShortestDecimal.h"

#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace {

template <typename T> std::string reference(T value) {
  char buf[64];
  std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

template <typename T> void expectSame(T value) {
  ASSERT_EQ(mlir::moe::shortestDecimal(value), reference(value))
      << "value bits " << std::hexfloat << value;
}

template <typename T, typename Bits> T fromBits(Bits bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

TEST(ShortestDecimal, Specials) {
  for (double v : {0.0, -0.0, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN(),
                   -std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::min(),
                   std::numeric_limits<double>::denorm_min(),
                   std::numeric_limits<double>::epsilon()}) {
    expectSame(v);
    expectSame(static_cast<float>(v));
  }
}

TEST(ShortestDecimal, ShortDecimalsAndIntegers) {
  // What keys hold: tau, scales, epsilons and capacities as users write them.
  for (int digits = 1, limit = 10; digits <= 4; ++digits, limit *= 10)
    for (int exp = -25; exp <= 25; ++exp)
      for (int m = 1; m < limit; m += digits <= 2 ? 1 : 37) {
        double v = m * std::pow(10.0, exp - digits);
        expectSame(v);
        expectSame(-v);
        expectSame(static_cast<float>(v));
      }
  for (int64_t i = 0; i < 200000; i += 97)
    expectSame(static_cast<double>(i));
  for (int e = 0; e < 80; ++e) {
    expectSame(std::ldexp(1.0, e) + 0.0);
    expectSame(std::ldexp(1.0, e) * 3);
  }
}

TEST(ShortestDecimal, PowersOfTwoAndNeighbours) {
  for (int e = -1074; e <= 1023; ++e) {
    double v = std::ldexp(1.0, e);
    expectSame(v);
    expectSame(std::nextafter(v, 0.0));
    expectSame(std::nextafter(v, INFINITY));
  }
  for (int e = -149; e <= 127; ++e) {
    float v = std::ldexp(1.0f, e);
    expectSame(v);
    expectSame(std::nextafter(v, 0.0f));
    expectSame(std::nextafter(v, INFINITY));
  }
}

TEST(ShortestDecimal, RecentValuesKept) {
  // More values than the thread's cache holds, twice over, alternating types:
  // a kept text is returned for its own bits only.
  for (int round = 0; round < 3; ++round)
    for (int i = 1; i <= 40; ++i) {
      expectSame(1.0 / i);
      expectSame(1.0f / i);
      expectSame(-1.0 / i);
    }
}

TEST(ShortestDecimal, RandomBitPatterns) {
  std::mt19937_64 rng(20261129);
  for (int i = 0; i < 25000; ++i) {
    double d = fromBits<double>(rng());
    if (!std::isnan(d))
      expectSame(d);
    float f = fromBits<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(f))
      expectSame(f);
  }
}

} // namespace
