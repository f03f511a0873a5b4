// The length search (see length_fit.h).
#include "eval/length_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "model/tokenizer.h"

namespace lychee {

int length_tolerance(int target_tokens) {
  return std::max(16, int(std::floor(0.02 * double(target_tokens))));
}

int count_tokens(const Tokenizer& tokenizer, std::string_view text) {
  return int(tokenizer.encode(text, /*add_bos=*/false, /*parse_special=*/false).size());
}

namespace {

struct Probe {
  int64_t n = 0;
  int tokens = 0;
};

// The next n to try: inside the open bracket (lo, hi) when one is known, by linear
// interpolation between its ends, else by extrapolating the rate seen so far.
int64_t next_guess(const Probe& lo, const Probe* hi, const Probe& origin, const Probe& last,
                   int target, int64_t n_max) {
  double rate = last.n > origin.n && last.tokens > origin.tokens
                    ? double(last.n - origin.n) / double(last.tokens - origin.tokens)
                    : -1.0;
  if (hi != nullptr && hi->tokens > lo.tokens)
    rate = double(hi->n - lo.n) / double(hi->tokens - lo.tokens);
  const Probe& from = hi != nullptr && last.n == hi->n ? *hi : lo;
  int64_t n = rate > 0 ? from.n + int64_t(std::llround(double(target - from.tokens) * rate))
                       : (lo.n + (hi != nullptr ? hi->n : n_max)) / 2;
  const int64_t upper = hi != nullptr ? hi->n - 1 : n_max;
  n = std::clamp(n, lo.n + 1, std::max(lo.n + 1, upper));
  return n;
}

}  // namespace

FittedText fit_to_length(const Tokenizer& tokenizer, int target_tokens, int64_t n_min,
                         int64_t n_max, double n_per_token,
                         const std::function<std::string(int64_t)>& build, std::string_view what) {
  const int tolerance = length_tolerance(target_tokens);
  // Encodes are cheap next to a prefill, so the search goes on past the tolerance towards the
  // target itself; it stops here or when the bracket closes.
  const int close_enough = std::max(2, target_tokens / 1000);
  FittedText best;
  auto measure = [&](int64_t n) {
    std::string text = build(n);
    const int tokens = count_tokens(tokenizer, text);
    if (best.text.empty() ||
        std::abs(tokens - target_tokens) < std::abs(best.tokens - target_tokens))
      best = FittedText{std::move(text), n, tokens};
    return Probe{n, tokens};
  };
  const Probe origin = measure(n_min);
  LY_CHECK(origin.tokens <= target_tokens + tolerance, ErrorCode::kInvalidArgument,
           "{}: length {} tokens is too short, the prompt needs at least {} tokens", what,
           target_tokens, origin.tokens);
  Probe lo = origin, hi{}, last = origin;
  bool have_hi = false;
  if (n_max > n_min) {
    int64_t n = std::clamp<int64_t>(
        n_min + std::llround(double(target_tokens - origin.tokens) * n_per_token), n_min + 1,
        n_max);
    for (int step = 0; step < 64 && std::abs(best.tokens - target_tokens) > close_enough;
         ++step) {
      last = measure(n);
      if (last.tokens < target_tokens)
        lo = last;
      else
        hi = last, have_hi = true;
      if (have_hi && hi.n - lo.n <= 1) break;
      if (!have_hi && lo.n >= n_max) break;
      // Every fourth step bisects, so an uneven build cannot stall the interpolation.
      n = have_hi && step % 4 == 3
              ? (lo.n + hi.n) / 2
              : next_guess(lo, have_hi ? &hi : nullptr, origin, last, target_tokens, n_max);
    }
  }
  LY_CHECK(have_hi || std::abs(best.tokens - target_tokens) <= tolerance,
           ErrorCode::kInvalidArgument, "{}: length {} tokens is too long, at most {} tokens fit",
           what, target_tokens, best.tokens);
  LY_CHECK(std::abs(best.tokens - target_tokens) <= tolerance, ErrorCode::kInternal,
           "{}: no prompt within {} tokens of the target {}: closest has {} tokens", what,
           tolerance, target_tokens, best.tokens);
  return best;
}

}  // namespace lychee
