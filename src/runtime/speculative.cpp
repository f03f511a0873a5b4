#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/timer.h"
#include "runtime/generate.h"

namespace lychee {

double expected_tokens(double alpha, int gamma) {
  if (alpha >= 1.0) return double(gamma + 1);
  return (1.0 - std::pow(alpha, gamma + 1)) / (1.0 - alpha);
}

double speculative_speedup(double alpha, int gamma, const StepTimes& t) {
  const double cycle = gamma * t.draft + t.verify;
  return cycle > 0.0 ? expected_tokens(alpha, gamma) * t.full / cycle : 0.0;
}

int choose_gamma(double alpha, const StepTimes& t, int max_gamma) {
  int best = 0;
  double best_speedup = 1.0;
  for (int g = 1; g <= max_gamma; ++g) {
    const double s = speculative_speedup(alpha, g, t);
    if (s > best_speedup) {
      best_speedup = s;
      best = g;
    }
  }
  return best;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double counter_uniform(uint64_t seed, uint64_t position, uint64_t stream) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ position) ^ (stream * 0xd1b54a32d192ed03ull));
  return double(h >> 11) * 0x1.0p-53;
}

int32_t draw_from(std::span<const double> probs, double u) {
  double total = 0.0;
  for (const double p : probs) total += p;
  LY_CHECK(total > 0.0, ErrorCode::kInternal, "a draw from a distribution without mass");
  const double target = u * total;
  double acc = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    acc += probs[i];
    last = int32_t(i);
    if (target < acc) return last;
  }
  return last;
}

Verdict accept_drafts(std::span<const int32_t> drafts, std::span<const float> draft_logits,
                      std::span<const float> verify_logits, const SamplingParams& params, uint64_t position) {
  const size_t g = drafts.size();
  LY_CHECK(!verify_logits.empty() && verify_logits.size() % (g + 1) == 0, ErrorCode::kInvalidArgument,
           "accept_drafts: {} verification logits are not {} rows", verify_logits.size(), g + 1);
  const size_t vocab = verify_logits.size() / (g + 1);
  LY_CHECK(draft_logits.size() == g * vocab, ErrorCode::kInvalidArgument,
           "accept_drafts: {} draft logits for {} drafts of a {}-token vocabulary", draft_logits.size(), g, vocab);
  auto row = [vocab](std::span<const float> rows, size_t i) { return rows.subspan(i * vocab, vocab); };
  if (params.temperature == 0.0f) {  // greedy: the drafts stand while they are Full's argmax
    for (size_t i = 0; i < g; ++i) {
      const int32_t want = argmax(row(verify_logits, i));
      if (want != drafts[i]) return {int(i), want};
    }
    return {int(g), argmax(row(verify_logits, g))};
  }
  std::vector<double> p, q;
  for (size_t i = 0; i < g; ++i) {
    const uint64_t pos = position + i;
    const int32_t d = drafts[i];
    sampling_distribution(row(verify_logits, i), params, p);
    sampling_distribution(row(draft_logits, i), params, q);
    const double pd = p[size_t(d)], qd = q[size_t(d)];
    // Accept with probability min(1, p(d) / q(d)): u q(d) < p(d).
    if (qd > 0.0 && counter_uniform(params.seed, pos, kDrawAccept) * qd < pd) continue;
    // Rejected: the residual norm(max(0, p - q)) is what p keeps beyond the accepted mass.
    double mass = 0.0;
    for (size_t v = 0; v < vocab; ++v) mass += p[v] = std::max(0.0, p[v] - q[v]);
    if (mass <= 0.0) sampling_distribution(row(verify_logits, i), params, p);  // p == q: cannot happen by the rule
    return {int(i), draw_from(p, counter_uniform(params.seed, pos, kDrawResidual))};
  }
  sampling_distribution(row(verify_logits, g), params, p);
  return {int(g), draw_from(p, counter_uniform(params.seed, position + g, kDrawNext))};
}

SpeculativeDecoder::SpeculativeDecoder(Session& session, const SamplingParams& sampling,
                                       const SpeculateOptions& options)
    : s_(session), sampling_(sampling), options_(options) {
  sampling_.validate();
  options_.validate();
  LY_CHECK(s_.length() > 0, ErrorCode::kInvalidArgument, "speculative decoding needs a prefilled prompt");
}

int32_t SpeculativeDecoder::first() { return pending_ = pick(s_.logits(), uint64_t(s_.length())); }

// Fixed γ, or (auto) a plain step first to time Full, one probe at the starting γ, then the cost
// model's choice; where it says plain decoding wins, 32 plain steps before the next probe.
int SpeculativeDecoder::next_gamma() {
  if (!options_.adaptive) return options_.gamma;
  const int probe = std::clamp(options_.gamma, 1, options_.max_gamma);
  if (times_.full == 0.0) return 0;
  if (stats_.cycles == 0) return probe;
  if (fallback_left_ > 0) return --fallback_left_ == 0 ? probe : 0;
  const double alpha = (double(stats_.accepted) + 1.0) / (double(stats_.drafted) + 2.0);
  const int g = choose_gamma(alpha, times_, options_.max_gamma);
  if (g == 0) fallback_left_ = 32;
  return g;
}

