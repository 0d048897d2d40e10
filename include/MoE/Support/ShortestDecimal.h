//===- ShortestDecimal.h - The shortest decimal that reads back -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// shortestDecimal(x) is the text std::to_chars(first, last, x) writes (no
// format): the fewest significant digits that read back as x, in fixed or
// scientific notation, whichever is shorter (fixed on a tie; a fixed integer
// exact, "1152921504606846976", the closest of the equally short texts).
// Kernel keys and the op's printed attributes hold floats in this form.
//
// Written with printf and strtod rather than std::to_chars because the
// floating-point to_chars is GCC 11's (GLIBCXX_3.4.29): the wheel's pieces
// link against GCC 10's libstdc++ (scripts/glibc-sysroot.sh), and a key must
// not depend on which libstdc++ a piece was linked with. printf's %e rounds
// correctly, so p digits of %.{p-1}e are the p-digit decimal nearest x; the
// shortest p for which it reads back is the shortest representation (or its
// neighbour one unit of the last digit away, where x is a power of two whose
// lower neighbour is nearer: both are tried), found by binary search.
// unittests/Support checks it against std::to_chars on random, integral and
// boundary values.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_SHORTESTDECIMAL_H
#define MOE_SUPPORT_SHORTESTDECIMAL_H

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

namespace mlir::moe {
namespace detail {

/// A decimal d.ddd × 10^exp: `digits` (no leading or trailing zeros but for
/// the single digit "0") and the exponent of its first digit.
struct Decimal {
  std::string digits;
  int exp = 0;
};

template <typename T> bool readsBack(const std::string &text, T value) {
  if constexpr (std::is_same_v<T, float>)
    return std::strtof(text.c_str(), nullptr) == value;
  else
    return std::strtod(text.c_str(), nullptr) == value;
}

inline std::string scientific(const Decimal &d) {
  std::string s(1, d.digits[0]);
  if (d.digits.size() > 1) {
    s += '.';
    s.append(d.digits, 1);
  }
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", d.exp < 0 ? '-' : '+',
                std::abs(d.exp));
  return s + exp;
}

/// The p-digit decimal nearest `value` (printf rounds correctly), shifted
/// by `step` units of its last digit; `value` is finite, > 0.
inline Decimal nearestDigits(double value, int p, int step) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*e", p - 1, value);
  std::string text(buf);
  size_t e = text.find('e');
  std::string mant = text.substr(0, e);
  Decimal d;
  d.exp = std::atoi(text.c_str() + e + 1);
  for (char c : mant)
    if (c != '.')
      d.digits += c;
  if (step != 0) {
    uint64_t n = std::strtoull(d.digits.c_str(), nullptr, 10) + step;
    std::string s = std::to_string(n);
    if (s.size() > d.digits.size()) // 99..9 + 1
      ++d.exp;
    else if (s.size() < d.digits.size()) // 10..0 - 1
      --d.exp, s += '9';
    d.digits = s.substr(0, p);
  }
  while (d.digits.size() > 1 && d.digits.back() == '0')
    d.digits.pop_back();
  return d;
}

/// A p-digit decimal that reads back as `value`: the nearest, else (a power
/// of two, whose lower half-gap is the narrower) its neighbour above or below.
template <typename T> std::optional<Decimal> readingBack(T value, int p) {
  for (int step : {0, 1, -1}) {
    Decimal d = nearestDigits(value, p, step);
    if (d.digits.size() <= static_cast<size_t>(p) &&
        readsBack(scientific(d), value))
      return d;
  }
  return std::nullopt;
}

/// The fewest-digit decimal that reads back as `value` (finite, > 0), the
/// nearest of those. Binary search: a p-digit decimal that reads back makes
/// one of p + 1 digits (a 0 appended), and every one of max digits does.
template <typename T> Decimal shortestDigits(T value) {
  constexpr int maxDigits = std::is_same_v<T, float> ? 9 : 17;
  std::optional<Decimal> best;
  int lo = 1, hi = maxDigits;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (std::optional<Decimal> d = readingBack(value, mid)) {
      best = std::move(d);
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return best ? *best : nearestDigits(value, maxDigits, 0);
}

/// `d` in fixed notation; an integer exactly (`value`'s every digit).
template <typename T> std::string fixed(const Decimal &d, T value) {
  int n = static_cast<int>(d.digits.size());
  if (d.exp >= n - 1) {
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.0f", static_cast<double>(value));
    return buf;
  }
  if (d.exp >= 0)
    return d.digits.substr(0, d.exp + 1) + "." + d.digits.substr(d.exp + 1);
  return "0." + std::string(-d.exp - 1, '0') + d.digits;
}

/// std::to_chars's text of `value`, computed.
template <typename T> std::string format(T value) {
  std::string sign = std::signbit(value) ? "-" : "";
  if (std::isnan(value))
    return sign + "nan";
  if (std::isinf(value))
    return sign + "inf";
  if (value == 0)
    return sign + "0";
  T magnitude = std::fabs(value);
  Decimal d = shortestDigits(magnitude);
  std::string fix = fixed(d, magnitude);
  std::string sci = scientific(d);
  return sign + (fix.size() <= sci.size() ? fix : sci);
}

} // namespace detail

/// std::to_chars(first, last, value) without a format, as a string. The
/// search costs microseconds (printf and strtod a few times) where a kernel
/// key is built on every torch op call: the last values formatted in this
/// thread are kept (a call's attributes are few and repeat from call to call).
template <typename T> std::string shortestDecimal(T value) {
  static_assert(std::is_floating_point_v<T> && sizeof(T) <= 8);
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  Bits bits;
  std::memcpy(&bits, &value, sizeof(bits));
  thread_local std::array<std::pair<Bits, std::string>, 16> recent;
  thread_local size_t next = 0;
  for (const auto &[b, text] : recent)
    if (b == bits && !text.empty())
      return text;
  std::string text = detail::format(value);
  recent[next++ % recent.size()] = {bits, text};
  return text;
}

} // namespace mlir::moe

#endif // MOE_SUPPORT_SHORTESTDECIMAL_H
