// Attention policies on the reference path: equalities with full attention, hand-computed
// selections, propagation order across layers, each baseline's layer rules, cost accounting and
// cache correction.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "attention/policies.h"
#include "core/error.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "test_util.h"

namespace lychee {
namespace {

// ---------------------------------------------------------------- selection, by hand

TEST(Selection, TopKKeepsForcedUnitsInsideTheBudget) {
  const std::vector<float> s = {5, 1, 9, 3, 7, 2, 8, 0};
  SelectParams p;
  p.budget = 4;
  // The last unit (7) is forced; then the 3 best of the rest: 2 (9), 6 (8), 4 (7).
  EXPECT_EQ(select_units(s, 1, 8, p, 1.0f), (std::vector<int32_t>{2, 4, 6, 7}));
  p.sink = 1;
  p.recent = 2;  // forced: 0, 6, 7; one more: 2
  EXPECT_EQ(select_units(s, 1, 8, p, 1.0f), (std::vector<int32_t>{0, 2, 6, 7}));
  p.budget = 2;  // forced units are kept even past the budget
  EXPECT_EQ(select_units(s, 1, 8, p, 1.0f), (std::vector<int32_t>{0, 6, 7}));
}

TEST(Selection, TiesGoToTheLowerIndex) {
  const std::vector<float> s = {1, 4, 4, 4, 0};
  SelectParams p;
  p.budget = 3;
  EXPECT_EQ(select_units(s, 1, 5, p, 1.0f), (std::vector<int32_t>{1, 2, 4}));
}

TEST(Selection, BlocksCountInUnitsAndTheLastBlockIsPartial) {
  // 10 tokens in blocks of 4: units 0 [0,4), 1 [4,8), 2 [8,10). Budget 8 tokens = 2 blocks.
  const std::vector<float> s = {3, 9, 1};
  SelectParams p;
  p.budget = 8;
  const auto units = select_units(s, 4, 10, p, 1.0f);
  EXPECT_EQ(units, (std::vector<int32_t>{1, 2}));
  std::vector<int32_t> tokens;
  units_to_tokens(units, 4, 10, tokens);
  EXPECT_EQ(tokens, (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));
}

TEST(Selection, TopPTakesTheSmallestPrefixReachingP) {
  // Probabilities with scale 1: softmax(log([0.5, 0.3, 0.15, 0.05])) = those values.
  const std::vector<float> s = {std::log(0.05f), std::log(0.5f), std::log(0.3f), std::log(0.15f)};
  SelectParams p;
  p.strategy = SelectStrategy::kTopP;
  p.value = 0.75;  // 0.5 + 0.3 >= 0.75 -> units 1, 2; the last unit (3) is forced
  EXPECT_EQ(select_units(s, 1, 4, p, 1.0f), (std::vector<int32_t>{1, 2, 3}));
  p.value = 0.4;
  EXPECT_EQ(select_units(s, 1, 4, p, 1.0f), (std::vector<int32_t>{1, 3}));
}

TEST(Selection, ThresholdKeepsProbabilitiesAboveIt) {
  const std::vector<float> s = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SelectParams p;
  p.strategy = SelectStrategy::kThreshold;
  p.value = 0.2;
  EXPECT_EQ(select_units(s, 1, 4, p, 1.0f), (std::vector<int32_t>{0, 1, 3}));
}

TEST(Selection, RatioBudgetGrowsWithTheSequence) {
  SelectParams p;
  p.strategy = SelectStrategy::kRatio;
  p.value = 0.25;
  EXPECT_EQ(topk_units(p, 1, 100), 25);
  EXPECT_EQ(topk_units(p, 1, 400), 100);
  EXPECT_EQ(topk_units(p, 16, 400), 6);
  const std::vector<float> s(40, 1.0f);
  EXPECT_EQ(select_units(s, 1, 40, p, 1.0f).size(), 10u);
}

TEST(Selection, BadParametersAreNamed) {
  SelectParams p;
  p.strategy = SelectStrategy::kTopP;
  p.value = 1.5;
  try {
    p.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top-p value must be in (0, 1]"), std::string::npos);
  }
  EXPECT_THROW(parse_select_strategy("topq"), Error);
  EXPECT_THROW(parse_policy_kind("sparse"), Error);
}

// ---------------------------------------------------------------- policies on synthetic caches

// A synthetic layer: random K for n tokens, random q, a model shape with 3 KV heads x 2.
struct Synthetic {
  ModelConfig c;
  std::vector<float> k, v, q;
  LayerKvView view;
  explicit Synthetic(int n, int n_layers = 4, uint32_t seed = 1) {
    c.n_layers = n_layers; c.d_model = 48; c.n_heads = 6; c.n_kv_heads = 3; c.head_dim = 8;
    c.d_ff = 16; c.vocab_size = 10; c.max_context = 4096;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(size_t(c.n_kv_heads) * n * c.head_dim);
    v.resize(k.size());
    q.resize(size_t(c.n_heads) * c.head_dim);
    for (auto* vec : {&k, &v, &q})
      for (float& x : *vec) x = nd(rng);
    view = {k.data(), v.data(), n, c.n_kv_heads, c.head_dim, n};
  }
  HeadRoles roles(std::initializer_list<std::initializer_list<int>> rows) const {
    HeadRoles r = make_head_roles(c);
    size_t i = 0;
    for (auto row : rows)
      for (int x : row) r.retrieval[i++] = uint8_t(x);
    return r;
  }
};

std::vector<HeadRead> plan(AttentionPolicy& p, int layer, const Synthetic& s) {
  std::vector<HeadRead> reads(size_t(s.c.n_heads));
  p.plan_layer(layer, s.q.data(), s.view, reads);
  return reads;
}

// Token-mode top-k computed directly from the definition: mean query of the group, raw logits.
std::vector<int32_t> reference_topk(const Synthetic& s, int kv_head, int budget) {
  const int n = s.view.length, d = s.c.head_dim, g = s.c.group_size();
  std::vector<std::pair<double, int>> scored;
  for (int t = 0; t < n - 1; ++t) {
    double dot = 0;
    for (int i = 0; i < d; ++i) {
      double qbar = 0;
      for (int j = 0; j < g; ++j) qbar += s.q[size_t((kv_head * g + j) * d + i)];
      dot += qbar / g * s.k[(size_t(kv_head) * n + t) * d + i];
    }
    scored.push_back({-dot, t});
  }
  std::sort(scored.begin(), scored.end());
  std::vector<int32_t> out = {n - 1};
  for (int i = 0; i < budget - 1; ++i) out.push_back(scored[size_t(i)].second);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(LycheePolicy, TokenModeSelectsTheGroupMeanTopK) {
  Synthetic s(50);
  SelectParams p;
  p.budget = 7;
  SpecPolicy lychee(lychee_spec(s.c, s.roles({{1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}), 1, p));
  lychee.begin_step(50);
  plan(lychee, 0, s);
  const auto reads = plan(lychee, 1, s);
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(lychee.selection(h), reference_topk(s, h, 7)) << "KV head " << h;
    for (int j = 0; j < 2; ++j) {  // both query heads of the group read that set
      EXPECT_FALSE(reads[size_t(2 * h + j)].dense);
      EXPECT_EQ(reads[size_t(2 * h + j)].tokens, reference_topk(s, h, 7));
    }
  }
}

// Layer 0 writes all sets; layer 1 has head 0 retrieval (writes index 0), head 1 sparse; layer 2
// has every head sparse. Layer 2's head 0 must read layer 1's set, head 1 layer 0's set; a
// sparse head in layer 1 reads what stood before layer 1's retrieval heads wrote.
TEST(LycheePolicy, SetsPropagateFromTheMostRecentRetrievalHeadOfTheSameIndex) {
  Synthetic s0(64, 3, 1), s1(64, 3, 2), s2(64, 3, 3);
  // Same cache, different queries per layer.
  s1.k = s2.k = s0.k;
  s1.view.k = s1.k.data();
  s2.view.k = s2.k.data();
  SelectParams p;
  p.budget = 5;
  SpecPolicy lychee(lychee_spec(s0.c, s0.roles({{1, 1, 1}, {1, 0, 0}, {0, 0, 0}}), 1, p));
  lychee.begin_step(64);
  plan(lychee, 0, s0);
  const auto set0_h0 = lychee.selection(0), set0_h1 = lychee.selection(1);
  const auto reads1 = plan(lychee, 1, s1);
  EXPECT_TRUE(reads1[0].dense && reads1[1].dense);   // head 0 retrieval
  EXPECT_EQ(reads1[2].tokens, set0_h1);               // head 1 reads layer 0's set
  const auto set1_h0 = lychee.selection(0);
  EXPECT_EQ(set1_h0, reference_topk(s1, 0, 5));
  EXPECT_NE(set1_h0, set0_h0);
  const auto reads2 = plan(lychee, 2, s2);
  EXPECT_EQ(reads2[0].tokens, set1_h0);  // latest writer of index 0: layer 1
  EXPECT_EQ(reads2[2].tokens, set0_h1);  // latest writer of index 1: layer 0
  // Nothing carries over between steps: a new step starts from layer 0 again.
  lychee.begin_step(64);
  EXPECT_TRUE(lychee.selection(0).empty());
}

TEST(LycheePolicy, BlockModeReadsWholeBlocksPlusTheCurrentOne) {
  Synthetic s(100);
  SelectParams p;
  p.budget = 48;  // 3 blocks of 16
  SpecPolicy lychee(lychee_spec(s.c, s.roles({{1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}), 16, p));
  lychee.begin_step(100);
  plan(lychee, 0, s);
  const auto reads = plan(lychee, 1, s);
  const int d = s.c.head_dim, g = s.c.group_size(), n = s.view.length;
  for (int h = 0; h < 3; ++h) {
    const auto& units = lychee.selection(h);
    ASSERT_EQ(units.size(), 3u);
    EXPECT_EQ(units.back(), 6);  // tokens 96..99
    EXPECT_EQ(reads[size_t(2 * h)].tokens.size(), 16u * 2 + 4);
    // Block scores are the max raw logit (the group's mean query, q̄·k) in the block: both
    // chosen blocks besides the forced last one score above every block left out.
    std::vector<double> score(7, -INFINITY);
    for (int t = 0; t < n; ++t) {
      double dot = 0;
      for (int i = 0; i < d; ++i) {
        double qbar = 0;
        for (int j = 0; j < g; ++j) qbar += s.q[size_t((h * g + j) * d + i)];
        dot += qbar / g * s.k[(size_t(h) * n + t) * d + i];
      }
      score[size_t(t / 16)] = std::max(score[size_t(t / 16)], dot);
    }
    int n_compared = 0;
    for (int chosen : {units[0], units[1]})
      for (int other = 0; other < 6; ++other) {
        if (other == units[0] || other == units[1]) continue;
        EXPECT_GT(score[size_t(chosen)], score[size_t(other)]) << "KV head " << h << ": block " << chosen
                                                                << " chosen over block " << other;
        ++n_compared;
      }
    EXPECT_EQ(n_compared, 2 * 4);
  }
}

TEST(TidalPolicy, DenseLayersSelectionLayersAndSparseLayers) {
  Synthetic s(40, 6);
  SpecPolicy tidal(tidal_spec(s.c, 6, {2, 4}, 2));
  tidal.begin_step(40);
  for (int layer : {0, 1})
    for (const auto& r : plan(tidal, layer, s)) EXPECT_TRUE(r.dense) << layer;
  for (const auto& r : plan(tidal, 2, s)) EXPECT_TRUE(r.dense);
  // Per query head: top-(k-1) of q·k plus the current token.
  for (int h = 0; h < 6; ++h) {
    const auto& set = tidal.selection(h);
    ASSERT_EQ(set.size(), 6u);
    EXPECT_EQ(set.back(), 39);
  }
  EXPECT_NE(tidal.selection(0), tidal.selection(1));  // query heads of a group select apart
  const auto sel2 = tidal.selection(3);
  const auto reads3 = plan(tidal, 3, s);
  EXPECT_EQ(reads3[3].tokens, sel2);
  Synthetic other(40, 6, 9);
  other.k = s.k;
  other.view.k = other.k.data();
  plan(tidal, 4, other);  // re-selection with other queries
  EXPECT_NE(tidal.selection(3), sel2);
  EXPECT_EQ(plan(tidal, 5, s)[3].tokens, tidal.selection(3));
}

TEST(QuestPolicy, PageBoundsAreUpperBoundsAndTheLastPageIsRead) {
  Synthetic s(70, 3);
  SpecPolicy quest(quest_spec(s.c, 32, 16, 2));
  for (int layer : {0, 1})
    for (const auto& r : plan(quest, layer, s)) EXPECT_TRUE(r.dense);
  const auto reads = plan(quest, 2, s);
  for (int h = 0; h < 6; ++h) {
    EXPECT_FALSE(reads[size_t(h)].dense);
    EXPECT_EQ(reads[size_t(h)].tokens.back(), 69);
    EXPECT_EQ(reads[size_t(h)].tokens.size(), 16u + 6u);  // one full page + the last (6 tokens)
  }
  // The bound is >= q·k for every key of a page.
  std::vector<float> mn(8, INFINITY), mx(8, -INFINITY);
  for (int t = 16; t < 32; ++t)
    for (int i = 0; i < 8; ++i) {
      mn[size_t(i)] = std::min(mn[size_t(i)], s.k[size_t(t) * 8 + i]);
      mx[size_t(i)] = std::max(mx[size_t(i)], s.k[size_t(t) * 8 + i]);
    }
  const float u = quest_page_bound(s.q.data(), mn.data(), mx.data(), 8);
  for (int t = 16; t < 32; ++t) {
    float dot = 0;
    for (int i = 0; i < 8; ++i) dot += s.q[size_t(i)] * s.k[size_t(t) * 8 + i];
    EXPECT_GE(u + 1e-5f, dot);
  }
  EXPECT_EQ(quest.metadata_bytes(2, 70), 3u * 5 * 2 * 8 * 2);
  EXPECT_EQ(quest.metadata_bytes(1, 70), 0u);
}

TEST(DuoPolicy, StreamingHeadsReadSinkAndRecent) {
  Synthetic s(100, 2);
  SpecPolicy duo(duo_spec(s.c, s.roles({{1, 1, 1}, {1, 0, 1}}), 4, 8));
  const auto reads = plan(duo, 1, s);
  EXPECT_TRUE(reads[0].dense && reads[4].dense);
  std::vector<int32_t> want = {0, 1, 2, 3};
  for (int t = 92; t < 100; ++t) want.push_back(t);
  EXPECT_EQ(reads[2].tokens, want);
  EXPECT_EQ(reads[3].tokens, want);
}

TEST(KvAccounting, UnionOverTheGroup) {
  std::vector<HeadRead> r(2);
  r[0].dense = r[1].dense = false;
  r[0].tokens = {0, 3, 5};
  r[1].tokens = {3, 4, 5, 9};
  EXPECT_EQ(union_size(r, 10), 5);
  r[1].dense = true;
  EXPECT_EQ(union_size(r, 10), 10);
}

// ---------------------------------------------------------------- equalities on a real model

struct TinyModel {
  Checkpoint ck;
  cpu::Model model;
  explicit TinyModel(const std::string& name)
      : ck(Checkpoint::open(test::golden_dir() + "/models/" + name)), model(ck.config(), HostWeights::load(ck)) {}
};

// Logits of each decode step with the fed tokens fixed (teacher forcing), and the read stats.
std::vector<std::vector<float>> decode_logits(cpu::Model& m, AttentionPolicy* policy, int n_prompt,
                                              int n_steps, KvReadStats* stats = nullptr) {
  std::vector<int32_t> tokens(size_t(n_prompt + n_steps));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % size_t(m.config().vocab_size));
  CpuSession s(m, n_prompt + n_steps);
  s.set_policy(policy);
  s.forward(std::span<const int32_t>(tokens).first(size_t(n_prompt)));
  std::vector<std::vector<float>> out;
  for (int i = 0; i < n_steps; ++i) {
    auto l = s.forward(std::span<const int32_t>(&tokens[size_t(n_prompt + i)], 1));
    out.emplace_back(l.begin(), l.end());
  }
  if (stats) *stats = s.stats();
  return out;
}

class PolicyEquality : public ::testing::TestWithParam<std::string> {};

TEST_P(PolicyEquality, EveryPolicyEqualsFullWhenItReadsEverything) {
  TinyModel t(GetParam());
  const ModelConfig& c = t.model.config();
  SpecPolicy full(full_spec(c));
  const auto want = decode_logits(t.model, &full, 40, 6);
  auto check = [&](AttentionPolicy& p, const char* what) {
    const auto got = decode_logits(t.model, &p, 40, 6);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " step " << i;
  };
  HeadRoles all = make_head_roles(c);
  std::fill(all.retrieval.begin(), all.retrieval.end(), 1);
  SelectParams small;
  small.budget = 3;
  SpecPolicy every_head_retrieval(lychee_spec(c, all, 1, small));
  check(every_head_retrieval, "lychee, every head retrieval");
  SelectParams big;
  big.budget = 64;  // >= the 46 tokens of the sequence
  SpecPolicy lychee_tokens(lychee_spec(c, head_roles_from_layers(c, {0}), 1, big));
  check(lychee_tokens, "lychee token mode, budget >= length");
  SpecPolicy lychee_blocks(lychee_spec(c, head_roles_from_layers(c, {0}), 16, big));
  check(lychee_blocks, "lychee block mode, budget >= length");
  SpecPolicy tidal(tidal_spec(c, 64, default_tidal_layers(c.n_layers), 2));
  check(tidal, "tidal, budget >= length");
  SpecPolicy quest(quest_spec(c, 64, 16, 2));
  check(quest, "quest, every page");
  SpecPolicy duo(duo_spec(c, head_roles_from_layers(c, {0}), 8, 40));
  check(duo, "duo, sink + recent >= length");
}

INSTANTIATE_TEST_SUITE_P(Golden, PolicyEquality,
                         ::testing::Values("llama31_untied_bf16_sharded", "qwen3_tied_bf16", "qwen2_untied_f16"),
                         [](const auto& info) { return info.param; });

TEST(PolicyEquality, SparsePoliciesDifferAndReadLess) {
  TinyModel t("llama31_untied_bf16_sharded");
  const ModelConfig& c = t.model.config();
  KvReadStats full_stats, lychee_stats;
  SpecPolicy full(full_spec(c));
  const auto want = decode_logits(t.model, &full, 60, 4, &full_stats);
  SelectParams p;
  p.budget = 8;
  SpecPolicy lychee(lychee_spec(c, head_roles_from_layers(c, {0}), 1, p));
  const auto got = decode_logits(t.model, &lychee, 60, 4, &lychee_stats);
  EXPECT_NE(got[0], want[0]);
  EXPECT_EQ(full_stats.token_reads, full_stats.dense_token_reads);
  EXPECT_EQ(full_stats.decode_steps, 4u);
  // Per step: layer 0 reads everything (every KV head x n), the later layers 8 tokens per KV head.
  uint64_t want_reads = 0;
  const uint64_t kv = uint64_t(c.n_kv_heads), later = uint64_t(c.n_layers - 1);
  for (int step = 0; step < 4; ++step) want_reads += kv * uint64_t(61 + step) + later * kv * 8;
  EXPECT_EQ(lychee_stats.token_reads, want_reads);
  EXPECT_EQ(lychee_stats.dense_token_reads, full_stats.dense_token_reads);
  EXPECT_EQ(lychee_stats.kv_bytes(c.head_dim), want_reads * uint64_t(c.head_dim) * 2 * 2);
}

// Cache correction: after N sparse steps, re-prefilling those N tokens densely leaves exactly
// the K/V that a dense prefill of the same tokens writes.
TEST(CacheCorrection, RestoresTheDenseKvExactly) {
  TinyModel t("llama31_untied_bf16_sharded");
  const ModelConfig& c = t.model.config();
  std::vector<int32_t> prompt(30), fed = {5, 17, 99, 3, 250, 41};
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(i * 13 % 400);
  SelectParams p;
  p.budget = 4;
  SpecPolicy lychee(lychee_spec(c, head_roles_from_layers(c, {0}), 1, p));

  CpuSession sparse(t.model, 64), dense(t.model, 64);
  sparse.set_policy(&lychee);
  sparse.forward(prompt);
  for (int32_t tok : fed) sparse.forward(std::span<const int32_t>(&tok, 1));
  const auto kv_before = sparse.kv();
  sparse.truncate(int(prompt.size()));
  sparse.forward(fed, /*allow_policy=*/false);

  dense.forward(prompt);
  dense.forward(fed);
  ASSERT_EQ(sparse.kv().length(), dense.kv().length());
  bool polluted = false;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const size_t n = size_t(dense.kv().length()) * c.head_dim;
      EXPECT_EQ(std::memcmp(sparse.kv().k(l, h), dense.kv().k(l, h), n * 4), 0) << l << " " << h;
      EXPECT_EQ(std::memcmp(sparse.kv().v(l, h), dense.kv().v(l, h), n * 4), 0) << l << " " << h;
      polluted |= std::memcmp(kv_before.k(l, h), dense.kv().k(l, h), n * 4) != 0;
    }
  EXPECT_TRUE(polluted) << "the sparse steps should have changed some K/V";
  EXPECT_GT(sparse.stats().correction_token_reads, 0u);
}

TEST(CacheCorrection, GenerateCorrectsEveryNSteps) {
  TinyModel t("llama31_untied_bf16_sharded");
  const ModelConfig& c = t.model.config();
  std::vector<int32_t> prompt(30);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(i * 7 % 400);
  SelectParams p;
  p.budget = 4;
  SpecPolicy lychee(lychee_spec(c, head_roles_from_layers(c, {0}), 1, p));
  GenerateOptions o;
  o.max_new_tokens = 9;
  o.correct_every = 4;
  CpuSession s(t.model, 64);
  s.set_policy(&lychee);
  const GenerateResult r = generate(s, prompt, o);
  EXPECT_EQ(r.tokens.size(), 9u);
  EXPECT_EQ(s.length(), 30 + 8);
  EXPECT_EQ(s.stats().decode_steps, 8u);
  // Two corrections, over 34 and 38 cached tokens, each read once per (layer, KV head).
  EXPECT_EQ(s.stats().correction_token_reads, uint64_t(c.n_layers * c.n_kv_heads) * (34 + 38));
}

// generate()'s prefill time runs to the first token (what a device that runs ahead still had
// queued when feed returned counts there, not in decoding); decode_from() alone reports the time
// to its first token inside its decode time.
TEST(Generate, PrefillTimeRunsToTheFirstToken) {
  TinyModel t("llama31_untied_bf16_sharded");
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(i * 11 % 400);
  GenerateOptions o;
  o.max_new_tokens = 6;
  CpuSession s(t.model, 64);
  const GenerateResult r = generate(s, prompt, o);
  ASSERT_EQ(r.tokens.size(), 6u);
  EXPECT_GT(r.prefill_seconds, 0.0);
  EXPECT_GE(r.decode_seconds, 0.0);
  EXPECT_EQ(r.first_token_seconds, r.prefill_seconds);
  CpuSession s2(t.model, 64);
  prefill(s2, prompt, o.prefill_chunk);
  const GenerateResult d = decode_from(s2, o);
  EXPECT_EQ(d.tokens, r.tokens);
  EXPECT_GT(d.first_token_seconds, 0.0);
  EXPECT_LE(d.first_token_seconds, d.decode_seconds);
}

}  // namespace
}  // namespace lychee
