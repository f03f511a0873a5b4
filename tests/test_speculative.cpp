// Self-speculative decoding (runtime/speculative.h) on the CPU reference, tested by equalities:
// verification rows equal Full decode steps bit for bit; greedy speculation gives Full's tokens on
// the default model over eval prompts; after a rejection the cache equals one built from the
// accepted tokens alone, and the sparse policy's next step equals a fresh one's; speculative
// sampling draws Full's joint distribution (Pearson's chi-square, tests/chi_square.h), and the
// same test rejects the usual wrong rules. The cost model's choice of γ is a pure function.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "attention/head_roles.h"
#include "attention/policies.h"
#include "chi_square.h"
#include "cpu/model.h"
#include "eval/tasks.h"
#include "model/chat_template.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/policy_settings.h"
#include "runtime/session.h"
#include "runtime/speculative.h"
#include "test_util.h"

namespace lychee {
namespace {

std::vector<int32_t> ids_of(int n, int vocab, int salt) {
  std::vector<int32_t> v(size_t(n), 0);
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 37 + salt * 11 + 3) % vocab);
  return v;
}

// A LycheeDecode draft that reads few tokens, so that it disagrees with Full now and then.
std::unique_ptr<AttentionPolicy> sparse_draft(const ModelConfig& c, int budget, int block) {
  PolicySettings s;
  s.policy = "lychee";
  s.budget = budget;
  s.block_size = block;
  s.sink = block;
  s.recent = block;
  PolicyOptions o = s.options(c);
  // The stand-in makes every layer of a model of <= 4 layers retrieval (a draft equal to Full):
  // there only layer 0 is.
  if (c.n_layers <= 4) o.roles = head_roles_from_layers(c, {0});
  return make_policy(o, c);
}

std::unique_ptr<AttentionPolicy> full_policy(const ModelConfig& c) { return make_policy(PolicyOptions{}, c); }

struct TinyF32 {
  Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/llama_tied_f32");
  cpu::Model model{ck.config(), HostWeights::load(ck, WeightFormat::kF32)};
};

// Every cached K/V value of the first `n` positions, bit for bit.
void expect_same_cache(const cpu::KvCache& a, const cpu::KvCache& b, const ModelConfig& c, int n) {
  ASSERT_EQ(a.length(), n);
  ASSERT_EQ(b.length(), n);
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int64_t i = 0; i < int64_t(n) * c.head_dim; ++i) {
        ASSERT_EQ(a.k(l, h)[i], b.k(l, h)[i]) << "K layer " << l << " head " << h << " element " << i;
        ASSERT_EQ(a.v(l, h)[i], b.v(l, h)[i]) << "V layer " << l << " head " << h << " element " << i;
      }
}

// verify()'s rows against Full decode steps of the same tokens: equal bit for bit.
void expect_rows_are_full_steps(cpu::Model& model, std::span<const int32_t> prompt, std::span<const int32_t> rows_of) {
  const ModelConfig& c = model.config();
  const auto full = full_policy(c);
  const int capacity = int(prompt.size() + rows_of.size());
  CpuSession steps(model, capacity), verified(model, capacity);
  steps.set_policy(full.get());
  verified.set_policy(full.get());
  steps.feed(prompt);
  verified.feed(prompt);
  const std::span<const float> rows = verified.verify(rows_of);
  ASSERT_EQ(rows.size(), rows_of.size() * size_t(c.vocab_size));
  for (size_t i = 0; i < rows_of.size(); ++i) {
    const std::span<const float> want = steps.forward(rows_of.subspan(i, 1));
    for (int v = 0; v < c.vocab_size; ++v)
      ASSERT_EQ(rows[i * size_t(c.vocab_size) + size_t(v)], want[size_t(v)]) << "row " << i << " logit " << v;
  }
  expect_same_cache(steps.kv(), verified.kv(), c, steps.length());
}

TEST(SpeculativeCpu, VerifyRowsAreFullDecodeStepsF32) {
  TinyF32 t;
  const int vocab = t.ck.config().vocab_size;
  expect_rows_are_full_steps(t.model, ids_of(29, vocab, 1), ids_of(7, vocab, 2));
}

TEST(SpeculativeCpu, VerifyRowsAreFullDecodeStepsNativeDefaultModel) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model model(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  const int vocab = ck.config().vocab_size;
  // A prompt of >= 128 rows takes the dequantised sgemm; the 9 verified rows the integer products.
  expect_rows_are_full_steps(model, ids_of(300, vocab, 3), ids_of(9, vocab, 4));
}

