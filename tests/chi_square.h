// Pearson's chi-square for the sampling tests (test_sampling.cpp, test_speculative.cpp): draws
// against the distribution they should follow, with the survival function computed here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace lychee::test {

// Q(a, x) = Γ(a, x) / Γ(a), the regularised upper incomplete gamma function: the power series of
// P = 1 - Q below x = a + 1, the continued fraction of Q (Lentz's method) above, both to 1e-15.
inline double upper_gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_front = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-16; ++n) sum += term *= x / (a + n);
    return std::max(0.0, 1.0 - sum * std::exp(log_front));
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / kTiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1.0) < 1e-16) break;
  }
  return std::exp(log_front) * h;
}

inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// P(X >= x) for X ~ chi-square with df degrees of freedom.
inline double chi_square_sf(double x, int df) { return upper_gamma_q(0.5 * df, 0.5 * x); }

// The level below which a chi-square p-value fails the test.
constexpr double kLevel = 1e-5;

// Why `tokens` (draws) do not look drawn from p: a token drawn that p excludes, or Pearson's
// chi-square over the tokens p keeps with a p-value below kLevel; "" when they do. The statistic
// and its p-value go into `summary` either way.
inline std::string mismatch(std::span<const int32_t> tokens, const std::vector<double>& p, std::string& summary) {
  std::vector<int64_t> count(p.size(), 0);
  for (const int32_t t : tokens) {
    if (t < 0 || size_t(t) >= p.size()) return "token " + std::to_string(t) + " is outside the vocabulary";
    ++count[size_t(t)];
  }
  const double n = double(tokens.size());
  std::ostringstream table;
  for (size_t i = 0; i < p.size(); ++i) table << " " << i << ":" << count[i] << "/" << std::lround(n * p[i]);
  double chi2 = 0.0;
  int kept = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      if (count[i] > 0)
        return "token " + std::to_string(i) + " drawn " + std::to_string(count[i]) +
               " times though cut (counts/expected" + table.str() + ")";
      continue;
    }
    const double e = n * p[i];
    if (e < 5.0) return "expected count " + num(e) + " of token " + std::to_string(i) + " is below 5: draw more";
    chi2 += (double(count[i]) - e) * (double(count[i]) - e) / e;
    ++kept;
  }
  if (kept < 2) {
    summary = "one token kept: every draw is it";
    return "";
  }
  const double pv = chi_square_sf(chi2, kept - 1);
  summary = "chi-square " + num(chi2) + " on " + std::to_string(kept - 1) + " df, p-value " + num(pv) +
            " (counts/expected" + table.str() + ")";
  return pv < kLevel ? "p-value below " + num(kLevel) + ": " + summary : "";
}

}  // namespace lychee::test
