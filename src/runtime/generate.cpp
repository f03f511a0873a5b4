#include "runtime/generate.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"

namespace lychee {

void check_prompt_fits(int64_t n_prompt, int64_t context) {
  LY_CHECK(n_prompt <= context, ErrorCode::kInvalidArgument,
           "the prompt has {} tokens, more than the context of {} tokens", n_prompt, context);
}

void prefill(Session& session, std::span<const int32_t> prompt, int chunk) {
  LY_CHECK(!prompt.empty(), ErrorCode::kInvalidArgument, "the prompt is empty");
  LY_CHECK(chunk > 0, ErrorCode::kInvalidArgument, "prefill chunk must be positive");
  for (size_t i = 0; i < prompt.size(); i += size_t(chunk)) {
    const size_t n = std::min(prompt.size() - i, size_t(chunk));
    session.feed(prompt.subspan(i, n));
  }
}

GenerateResult generate(Session& session, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TokenCallback& on_token) {
  LY_CHECK(options.max_new_tokens >= 0, ErrorCode::kInvalidArgument,
           "max_new_tokens must be >= 0, got {}", options.max_new_tokens);
  const int needed = session.length() + int(prompt.size()) + std::max(options.max_new_tokens - 1, 0);
  LY_CHECK(needed <= session.capacity(), ErrorCode::kCapacity,
           "prompt of {} tokens plus {} new tokens needs {} cache slots; the session holds {}",
           prompt.size(), options.max_new_tokens, needed, session.capacity());
  Timer timer;
  prefill(session, prompt, options.prefill_chunk);
  const double prefill_seconds = timer.seconds();
  GenerateResult result = decode_from(session, options, on_token);
  result.n_prompt = int(prompt.size());
  result.prefill_seconds = prefill_seconds + result.first_token_seconds;
  result.decode_seconds -= result.first_token_seconds;
  result.first_token_seconds = result.prefill_seconds;
  return result;
}

GenerateResult decode_from(Session& session, const GenerateOptions& options, const TokenCallback& on_token) {
  LY_CHECK(options.correct_every >= 0, ErrorCode::kInvalidArgument,
           "correct_every must be >= 0, got {}", options.correct_every);
  const int needed = session.length() + std::max(options.max_new_tokens - 1, 0);
  LY_CHECK(needed <= session.capacity(), ErrorCode::kCapacity,
           "{} cached plus {} new tokens need {} cache slots; the session holds {}", session.length(),
           options.max_new_tokens, needed, session.capacity());
  if (options.speculate.enabled()) return decode_speculative(session, options, on_token);
  GenerateResult result;
  result.finish_reason = "length";
  Sampler sampler(options.sampling);
  std::vector<int32_t> since_correction;  // tokens fed by decode steps since the last correction
  // A session that runs ahead (the GPU) computes step i+1 while the host looks at token i; a
  // stop then drops the step already queued. Cache correction keeps the step-by-step loop.
  const bool ahead = session.runs_ahead() && options.correct_every == 0;
  Timer timer;
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const bool more = i + 1 < options.max_new_tokens;
    const int32_t token = ahead ? session.sample_and_feed(sampler, more) : session.sample(sampler);
    if (i == 0) result.first_token_seconds = timer.seconds();
    const bool fed = ahead && more;
    result.tokens.push_back(token);
    const bool stop = std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
                      options.stop_ids.end();
    const bool go_on = !on_token || on_token(token);
    if (!go_on || stop) {
      if (fed) session.truncate(session.length() - 1);
      if (go_on) result.finish_reason = "stop";
      break;
    }
    if (!more) break;
    if (!fed) session.feed(std::span<const int32_t>(&token, 1));
    since_correction.push_back(token);
    if (options.correct_every > 0 && int(since_correction.size()) == options.correct_every) {
      session.truncate(session.length() - options.correct_every);
      session.feed(since_correction, /*allow_policy=*/false);
      since_correction.clear();
    }
  }
  result.decode_seconds = timer.seconds();
  return result;
}

}  // namespace lychee