GenerateOptions greedy(int n, int gamma) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.speculate.gamma = gamma;
  return o;
}

TEST(SpeculativeCpu, GreedyGivesFullsTokensAndRollsBackF32) {
  TinyF32 t;
  const ModelConfig& c = t.ck.config();
  const auto full = full_policy(c);
  const auto draft = sparse_draft(c, 4, 1);
  SpeculateStats total;
  for (int salt = 0; salt < 6; ++salt) {
    const auto prompt = ids_of(40 + salt, c.vocab_size, salt);
    CpuSession a(t.model, 128), b(t.model, 128);
    a.set_policy(full.get());
    b.set_policy(draft.get());
    const GenerateResult want = generate(a, prompt, greedy(24, 0));
    const GenerateResult got = generate(b, prompt, greedy(24, 2 + salt % 3));
    EXPECT_EQ(got.tokens, want.tokens) << "prompt " << salt;
    expect_same_cache(a.kv(), b.kv(), c, a.length());
    total.drafted += got.speculation.drafted;
    total.accepted += got.speculation.accepted;
  }
  // Both paths of the rule ran: drafts accepted and drafts rejected (rolled back).
  EXPECT_GT(total.accepted, 0u);
  EXPECT_LT(total.accepted, total.drafted);
}

// After a rejection the cache holds the accepted tokens' K/V exactly as a Full run computed them,
// and the sparse policy's state is rebuilt: its next decode step equals a fresh session's.
TEST(SpeculativeCpu, RollbackLeavesTheCacheOfTheAcceptedTokens) {
  TinyF32 t;
  const ModelConfig& c = t.ck.config();
  const auto prompt = ids_of(45, c.vocab_size, 9);
  const auto draft = sparse_draft(c, 4, 1), fresh_draft = sparse_draft(c, 4, 1), full = full_policy(c);
  CpuSession spec(t.model, 128), fresh(t.model, 128);
  spec.set_policy(draft.get());
  const GenerateResult r = generate(spec, prompt, greedy(20, 4));
  ASSERT_LT(r.speculation.accepted, r.speculation.drafted) << "no rejection: the test needs one";
  fresh.set_policy(full.get());
  fresh.feed(prompt);
  for (size_t i = 0; i + 1 < r.tokens.size(); ++i) fresh.feed(std::span<const int32_t>(&r.tokens[i], 1));
  expect_same_cache(spec.kv(), fresh.kv(), c, int(prompt.size() + r.tokens.size() - 1));
  fresh.set_policy(fresh_draft.get());
  const std::span<const float> fresh_logits = fresh.forward(std::span<const int32_t>(&r.tokens.back(), 1));
  const std::vector<float> want(fresh_logits.begin(), fresh_logits.end());
  const std::span<const float> got = spec.forward(std::span<const int32_t>(&r.tokens.back(), 1));
  EXPECT_EQ(std::vector<float>(got.begin(), got.end()), want);
}

// The eval's prompts (chat-templated tasks, as run_eval builds them) on the default model with its
// default native weights: speculative greedy with a LycheeDecode draft gives Full's tokens.
TEST(SpeculativeCpu, GreedyGivesFullsTokensOnTheDefaultModelOverEvalPrompts) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  const Tokenizer tok = load_tokenizer(ck);
  cpu::Model model(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  const ModelConfig& c = ck.config();
  const TaskGenerator gen(tok, Haystack::synthetic());
  const ChatTemplate chat = ChatTemplate::of(tok);
  const auto full = full_policy(c);
  const auto draft = sparse_draft(c, 96, 16);
  SpeculateStats total;
  for (const TaskKind kind : {TaskKind::kPasskey, TaskKind::kNiahSingle, TaskKind::kVariableTracking,
                              TaskKind::kCommonWords}) {
    const EvalSample s = gen.make({kind, 900, 0.5, 7});
    const auto ids = tok.encode(chat.render({{"user", s.user_message}}).text + s.answer_prefix, false, true);
    GenerateOptions o = greedy(s.max_new_tokens, 0);
    o.stop_ids = tok.stop_ids();
    CpuSession a(model, int(ids.size()) + o.max_new_tokens), b(model, int(ids.size()) + o.max_new_tokens);
    a.set_policy(full.get());
    b.set_policy(draft.get());
    const GenerateResult want = generate(a, ids, o);
    o.speculate.gamma = 4;
    const GenerateResult got = generate(b, ids, o);
    EXPECT_EQ(got.tokens, want.tokens) << s.task;
    EXPECT_EQ(got.finish_reason, want.finish_reason) << s.task;
    total.drafted += got.speculation.drafted;
    total.accepted += got.speculation.accepted;
  }
  std::printf("default model, lychee budget 96 draft, γ 4: %llu of %llu drafts accepted\n",
              (unsigned long long)total.accepted, (unsigned long long)total.drafted);
  EXPECT_GT(total.accepted, 0u);
  EXPECT_LT(total.accepted, total.drafted);  // rejections happened, so the rollback path ran
}