int32_t SpeculativeDecoder::pick(std::span<const float> logits, uint64_t position) const {
  if (sampling_.temperature == 0.0f) return argmax(logits);
  std::vector<double> p;
  sampling_distribution(logits, sampling_, p);
  return draw_from(p, counter_uniform(sampling_.seed, position, kDrawNext));
}

int32_t SpeculativeDecoder::draft(std::span<const float> logits, uint64_t position) const {
  if (sampling_.temperature == 0.0f) return argmax(logits);
  std::vector<double> q;
  sampling_distribution(logits, sampling_, q);
  return draw_from(q, counter_uniform(sampling_.seed, position, kDrawDraft));
}

void SpeculativeDecoder::cycle(int limit, std::vector<int32_t>& out) {
  LY_CHECK(pending_ >= 0, ErrorCode::kInvalidArgument, "SpeculativeDecoder: cycle before first()");
  LY_CHECK(limit >= 1, ErrorCode::kInvalidArgument, "SpeculativeDecoder: a cycle emits at least one token");
  const int length = s_.length();
  const int gamma = std::max(0, std::min({next_gamma(), limit - 1, s_.capacity() - length - 1}));
  if (gamma == 0) {  // one dense step: Full's
    Timer t;
    const std::span<const float> row = s_.verify(std::span<const int32_t>(&pending_, 1));
    pending_ = pick(row, uint64_t(length + 1));
    const double seconds = t.seconds();
    average(times_.full, seconds);
    stats_.plain_steps += 1;
    stats_.plain_seconds += seconds;
    out.push_back(pending_);
    return;
  }
  // Draft: γ decode steps through the session's policy.
  drafts_.clear();
  q_.clear();
  Timer td;
  int32_t tok = pending_;
  for (int i = 1; i <= gamma; ++i) {
    s_.feed(std::span<const int32_t>(&tok, 1));
    const std::span<const float> q = s_.logits();
    q_.insert(q_.end(), q.begin(), q.end());
    drafts_.push_back(tok = draft(q, uint64_t(length + i)));
  }
  const double draft_seconds = td.seconds();
  // Roll back the drafts' K/V (computed under the sparse policy) and verify densely.
  s_.truncate(length);
  tokens_.assign(1, pending_);
  tokens_.insert(tokens_.end(), drafts_.begin(), drafts_.end());
  Timer tv;
  const Verdict v = accept_drafts(drafts_, q_, s_.verify(tokens_), sampling_, uint64_t(length + 1));
  const double verify_seconds = tv.seconds();
  // Keep the pending token and the accepted drafts; the next token is pending.
  s_.truncate(length + 1 + v.accepted);
  average(times_.draft, draft_seconds / gamma);
  average(times_.verify, verify_seconds);
  stats_.cycles += 1;
  stats_.drafted += uint64_t(gamma);
  stats_.accepted += uint64_t(v.accepted);
  stats_.draft_seconds += draft_seconds;
  stats_.verify_seconds += verify_seconds;
  out.insert(out.end(), drafts_.begin(), drafts_.begin() + v.accepted);
  out.push_back(pending_ = v.next);
}

GenerateResult decode_speculative(Session& session, const GenerateOptions& options, const TokenCallback& on_token) {
  LY_CHECK(options.correct_every == 0, ErrorCode::kInvalidArgument,
           "speculative decoding verifies every token densely; it does not combine with cache correction "
           "(correct_every {})", options.correct_every);
  GenerateResult r;
  r.finish_reason = "length";
  SpeculativeDecoder dec(session, options.sampling, options.speculate);
  // false: generation ends at this token
  auto emit = [&](int32_t token) {
    r.tokens.push_back(token);
    const bool stop = std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end();
    const bool go_on = !on_token || on_token(token);
    if (!go_on || stop) {
      if (go_on) r.finish_reason = "stop";
      return false;
    }
    return int(r.tokens.size()) < options.max_new_tokens;
  };
  Timer timer;
  std::vector<int32_t> out;
  bool more = options.max_new_tokens > 0 && emit(dec.first());
  while (more) {
    out.clear();
    dec.cycle(options.max_new_tokens - int(r.tokens.size()), out);
    for (size_t j = 0; j < out.size() && more; ++j) {
      more = emit(out[j]);
      // Ended early: the cache keeps what precedes out[j] (it holds all but out.back()).
      if (!more && j + 1 < out.size()) session.truncate(session.length() - int(out.size() - 1 - j));
    }
  }
  r.decode_seconds = timer.seconds();
  r.speculation = dec.stats();
  return r;
}

}  // namespace lychee
