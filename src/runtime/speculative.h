// Self-speculative decoding (issue 39; docs/speculative.md): the session's own sparse policy
// drafts γ tokens as decode steps, the cache is rolled back, and one dense pass over γ + 1 rows
// (Session::verify) gives Full's distributions p_0..p_γ, against which the drafts are accepted by
// the standard rule: greedy, while argmax(p_{i-1}) == d_i; sampling, d_i with probability
// min(1, p(d_i) / q(d_i)), on rejection a draw from norm(max(0, p - q)), and a bonus token from p_γ
// when all pass (Leviathan et al. 2023; Chen et al. 2023). The tokens are then Full's (greedy: the
// same tokens; sampling: the same distribution). The draws are counter-based on (seed, position,
// purpose), so a seeded run repeats.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lychee {

inline constexpr int kMaxSpeculate = 16;  // the most drafted tokens per cycle

struct SpeculateOptions {
  int gamma = 0;          // drafted tokens per cycle; 0: plain decoding
  // "auto": γ chosen before every cycle from the acceptance seen so far and the measured step
  // times (choose_gamma), plain decoding where speculation loses; gamma is then the first γ tried.
  bool adaptive = false;
  int max_gamma = 8;      // adaptive: the largest γ tried
  bool enabled() const { return gamma > 0 || adaptive; }
  void validate() const;  // Error(kInvalidArgument) naming speculate
};

// "off" or "0", a count 1..kMaxSpeculate, or "auto"; Error(kInvalidArgument) naming `what` (the
// option or field) and the text.
SpeculateOptions parse_speculate(const std::string& text, const std::string& what = "--speculate");

struct SpeculateStats {
  uint64_t cycles = 0;       // verification passes with at least one drafted token
  uint64_t drafted = 0;      // tokens the draft proposed
  uint64_t accepted = 0;     // of those, accepted
  uint64_t plain_steps = 0;  // cycles without drafts (γ = 0: one dense step; auto's fallback)
  double draft_seconds = 0.0, verify_seconds = 0.0, plain_seconds = 0.0;
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
};

// The cost model (pure): seconds of one draft decode step, of one verification pass (γ + 1 rows;
// memory-bound, so taken as independent of γ), and of one plain Full decode step.
struct StepTimes {
  double draft = 0.0, verify = 0.0, full = 0.0;
};
// Expected tokens a cycle emits when each draft is accepted with probability alpha, independently:
// (1 - alpha^(γ+1)) / (1 - alpha) (γ + 1 at alpha = 1).
double expected_tokens(double alpha, int gamma);
// Tokens per second of speculation over plain Full steps: E(alpha, γ) t_full / (γ t_draft + t_verify).
double speculative_speedup(double alpha, int gamma, const StepTimes& t);
// The γ in [1, max_gamma] of the largest speedup, or 0 (plain decoding) where none exceeds 1.
int choose_gamma(double alpha, const StepTimes& t, int max_gamma);

// A uniform draw in [0, 1) from (seed, position, stream): a hash, no state.
double counter_uniform(uint64_t seed, uint64_t position, uint64_t stream);
// The index whose cumulative mass first exceeds u * sum(probs) (the last positive one at the end).
int32_t draw_from(std::span<const double> probs, double u);

enum DrawStream : uint64_t { kDrawDraft = 1, kDrawAccept = 2, kDrawResidual = 3, kDrawNext = 4 };

// One cycle's verdict: how many drafts stand, and the token after them (the correction on a
// rejection, else the bonus from p_γ).
struct Verdict {
  int accepted = 0;
  int32_t next = 0;
};
// drafts: [γ] d_1..d_γ; draft_logits: [γ, vocab] (row i-1: the draft's logits d_i was drawn from);
// verify_logits: [γ + 1, vocab] (row i: Full's logits after d_i, row 0 after the pending token);
// position: the sequence position of d_1 (draws of d_i use position + i - 1).
Verdict accept_drafts(std::span<const int32_t> drafts, std::span<const float> draft_logits,
                      std::span<const float> verify_logits, const SamplingParams& params, uint64_t position);

// The cycles on one session (generate's decode_speculative and the server's scheduler drive it).
// The session's policy drafts; its cache holds the prompt (and what was generated), its logits
// those of its last token.
class SpeculativeDecoder {
 public:
  SpeculativeDecoder(Session& session, const SamplingParams& sampling, const SpeculateOptions& options);
  // The first token, from the session's current logits (Full's: the prompt was fed densely). It
  // is pending: emitted, not fed.
  int32_t first();
  // One cycle after the pending token: appends to `out` the 1..limit tokens it emits (accepted
  // drafts, then the correction or bonus token, which becomes the pending one). The cache then
  // holds everything before the last token appended. limit >= 1; γ is cut to limit - 1 and to
  // the session's capacity.
  void cycle(int limit, std::vector<int32_t>& out);
  // One cycle of each of `decoders` (on distinct sessions of one backend) at once: the k-th draft
  // steps of all of them as one Session::decode_batch, the verifications as one
  // Session::verify_batch (the GPU: one verification step per row count where the runner takes
  // it), so k speculating sequences read the weights once per step as k decoding ones do.
  // limits[i] and *outs[i] as cycle()'s; each decoder's tokens are those its cycle() alone gives
  // (the draws are counter-based; greedy and sampled alike, where the backend's rows do not depend
  // on the batch, as on the CPU). The step times auto's cost model sees are the batch's: a
  // batched draft step, verification and plain step. On an error every session is back at its
  // length before the cycle and no decoder's state has changed (retry each alone to find the one
  // at fault).
  static void cycle_batch(std::span<SpeculativeDecoder* const> decoders, std::span<const int> limits,
                          std::span<std::vector<int32_t>* const> outs);
  const SpeculateStats& stats() const { return stats_; }

 private:
  int next_gamma();
  int32_t pick(std::span<const float> logits, uint64_t position) const;
  int32_t draft(std::span<const float> logits, uint64_t position) const;
  static void average(double& slot, double seconds) { slot = slot == 0.0 ? seconds : 0.75 * slot + 0.25 * seconds; }

  Session& s_;
  SamplingParams sampling_;
  SpeculateOptions options_;
  SpeculateStats stats_;
  StepTimes times_;
  int32_t pending_ = -1;
  int fallback_left_ = 0;
  std::vector<int32_t> drafts_;
  std::vector<float> q_;
};

}  // namespace lychee