TEST(SpeculativeCpu, StopTokenAndLimitEndWhereFullEnds) {
  TinyF32 t;
  const ModelConfig& c = t.ck.config();
  const auto prompt = ids_of(41, c.vocab_size, 5);
  const auto full = full_policy(c), draft = sparse_draft(c, 4, 1);
  CpuSession a(t.model, 128);
  a.set_policy(full.get());
  const GenerateResult plain = generate(a, prompt, greedy(16, 0));
  // The 7th token as a stop token: both stop there, with the same cache.
  GenerateOptions o = greedy(16, 0);
  o.stop_ids = {plain.tokens[6]};
  CpuSession b(t.model, 128), d(t.model, 128);
  b.set_policy(full.get());
  d.set_policy(draft.get());
  const GenerateResult want = generate(b, prompt, o);
  o.speculate.gamma = 5;
  const GenerateResult got = generate(d, prompt, o);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.finish_reason, "stop");
  expect_same_cache(b.kv(), d.kv(), c, b.length());
  // A callback that ends generation after 3 tokens.
  CpuSession e(t.model, 128);
  e.set_policy(draft.get());
  int seen = 0;
  const GenerateResult cut = generate(e, prompt, greedy(16, 6), [&](int32_t) { return ++seen < 3; });
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + 3));
  EXPECT_EQ(e.length(), int(prompt.size()) + 2);
}

// A CPU session whose verify fails on demand (a fault in the middle of a batched cycle).
class FaultySession final : public Session {
 public:
  FaultySession(cpu::Model& model, int capacity) : s_(model, capacity) {}
  bool fail_verify = false;
  void feed(std::span<const int32_t> tokens, bool allow_policy = true) override { s_.feed(tokens, allow_policy); }
  std::span<const float> logits() override { return s_.logits(); }
  std::span<const float> verify(std::span<const int32_t> tokens) override {
    LY_CHECK(!fail_verify, ErrorCode::kInternal, "FaultySession: verify fails");
    return s_.verify(tokens);
  }
  int length() const override { return s_.length(); }
  int capacity() const override { return s_.capacity(); }
  void truncate(int n) override { s_.truncate(n); }
  void set_policy(AttentionPolicy* policy) override { s_.set_policy(policy); }
  const KvReadStats& stats() const override { return s_.stats(); }
  void reset_stats() override { s_.reset_stats(); }
  const cpu::KvCache& kv() const { return s_.kv(); }

 private:
  CpuSession s_;
};

