// Fitting a prompt to a token budget: a task builds its text from one integer (words of haystack,
// list items, word counts) and the fit searches that integer until the tokenizer's count of the
// text lands as close to the target as the builder's steps allow, and within the tolerance.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace lychee {

class Tokenizer;

// The accepted distance from a target length: 2% of it, and at least 16 tokens.
int length_tolerance(int target_tokens);

// Tokens of text as it sits in a user turn: no BOS, special-token text kept as plain text.
int count_tokens(const Tokenizer& tokenizer, std::string_view text);

struct FittedText {
  std::string text;
  int64_t n = 0;   // the builder's argument that produced text
  int tokens = 0;  // count_tokens(text)
};

// build(n) must give a text whose token count grows with n (roughly: a step may be uneven). Starts
// at n_min and extrapolates with n_per_token (a first guess of n per token; the search corrects
// it), then narrows a bracket by interpolation and bisection. Each step encodes the whole text,
// so a fit costs a handful of encodes. Error(kInvalidArgument) naming `what` when even n_min is
// too long or n_max too short; Error(kInternal) if no n lands in the tolerance.
FittedText fit_to_length(const Tokenizer& tokenizer, int target_tokens, int64_t n_min,
                         int64_t n_max, double n_per_token,
                         const std::function<std::string(int64_t)>& build, std::string_view what);

}  // namespace lychee
