// Speculative sampling's distribution (runtime/speculative.h): seeded draws against Full's exactly
// computed distribution, Pearson's chi-square at tests/chi_square.h's level. First the rule alone
// on a 6-token vocabulary (and two wrong rules, which the same test must reject: that is what
// shows it can fail), then whole generations of the tiny model: three tokens, the first from the
// prompt's logits and the next two through a draft/verify cycle, their joint distribution
// against Full's p(t1) p(t2 | t1) p(t3 | t1, t2) enumerated on the model.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "attention/head_roles.h"
#include "attention/policies.h"
#include "chi_square.h"
#include "cpu/model.h"
#include "runtime/generate.h"
#include "runtime/policy_settings.h"
#include "runtime/session.h"
#include "runtime/speculative.h"
#include "test_util.h"

namespace lychee {
namespace {

constexpr int kDraws = 20000;

const std::vector<float> kP = {1.2f, -0.4f, 0.8f, 0.1f, -1.0f, 0.5f};  // the verifier's logits
const std::vector<float> kQ = {0.2f, 0.9f, 0.8f, -0.6f, 0.3f, 0.4f};   // the draft's

enum class Rule { kCorrect, kAlwaysAccept, kResampleFromP };

// The first token a one-draft cycle emits: the draft if it stands, else the correction. The wrong
// rules are written here, not in the library: kAlwaysAccept gives q, kResampleFromP (a rejection
// drawn from p instead of norm(max(0, p - q))) gives p's mass twice where q undershoots it.
int32_t first_token(uint64_t seed, Rule rule) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  std::vector<double> p, q;
  sampling_distribution(kP, sp, p);
  sampling_distribution(kQ, sp, q);
  const int32_t d = draw_from(q, counter_uniform(seed, 0, kDrawDraft));
  if (rule == Rule::kAlwaysAccept) return d;
  if (rule == Rule::kResampleFromP) {
    if (counter_uniform(seed, 0, kDrawAccept) * q[size_t(d)] < p[size_t(d)]) return d;
    return draw_from(p, counter_uniform(seed, 0, kDrawResidual));
  }
  std::vector<float> rows = kP;
  rows.insert(rows.end(), kP.begin(), kP.end());  // row 1 (after the draft) is not reached here
  const Verdict v = accept_drafts(std::vector<int32_t>{d}, kQ, rows, sp, 0);
  return v.accepted == 1 ? d : v.next;
}

std::string draws_mismatch(Rule rule, std::string& summary) {
  std::vector<int32_t> draws;
  for (int i = 0; i < kDraws; ++i) draws.push_back(first_token(uint64_t(i) + 1, rule));
  SamplingParams sp;
  sp.temperature = 1.0f;
  std::vector<double> p;
  sampling_distribution(kP, sp, p);
  return test::mismatch(draws, p, summary);
}

TEST(SpeculativeSampling, TheRuleDrawsTheVerifiersDistribution) {
  std::string summary;
  const std::string why = draws_mismatch(Rule::kCorrect, summary);
  EXPECT_EQ(why, "");
  std::printf("correct rule: %s\n", summary.c_str());
}

TEST(SpeculativeSampling, TheTestRejectsWrongRules) {
  for (const Rule rule : {Rule::kAlwaysAccept, Rule::kResampleFromP}) {
    std::string summary;
    EXPECT_NE(draws_mismatch(rule, summary), "") << "a wrong rule passed: " << summary;
    std::printf("wrong rule %d: %s\n", int(rule), summary.c_str());
  }
}

struct TinyF32 {
  Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/llama_tied_f32");
  cpu::Model model{ck.config(), HostWeights::load(ck, WeightFormat::kF32)};
};

SamplingParams sampling(uint64_t seed) {
  SamplingParams s;
  s.temperature = 1.5f;
  s.top_k = 3;  // 27 joint outcomes, each expected often enough for Pearson's approximation
  s.seed = seed;
  return s;
}

// Full's distribution of the next token after `prefix`, computed on a fresh session.
std::vector<double> full_next(cpu::Model& model, std::span<const int32_t> prefix) {
  CpuSession s(model, 128);
  s.feed(prefix);
  std::vector<double> p;
  sampling_distribution(s.logits(), sampling(0), p);
  return p;
}

TEST(SpeculativeSampling, GenerationsDrawFullsJointDistribution) {
  TinyF32 t;
  const ModelConfig& c = t.ck.config();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(int32_t((i * 53 + 7) % c.vocab_size));
  // The exact joint distribution of three tokens under Full, by enumeration.
  std::map<std::tuple<int, int, int>, int> category;
  std::vector<double> expected;
  std::vector<int32_t> seq = prompt;
  const std::vector<double> p1 = full_next(t.model, seq);
  for (int a = 0; a < c.vocab_size; ++a) {
    if (p1[size_t(a)] == 0.0) continue;
    seq.push_back(a);
    const std::vector<double> p2 = full_next(t.model, seq);
    for (int b = 0; b < c.vocab_size; ++b) {
      if (p2[size_t(b)] == 0.0) continue;
      seq.push_back(b);
      const std::vector<double> p3 = full_next(t.model, seq);
      for (int d = 0; d < c.vocab_size; ++d)
        if (p3[size_t(d)] > 0.0) {
          category[{a, b, d}] = int(expected.size());
          expected.push_back(p1[size_t(a)] * p2[size_t(b)] * p3[size_t(d)]);
        }
      seq.pop_back();
    }
    seq.pop_back();
  }
  expected.push_back(0.0);  // anything Full cannot produce
  // Speculative generations under a sparse draft that reads 16 of ~42 tokens in layer 1.
  PolicySettings ps;
  ps.policy = "lychee";
  ps.budget = 16;
  ps.block_size = 1;
  ps.sink = 2;
  ps.recent = 2;
  PolicyOptions po = ps.options(c);
  po.roles = head_roles_from_layers(c, {0});  // layer 1 sparse (the stand-in would make it retrieval)
  const auto draft = make_policy(po, c);
  CpuSession s(t.model, 128);
  s.set_policy(draft.get());
  s.feed(prompt);
  std::vector<int32_t> draws;
  SpeculateStats total;
  for (int i = 0; i < kDraws; ++i) {
    s.truncate(int(prompt.size()) - 1);
    s.feed(std::span<const int32_t>(&prompt.back(), 1), /*allow_policy=*/false);
    GenerateOptions o;
    o.max_new_tokens = 3;
    o.sampling = sampling(uint64_t(i) + 1);
    o.speculate.gamma = 2;
    const GenerateResult r = decode_from(s, o);
    ASSERT_EQ(r.tokens.size(), 3u);
    const auto it = category.find({r.tokens[0], r.tokens[1], r.tokens[2]});
    draws.push_back(it == category.end() ? int32_t(expected.size() - 1) : int32_t(it->second));
    total.drafted += r.speculation.drafted;
    total.accepted += r.speculation.accepted;
  }
  // The draft is wrong often enough that the residual draws matter.
  EXPECT_GT(total.accepted, 0u);
  EXPECT_LT(double(total.accepted), 0.95 * double(total.drafted));
  std::string summary;
  EXPECT_EQ(test::mismatch(draws, expected, summary), "");
  std::printf("acceptance %.3f; %s\n", double(total.accepted) / double(total.drafted), summary.c_str());
}

}  // namespace
}  // namespace lychee
