// Perplexity and the KL divergence of one configuration's next-token distributions from
// another's on the same text (`lychee perplexity`; llama.cpp's llama-perplexity --kl-divergence
// reports the same figures). Used to measure what FP8 weights, quantised CPU weights or a sparse
// attention policy cost against a reference.
//
// The text is cut into windows of ctx tokens. In each window the first half is prefilled densely
// (context) and the second half is predicted one token at a time: the logits after the prefill
// predict the first token of the second half, then every token is fed as a decode step (through
// the test session's policy, if it has one) and its logits predict the next.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace lychee {

struct PerplexityResult {
  int windows = 0;
  int64_t scored = 0;       // predicted tokens
  double base_ppl = 0;      // exp(mean NLL) of the reference
  double test_ppl = 0;
  double mean_kl = 0;       // mean over predicted tokens of KL(base || test), nats
  double max_kl = 0;
  double p99_kl = 0;        // 99th percentile
  double top1_agree = 0;    // fraction of positions whose argmax is the same
};

// KL(p || q) of the softmaxes of two logit rows, in nats (double sums).
double kl_of_logits(std::span<const float> p_logits, std::span<const float> q_logits);

// Runs the windows through both sessions (empty ones, capacity >= ctx; the test session carries
// its policy, the base session should be dense). base and test may be sessions of different
// engines (weights) or of one (a policy against full attention: on the GPU one runner, each
// session keeping its logits across the other's steps, Session::keep_logits). Error(kInvalidArgument)
// when the text holds less than one window.
PerplexityResult compare_perplexity(Session& base, Session& test, std::span<const int32_t> tokens, int ctx,
                                    int max_windows, const std::function<void(const std::string&)>& progress = {});

}  // namespace lychee