// cycle_batch over several sessions (different prompts, γ, limits, greedy and seeded sampling)
// gives each decoder the tokens and cache its cycle() alone gives; greedy ones give Full's tokens.
TEST(SpeculativeCpu, BatchedCyclesGiveWhatEachCycleAloneGives) {
  TinyF32 t;
  const ModelConfig& c = t.ck.config();
  const auto full = full_policy(c);
  struct Case {
    int gamma;
    bool adaptive;
    float temperature;
    int max_tokens;
  };
  const std::vector<Case> cases = {{2, false, 0.0f, 20}, {4, false, 0.0f, 17}, {0, true, 0.0f, 19},
                                   {3, false, 0.9f, 18}, {1, false, 0.0f, 2},  {5, false, 1.0f, 21}};
  const size_t n = cases.size();
  std::vector<std::unique_ptr<AttentionPolicy>> drafts;
  std::vector<std::unique_ptr<CpuSession>> alone_s, batch_s;
  std::vector<std::unique_ptr<SpeculativeDecoder>> alone_d, batch_d;
  std::vector<std::vector<int32_t>> alone_tok(n), batch_tok(n);
  for (size_t i = 0; i < n; ++i) {
    const auto prompt = ids_of(38 + int(i), c.vocab_size, 20 + int(i));
    drafts.push_back(sparse_draft(c, 4, 1));
    SamplingParams sp;
    sp.temperature = cases[i].temperature;
    sp.seed = 100 + i;
    SpeculateOptions so;
    so.gamma = cases[i].gamma;
    so.adaptive = cases[i].adaptive;
    for (auto* v : {&alone_s, &batch_s}) {
      v->push_back(std::make_unique<CpuSession>(t.model, 128));
      v->back()->set_policy(drafts.back().get());
      v->back()->feed(prompt);
    }
    alone_d.push_back(std::make_unique<SpeculativeDecoder>(*alone_s[i], sp, so));
    batch_d.push_back(std::make_unique<SpeculativeDecoder>(*batch_s[i], sp, so));
    alone_tok[i].push_back(alone_d[i]->first());
    batch_tok[i].push_back(batch_d[i]->first());
    while (int(alone_tok[i].size()) < cases[i].max_tokens)
      alone_d[i]->cycle(cases[i].max_tokens - int(alone_tok[i].size()), alone_tok[i]);
  }
  int batched_cycles = 0;
  for (;;) {
    std::vector<SpeculativeDecoder*> decs;
    std::vector<int> limits;
    std::vector<std::vector<int32_t>*> outs;
    for (size_t i = 0; i < n; ++i) {
      if (int(batch_tok[i].size()) >= cases[i].max_tokens) continue;
      decs.push_back(batch_d[i].get());
      limits.push_back(cases[i].max_tokens - int(batch_tok[i].size()));
      outs.push_back(&batch_tok[i]);
    }
    if (decs.empty()) break;
    SpeculativeDecoder::cycle_batch(decs, limits, outs);
    batched_cycles += decs.size() > 1;
  }
  EXPECT_GT(batched_cycles, 3);
  uint64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(batch_tok[i], alone_tok[i]) << "decoder " << i;
    EXPECT_EQ(int(batch_tok[i].size()), cases[i].max_tokens) << "decoder " << i;
    expect_same_cache(batch_s[i]->kv(), alone_s[i]->kv(), c, alone_s[i]->length());
    if (!cases[i].adaptive) {
      EXPECT_EQ(batch_d[i]->stats().drafted, alone_d[i]->stats().drafted) << "decoder " << i;
      EXPECT_EQ(batch_d[i]->stats().accepted, alone_d[i]->stats().accepted) << "decoder " << i;
    }
    drafted += batch_d[i]->stats().drafted;
    accepted += batch_d[i]->stats().accepted;
    if (cases[i].temperature != 0.0f) continue;
    CpuSession f(t.model, 128);
    f.set_policy(full.get());
    const auto prompt = ids_of(38 + int(i), c.vocab_size, 20 + int(i));
    const GenerateResult want = generate(f, prompt, greedy(cases[i].max_tokens, 0));
    EXPECT_EQ(batch_tok[i], want.tokens) << "decoder " << i;
  }
  EXPECT_GT(accepted, 0u);
  EXPECT_LT(accepted, drafted);  // rejections happened among the batch, so the rollbacks ran
}

// A fault in one session's verification leaves every session of the batch at its length before
// the cycle and every decoder as it was: cycling each alone afterwards gives the tokens an
// undisturbed run gives.
TEST(SpeculativeCpu, AFaultInABatchedCycleRollsEverySessionBack) {
  TinyF32 t;
  const ModelConfig& c = t.ck.config();
  const size_t n = 3;
  std::vector<std::unique_ptr<AttentionPolicy>> drafts;
  std::vector<std::unique_ptr<FaultySession>> s, ref;
  std::vector<std::unique_ptr<SpeculativeDecoder>> d, ref_d;
  std::vector<std::vector<int32_t>> tok(n), ref_tok(n);
  SamplingParams sp;
  SpeculateOptions so;
  so.gamma = 3;
  for (size_t i = 0; i < n; ++i) {
    const auto prompt = ids_of(40 + int(i), c.vocab_size, 30 + int(i));
    drafts.push_back(sparse_draft(c, 4, 1));
    for (auto* v : {&s, &ref}) {
      v->push_back(std::make_unique<FaultySession>(t.model, 128));
      v->back()->set_policy(drafts.back().get());
      v->back()->feed(prompt);
    }
    d.push_back(std::make_unique<SpeculativeDecoder>(*s[i], sp, so));
    ref_d.push_back(std::make_unique<SpeculativeDecoder>(*ref[i], sp, so));
    tok[i].push_back(d[i]->first());
    ref_tok[i].push_back(ref_d[i]->first());
    for (int k = 0; k < 2; ++k) ref_d[i]->cycle(100, ref_tok[i]);
  }
  std::vector<SpeculativeDecoder*> decs = {d[0].get(), d[1].get(), d[2].get()};
  const std::vector<int> limits(n, 100);
  std::vector<std::vector<int32_t>*> outs = {&tok[0], &tok[1], &tok[2]};
  std::vector<int> lengths;
  for (const auto& x : s) lengths.push_back(x->length());
  s[1]->fail_verify = true;
  test::expect_error([&] { SpeculativeDecoder::cycle_batch(decs, limits, outs); }, ErrorCode::kInternal,
                     {"verify fails"});
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(s[i]->length(), lengths[i]) << "session " << i;
    EXPECT_EQ(tok[i].size(), 1u) << "session " << i;
    EXPECT_EQ(d[i]->stats().cycles, 0u) << "session " << i;
  }
  s[1]->fail_verify = false;
  for (size_t i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) d[i]->cycle(100, tok[i]);
    EXPECT_EQ(tok[i], ref_tok[i]) << "session " << i;
    expect_same_cache(s[i]->kv(), ref[i]->kv(), c, ref[i]->length());
  }
  // Bad batches are refused before any step.
  test::expect_error([&] { SpeculativeDecoder::cycle_batch(decs, std::vector<int>(2, 1), outs); },
                     ErrorCode::kInvalidArgument, {"3 decoders, 2 limits"});
  std::vector<SpeculativeDecoder*> twice = {d[0].get(), d[0].get()};
  std::vector<std::vector<int32_t>*> two_outs = {&tok[0], &tok[1]};
  test::expect_error([&] { SpeculativeDecoder::cycle_batch(twice, std::vector<int>(2, 5), two_outs); },
                     ErrorCode::kInvalidArgument, {"are the same"});
}

