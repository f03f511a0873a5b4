// Prefix reuse: a session that copies another's first n cached tokens continues exactly as a
// session that prefilled them itself (CPU here; the GPU's shared pages in test_cuda_hybrid.cpp),
// and the PrefixCache finds the longest kept prompt, leaves the last prompt token to be fed,
// keeps the prompt's last tokens to be prefilled, evicts least recently used entries to its
// budget and refuses what cannot be.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/error.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/session.h"
#include "test_util.h"

namespace lychee {
namespace {

std::vector<int32_t> ids_of(int n, int vocab, int salt = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 31 + salt * 7 + 3) % vocab);
  return v;
}

std::vector<float> copy_of(std::span<const float> s) { return {s.begin(), s.end()}; }

struct TinyModel {
  Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/llama_tied_f32");
  cpu::Model model{ck.config(), HostWeights::load(ck)};
};

// The copy continues bit for bit like a session that prefilled the same tokens in the same
// chunks (the donor's: prefill rounding depends on the chunk, as it does without reuse), and
// within f32 rounding of one that prefilled everything at once.
TEST(PrefixCache, CopiedPrefixContinuesLikeItsOwnPrefill) {
  TinyModel t;
  const int vocab = t.ck.config().vocab_size;
  const std::vector<int32_t> ids = ids_of(40, vocab);
  const std::span<const int32_t> head = std::span<const int32_t>(ids).first(30);
  const std::span<const int32_t> rest = std::span<const int32_t>(ids).subspan(30);
  CpuSession donor(t.model, 64), copy(t.model, 64), own(t.model, 64), whole(t.model, 64);
  donor.feed(head);
  donor.feed(std::vector<int32_t>{5, 6, 7});  // the donor went on past the shared prefix
  copy.copy_prefix(donor, 30);
  EXPECT_EQ(copy.length(), 30);
  const auto got = copy_of(copy.forward(rest));
  own.feed(head);
  const auto want = copy_of(own.forward(rest));
  EXPECT_EQ(got, want);
  EXPECT_LT(test::rel_error(got, copy_of(whole.forward(ids))), 1e-5);
  // Decoding on: the same next logits as the session that computed its prefix itself.
  const int32_t next = 7;
  EXPECT_EQ(copy_of(copy.forward(std::span<const int32_t>(&next, 1))), copy_of(own.forward(std::span<const int32_t>(&next, 1))));
}

TEST(PrefixCache, CopyPrefixRefusesBadSourcesAndLengths) {
  TinyModel t;
  const std::vector<int32_t> ids = ids_of(20, t.ck.config().vocab_size);
  CpuSession donor(t.model, 64), full(t.model, 64), small(t.model, 8);
  donor.feed(ids);
  full.feed(ids);
  test::expect_error([&] { full.copy_prefix(donor, 5); }, ErrorCode::kInvalidArgument, "must be empty");
  CpuSession empty(t.model, 64);
  test::expect_error([&] { empty.copy_prefix(donor, 21); }, ErrorCode::kInvalidArgument, "the source holds 20");
  test::expect_error([&] { small.copy_prefix(donor, 10); }, ErrorCode::kInvalidArgument, "of 8");
}

