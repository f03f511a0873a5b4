// The generation loop: prefill a prompt, then sample and feed tokens until a stop token or a
// length limit. Backend-agnostic (drives a Session).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/speculative.h"

namespace lychee {

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after producing one of these
  int prefill_chunk = 2048;       // prompt tokens per forward call
  // Cache correction: after every N decode steps, re-prefill the N tokens fed in them densely,
  // replacing the K/V that sparse attention produced (0 = off). The next token is then sampled
  // from the corrected (dense) logits.
  int correct_every = 0;
  // Self-speculative decoding (runtime/speculative.h): the session's policy drafts, Full verifies.
  // Off by default; does not combine with correct_every.
  SpeculateOptions speculate;
};

struct GenerateResult {
  std::vector<int32_t> tokens;    // generated tokens (the stop token included if hit)
  int n_prompt = 0;
  // generate(): the prompt's prefill until its first token is drawn (so on a device that runs
  // ahead, the GPU, the prefill work still queued when feed returns counts here); decode_seconds
  // then times the tokens after the first, and first_token_seconds equals prefill_seconds.
  // decode_from() alone: first_token_seconds is the time to its first token, inside decode_seconds.
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  double first_token_seconds = 0.0;
  std::string finish_reason;      // "stop" or "length"
  SpeculateStats speculation;     // drafted / accepted (speculative decoding only)
};

// on_token is called after each generated token; returning false stops generation.
using TokenCallback = std::function<bool(int32_t token)>;

GenerateResult generate(Session& session, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TokenCallback& on_token = {});

// The decode half of generate: samples from the session's current logits (those of its last
// token) and continues. Lets callers prefill once and decode several times from a truncated
// session.
GenerateResult decode_from(Session& session, const GenerateOptions& options,
                           const TokenCallback& on_token = {});

// decode_from with options.speculate on (decode_from calls it then): the same tokens as Full
// decoding under greedy sampling, the same distribution otherwise. The session's policy drafts;
// the session must be able to verify (Session::verify). On return the cache holds what Full
// decoding's would (the prompt and every generated token but the last).
GenerateResult decode_speculative(Session& session, const GenerateOptions& options,
                                  const TokenCallback& on_token = {});

// Error(kInvalidArgument) when a prompt of n_prompt tokens is longer than a context of `context`
// tokens, naming both: checked before any prefill (by the CLI and the server), since a prompt that
// cannot fit would otherwise be prefilled for nothing.
void check_prompt_fits(int64_t n_prompt, int64_t context);

// Feeds a prompt in chunks (the session's logits are then those of its last token).
void prefill(Session& session, std::span<const int32_t> prompt, int chunk);

}  // namespace lychee