TEST(SpeculativeAccept, GreedyKeepsDraftsWhileTheyAreFullsArgmax) {
  const int vocab = 8;
  std::vector<float> rows(size_t(3 * vocab), 0.0f);
  rows[5] = 1.0f;              // row 0: argmax 5
  rows[vocab + 2] = 1.0f;      // row 1: argmax 2
  rows[2 * vocab + 7] = 1.0f;  // row 2: argmax 7
  const std::vector<float> q(size_t(2 * vocab), 0.0f);
  const SamplingParams g;
  const Verdict one = accept_drafts(std::vector<int32_t>{5, 3}, q, rows, g, 10);
  EXPECT_EQ(one.accepted, 1);
  EXPECT_EQ(one.next, 2);
  const Verdict all = accept_drafts(std::vector<int32_t>{5, 2}, q, rows, g, 10);
  EXPECT_EQ(all.accepted, 2);
  EXPECT_EQ(all.next, 7);
  const Verdict none = accept_drafts(std::vector<int32_t>{4, 2}, q, rows, g, 10);
  EXPECT_EQ(none.accepted, 0);
  EXPECT_EQ(none.next, 5);
  test::expect_error([&] { accept_drafts(std::vector<int32_t>{5}, q, rows, g, 10); }, ErrorCode::kInvalidArgument,
                     {"draft logits"});
}

TEST(SpeculativeCost, ExpectedTokensAndTheChoiceOfGamma) {
  EXPECT_DOUBLE_EQ(expected_tokens(0.5, 3), 1.875);
  EXPECT_DOUBLE_EQ(expected_tokens(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(expected_tokens(0.0, 4), 1.0);
  // KV-bound steps (long context, batch > 1): a sparse draft step costs a third of Full's.
  const StepTimes long_ctx{0.3, 1.1, 1.0};
  const int g = choose_gamma(0.9, long_ctx, 8);
  EXPECT_GT(g, 1);
  EXPECT_GT(speculative_speedup(0.9, g, long_ctx), 1.5);
  EXPECT_EQ(choose_gamma(0.1, long_ctx, 8), 0);  // drafts that are rarely right lose
  // Weight-bound steps (batch 1, short context): the draft step costs what Full's does.
  EXPECT_EQ(choose_gamma(0.9, StepTimes{0.95, 1.05, 1.0}, 8), 0);
}

TEST(SpeculativeCost, ParseSpeculate) {
  EXPECT_EQ(parse_speculate("4").gamma, 4);
  EXPECT_FALSE(parse_speculate("0").enabled());
  EXPECT_FALSE(parse_speculate("off").enabled());
  EXPECT_TRUE(parse_speculate("auto").adaptive);
  test::expect_error([] { parse_speculate("17"); }, ErrorCode::kInvalidArgument, {"--speculate", "\"17\""});
  test::expect_error([] { parse_speculate("x", "lychee.speculate"); }, ErrorCode::kInvalidArgument,
                     {"lychee.speculate", "\"x\""});
}

}  // namespace
}  // namespace lychee