TEST(PrefixCache, FindsTheLongestKeptPromptAndLeavesTheLastTokensToPrefill) {
  TinyModel t;
  const int vocab = t.ck.config().vocab_size;
  PrefixCache cache(1000, 4);
  auto keep = [&](const std::vector<int32_t>& tokens) {
    auto s = std::make_unique<CpuSession>(t.model, 100);
    s->feed(tokens);
    cache.put(std::move(s), tokens);
  };
  const std::vector<int32_t> doc = ids_of(30, vocab), other = ids_of(30, vocab, 5);
  std::vector<int32_t> doc_q1 = doc, doc_q2 = doc;
  doc_q1.insert(doc_q1.end(), {1, 2, 3});
  doc_q2.insert(doc_q2.end(), {4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  keep(doc_q1);
  keep(other);
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_EQ(cache.tokens_held(), 200);  // the sessions' capacities
  const PrefixCache::Match m = cache.find(doc_q2);
  ASSERT_NE(m.session, nullptr);
  EXPECT_EQ(m.length, 30);  // the shared document
  const PrefixCache::Match same = cache.find(doc_q1);
  EXPECT_EQ(same.length, int(doc_q1.size()) - 8);  // an identical prompt still prefills its last 8 tokens
  EXPECT_EQ(cache.find(std::span<const int32_t>(doc_q1).first(20)).length, 12);
  test::expect_error([] { PrefixCache(10, 4, 1); }, ErrorCode::kInvalidArgument, "min_suffix >= 2");
  EXPECT_EQ(cache.find(std::vector<int32_t>{doc[0], doc[1], doc[2], 9, 9}).session, nullptr);  // 3 < min_match
  EXPECT_EQ(cache.find(ids_of(30, vocab, 11)).session, nullptr);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedToItsBudget) {
  TinyModel t;
  const int vocab = t.ck.config().vocab_size;
  PrefixCache cache(250, 4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(ids_of(10, vocab, i + 1));
  auto keep = [&](int i, int capacity) {
    auto s = std::make_unique<CpuSession>(t.model, capacity);
    s->feed(prompts[size_t(i)]);
    cache.put(std::move(s), prompts[size_t(i)]);
  };
  keep(0, 100);
  keep(1, 100);
  std::vector<int32_t> p0 = prompts[0];
  p0.insert(p0.end(), 8, 1);
  ASSERT_NE(cache.find(p0).session, nullptr);  // 0 is now the most recently used
  keep(2, 100);                                // over 250: the least recently used (1) goes
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_EQ(cache.tokens_held(), 200);
  std::vector<int32_t> p1 = prompts[1];
  p1.insert(p1.end(), 8, 1);
  EXPECT_EQ(cache.find(p1).session, nullptr);
  EXPECT_NE(cache.find(p0).session, nullptr);
  keep(0, 100);  // the same prompt again replaces its entry
  EXPECT_EQ(cache.entries(), 2);
  keep(1, 300);  // larger than the whole budget: not kept, nothing evicted for it
  EXPECT_EQ(cache.entries(), 2);
  cache.evict_to(100);
  EXPECT_EQ(cache.entries(), 1);
  cache.clear();
  EXPECT_EQ(cache.tokens_held(), 0);
  auto wrong = std::make_unique<CpuSession>(t.model, 50);
  wrong->feed(prompts[0]);
  test::expect_error([&] { cache.put(std::move(wrong), std::vector<int32_t>{1, 2}); },
                     ErrorCode::kInvalidArgument, "holds 10 tokens, 2 given");
}

}  // namespace
}  // namespace lychee

namespace lychee {
namespace {

// The default model through the engine (native quantized weights on the CPU): a copied prefix
// continues within f32 rounding of a session that prefilled it (different chunk, so not bit for
// bit), and greedy decoding from it picks the same tokens.
TEST(PrefixCache, DefaultModelSessionsContinueFromACopiedPrefix) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  EngineOptions o;
  o.device = "cpu";
  Engine engine(o);
  const int vocab = engine.config().vocab_size;
  const std::vector<int32_t> ids = ids_of(120, vocab);
  std::unique_ptr<Session> donor = engine.new_session(256), copy = engine.new_session(256), own = engine.new_session(256);
  donor->feed(ids);
  donor->feed(std::vector<int32_t>{11, 12, 13});
  donor->truncate(int(ids.size()));
  copy->copy_prefix(*donor, 100);
  const auto got = copy_of(copy->forward(std::span<const int32_t>(ids).subspan(100)));
  const auto want = copy_of(own->forward(ids));
  EXPECT_LT(test::rel_error(got, want), 1e-3);
  Sampler a(SamplingParams{}), b(SamplingParams{});
  for (int i = 0; i < 8; ++i) {
    const int32_t ta = copy->sample(a), tb = own->sample(b);
    ASSERT_EQ(ta, tb) << "step " << i;
    copy->feed(std::span<const int32_t>(&ta, 1));
    own->feed(std::span<const int32_t>(&tb, 1));
  }
}

}  // namespace
}  // namespace lychee
