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
  SpeculativeDecoder* decoders[] = {this};
  const int limits[] = {limit};
  std::vector<int32_t>* outs[] = {&out};
  cycle_batch(decoders, limits, outs);
}

void SpeculativeDecoder::cycle_batch(std::span<SpeculativeDecoder* const> decoders, std::span<const int> limits,
                                     std::span<std::vector<int32_t>* const> outs) {
  const size_t n = decoders.size();
  LY_CHECK(limits.size() == n && outs.size() == n, ErrorCode::kInvalidArgument,
           "SpeculativeDecoder::cycle_batch: {} decoders, {} limits, {} outputs", n, limits.size(), outs.size());
  for (size_t i = 0; i < n; ++i) {
    LY_CHECK(decoders[i] != nullptr && outs[i] != nullptr, ErrorCode::kInvalidArgument,
             "SpeculativeDecoder::cycle_batch: decoder {} or its output is null", i);
    LY_CHECK(decoders[i]->pending_ >= 0, ErrorCode::kInvalidArgument, "SpeculativeDecoder: cycle before first()");
    LY_CHECK(limits[i] >= 1, ErrorCode::kInvalidArgument, "SpeculativeDecoder: a cycle emits at least one token");
  }
  std::vector<int> length(n), gamma(n), fallback(n);
  int max_gamma = 0;
  for (size_t i = 0; i < n; ++i) {
    SpeculativeDecoder& d = *decoders[i];
    length[i] = d.s_.length();
    fallback[i] = d.fallback_left_;  // next_gamma counts it down: restored on an error
    gamma[i] = std::max(0, std::min({d.next_gamma(), limits[i] - 1, d.s_.capacity() - length[i] - 1}));
    max_gamma = std::max(max_gamma, gamma[i]);
    d.drafts_.clear();
    d.q_.clear();
  }
  std::vector<double> draft_seconds(n, 0.0);
  std::vector<Verdict> verdict(n);
  double verify_seconds = 0.0;
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  std::vector<size_t> who;
  try {
    // Draft: the k-th decode step through the policy of every decoder with γ >= k.
    for (int k = 1; k <= max_gamma; ++k) {
      sessions.clear();
      tokens.clear();
      who.clear();
      for (size_t i = 0; i < n; ++i) {
        if (gamma[i] < k) continue;
        SpeculativeDecoder& d = *decoders[i];
        who.push_back(i);
        sessions.push_back(&d.s_);
        tokens.push_back(k == 1 ? d.pending_ : d.drafts_.back());
      }
      Timer t;
      Session::decode_batch(sessions, tokens, [&](size_t j) {
        SpeculativeDecoder& d = *decoders[who[j]];
        const std::span<const float> q = d.s_.logits();
        d.q_.insert(d.q_.end(), q.begin(), q.end());
        d.drafts_.push_back(d.draft(q, uint64_t(length[who[j]] + k)));
      });
      const double seconds = t.seconds();
      for (size_t i : who) draft_seconds[i] += seconds;
    }
    // Roll back the drafts' K/V (computed under the sparse policy) and verify densely: the pending
    // token and the drafts (γ = 0: the pending token alone, one dense step: Full's).
    std::vector<std::vector<int32_t>> rows_of(n);
    std::vector<std::span<const int32_t>> spans(n);
    sessions.clear();
    for (size_t i = 0; i < n; ++i) {
      SpeculativeDecoder& d = *decoders[i];
      if (gamma[i] > 0) d.s_.truncate(length[i]);
      rows_of[i].assign(1, d.pending_);
      rows_of[i].insert(rows_of[i].end(), d.drafts_.begin(), d.drafts_.end());
      spans[i] = rows_of[i];
      sessions.push_back(&d.s_);
    }
    Timer tv;
    Session::verify_batch(sessions, spans, [&](size_t i, std::span<const float> rows) {
      SpeculativeDecoder& d = *decoders[i];
      const uint64_t position = uint64_t(length[i] + 1);
      if (gamma[i] == 0) verdict[i] = {0, d.pick(rows, position)};
      else verdict[i] = accept_drafts(d.drafts_, d.q_, rows, d.sampling_, position);
    });
    verify_seconds = tv.seconds();
    // Keep the pending token and the accepted drafts.
    for (size_t i = 0; i < n; ++i)
      if (gamma[i] > 0) decoders[i]->s_.truncate(length[i] + 1 + verdict[i].accepted);
  } catch (...) {
    for (size_t i = 0; i < n; ++i) {
      SpeculativeDecoder& d = *decoders[i];
      d.fallback_left_ = fallback[i];
      if (d.s_.length() != length[i]) d.s_.truncate(length[i]);
    }
    throw;
  }
  for (size_t i = 0; i < n; ++i) {
    SpeculativeDecoder& d = *decoders[i];
    std::vector<int32_t>& out = *outs[i];
    if (gamma[i] == 0) {
      average(d.times_.full, verify_seconds);
      d.stats_.plain_steps += 1;
      d.stats_.plain_seconds += verify_seconds;
    } else {
      average(d.times_.draft, draft_seconds[i] / gamma[i]);
      average(d.times_.verify, verify_seconds);
      d.stats_.cycles += 1;
      d.stats_.drafted += uint64_t(gamma[i]);
      d.stats_.accepted += uint64_t(verdict[i].accepted);
      d.stats_.draft_seconds += draft_seconds[i];
      d.stats_.verify_seconds += verify_seconds;
      out.insert(out.end(), d.drafts_.begin(), d.drafts_.begin() + verdict[i].accepted);
    }
    out.push_back(d.pending_ = verdict[i].next);
  }
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
  r.first_token_seconds = timer.seconds();
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
