// eval/perplexity.h: KL of two logit rows by hand, a configuration against itself (zero KL, the
// same perplexity), FP8 weights against f32 (a small positive KL), and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <span>
#include <vector>

#include "eval/perplexity.h"
#include "gpu_test_util.h"
#include "runtime/engine.h"
#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

TEST(Perplexity, KlOfLogitsByHand) {
  // p = softmax(0, ln 3) = (1/4, 3/4), q = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2).
  const std::vector<float> p = {0.0f, std::log(3.0f)}, q = {1.0f, 1.0f};
  EXPECT_NEAR(kl_of_logits(p, q), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-6);
  EXPECT_EQ(kl_of_logits(p, p), 0.0);
  test::expect_error([&] { kl_of_logits(p, std::vector<float>{1.0f}); }, ErrorCode::kInvalidArgument, {"2 and 1"});
}

TEST(Perplexity, AgainstItselfAndAgainstFp8Weights) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine f32(EngineOptions{path, "cpu"});
  EngineOptions o{path, "cpu"};
  o.cpu_weights = WeightFormat::kFp8;
  Engine fp8(o);
  const std::vector<int32_t> ids = f32.tokenizer().encode(
      "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. Many hands make light work, "
      "and the early bird catches the worm, while the river runs quietly to the sea past the old mill.",
      false, false);
  ASSERT_GE(ids.size(), 32u);
  auto a = f32.new_session(16), b = f32.new_session(16), c = fp8.new_session(16);
  const PerplexityResult same = compare_perplexity(*a, *b, ids, 16, 2);
  EXPECT_EQ(same.windows, 2);
  EXPECT_EQ(same.scored, 16);
  EXPECT_EQ(same.mean_kl, 0.0);
  EXPECT_EQ(same.max_kl, 0.0);
  EXPECT_EQ(same.base_ppl, same.test_ppl);
  EXPECT_EQ(same.top1_agree, 1.0);
  EXPECT_GT(same.base_ppl, 1.0);
  const PerplexityResult q = compare_perplexity(*a, *c, ids, 16, 2);
  EXPECT_GT(q.mean_kl, 0.0);
  EXPECT_LT(q.mean_kl, 0.2) << "FP8 weights move the default model's distributions a little";
  EXPECT_GE(q.max_kl, q.p99_kl);
  EXPECT_GE(q.p99_kl, q.mean_kl * 0.5);
  EXPECT_EQ(q.base_ppl, same.base_ppl);
  test::expect_error([&] { compare_perplexity(*a, *b, std::span<const int32_t>(ids).first(10), 16, 1); },
                     ErrorCode::kInvalidArgument, {"10 tokens", "--ctx 16"});
}

// Sessions that share one runner's logits the way GPU sessions do: a session's logits() are its
// own only until another session's forward pass, unless it keeps them (Session::keep_logits), in
// which case the runner hands them over first. The logits are a function of the tokens fed.
struct SharedRunner {
  uint64_t forwards = 0;
  std::vector<float> rows;                     // the last forward pass's logits
  std::vector<std::function<void()>> before;   // the keepers of the sessions that keep theirs
  void forward(std::vector<float> logits) {
    auto calls = std::move(before);
    before.clear();
    for (auto& f : calls) f();
    rows = std::move(logits);
    ++forwards;
  }
};

class SharedRunnerSession final : public Session {
 public:
  explicit SharedRunnerSession(SharedRunner& r) : r_(r) {}
  void feed(std::span<const int32_t> tokens, bool = true) override {
    for (int32_t t : tokens) history_ = history_ * 31 + uint64_t(t) + 1;
    n_ += int(tokens.size());
    std::vector<float> l(8);
    for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(history_ % 1000) + 0.7 * double(i)));
    r_.forward(std::move(l));
    forward_ = r_.forwards;
    kept_.clear();
    if (keep_) r_.before.push_back([this] { kept_ = r_.rows; });
  }
  std::span<const float> logits() override {
    if (!kept_.empty()) return kept_;
    LY_CHECK(r_.forwards == forward_, ErrorCode::kInternal, "another session ran a forward pass since this one's");
    return r_.rows;
  }
  void keep_logits(bool keep) override { keep_ = keep; }
  int length() const override { return n_; }
  int capacity() const override { return 1 << 20; }
  void truncate(int n) override { n_ = n, history_ = 0; }
  void set_policy(AttentionPolicy*) override {}
  const KvReadStats& stats() const override { return stats_; }
  void reset_stats() override {}

 private:
  SharedRunner& r_;
  uint64_t history_ = 0, forward_ = 0;
  int n_ = 0;
  bool keep_ = false;
  std::vector<float> kept_;
  KvReadStats stats_;
};

// compare_perplexity feeds base and test in turn and reads each one's logits after the other's
// step: with sessions of one GPU runner (a policy against full attention, the same weights and KV
// dtype) it asks both to keep their logits. Two equal configurations: zero KL, equal perplexity.
TEST(Perplexity, SessionsSharingOneRunnerKeepTheirLogits) {
  SharedRunner runner;
  SharedRunnerSession a(runner), b(runner);
  std::vector<int32_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + 3) % 8);
  const PerplexityResult r = compare_perplexity(a, b, ids, 16, 3);
  EXPECT_EQ(r.scored, 24);
  EXPECT_EQ(r.mean_kl, 0.0);
  EXPECT_EQ(r.base_ppl, r.test_ppl);
  EXPECT_GT(r.base_ppl, 1.0);
  // The same sessions without keeping refuse, as GPU sessions do (the check compare_perplexity
  // would hit without keep_logits).
  a.keep_logits(false), b.keep_logits(false);
  a.feed(std::span<const int32_t>(ids).first(4));
  b.feed(std::span<const int32_t>(ids).first(4));
  test::expect_error([&] { a.logits(); }, ErrorCode::kInternal, {"another session"});
}

// On the GPU a policy against full attention (the same weights and KV dtype) runs base and test
// as two sessions of one runner. Before Session::keep_logits the base's logits() refused there
// ("another session ran a forward pass on the shared runner"): kv8-accuracy's per-policy bf16-KV
// baselines failed so. Dense against dense is the same computation: zero KL, equal perplexity.
TEST(Perplexity, GpuSessionsOfOneRunnerCompare) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine gpu(EngineOptions{path, "cuda"});
  const std::vector<int32_t> ids = gpu.tokenizer().encode(
      "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. Many hands make light work, "
      "and the early bird catches the worm, while the river runs quietly to the sea past the old mill.",
      false, false);
  ASSERT_GE(ids.size(), 32u);
  auto a = gpu.new_session(16), b = gpu.new_session(16);
  const PerplexityResult same = compare_perplexity(*a, *b, ids, 16, 2);
  EXPECT_EQ(same.scored, 16);
  EXPECT_EQ(same.mean_kl, 0.0);
  EXPECT_EQ(same.base_ppl, same.test_ppl);
  EXPECT_GT(same.base_ppl, 1.0);
  // Not kept (the default, what the server's sessions do): the refusal stays. compare_perplexity
  // leaves its last window in both caches.
  a->truncate(0);
  b->truncate(0);
  a->feed(std::span<const int32_t>(ids).first(4));
  b->feed(std::span<const int32_t>(ids).first(4));
  test::expect_error([&] { a->logits(); }, ErrorCode::kInternal, {"another session ran a forward pass"});
  // The command with a policy on one GPU engine (base and test on one runner).
  const std::string dir = test::temp_dir("perplexity_gpu");
  std::string words;
  for (int i = 0; i < 30; ++i) words += "one two three four five ";
  const std::string text =
      test::write_bytes(dir + "/t.txt", std::vector<uint8_t>(words.begin(), words.end()));
  const test::RunResult r = test::run_cli("perplexity --device cuda --ctx 32 --windows 1 --policy quest --budget 16 -f " +
                                          text + " --json " + dir + "/q.json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(test::read_json(dir + "/q.json")["scored"], 16);
}

TEST(Perplexity, CliComparesWeightFormatsAndWritesJson) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const std::string dir = test::temp_dir("perplexity_cli");
  const std::string words =
      "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
      "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light.";
  const std::string text = test::write_bytes(dir + "/t.txt", std::vector<uint8_t>(words.begin(), words.end()));
  const test::RunResult r = test::run_cli("perplexity --device cpu --ctx 16 --windows 1 --cpu-weights fp8 "
                                          "--base-cpu-weights f32 -f " + text + " --json " + dir + "/r.json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("KL(base || test)"), std::string::npos) << r.output;
  const nlohmann::json j = test::read_json(dir + "/r.json");
  EXPECT_EQ(j["scored"], 8);
  EXPECT_GT(j["mean_kl"].get<double>(), 0.0);
  EXPECT_EQ(j["base"], "f32 weights, f32 KV, full attention");
  const test::RunResult gpu_only = test::run_cli("perplexity --device cpu --ctx 16 --base-weights fp8 -f " + text);
  EXPECT_EQ(gpu_only.status, 1);
  EXPECT_NE(gpu_only.output.find("--base-weights compares GPU weight formats"), std::string::npos) << gpu_only.output;
  const test::RunResult bad = test::run_cli("perplexity --device cpu --ctx 4096 -f " + text);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("less than one window of --ctx 4096"), std::string::npos) << bad.output;
  // The KV cache's dtype against the reference's (docs/results/kv8_cpu): same weights, FP8 KV.
  const test::RunResult kv = test::run_cli("perplexity --device cpu --ctx 16 --windows 1 --cpu-weights f32 --kv-cache-dtype fp8_e4m3 "
                                           "--base-kv-cache-dtype auto -f " + text + " --json " + dir + "/kv.json");
  ASSERT_EQ(kv.status, 0) << kv.output;
  const nlohmann::json k = test::read_json(dir + "/kv.json");
  EXPECT_EQ(k["base"], "f32 weights, f32 KV, full attention");
  EXPECT_EQ(k["test"], "f32 weights, fp8 KV, full");
  EXPECT_GT(k["mean_kl"].get<double>(), 0.0);
  const test::RunResult bad_kv = test::run_cli("perplexity --device cpu --ctx 16 --kv-cache-dtype fp16 -f " + text);
  EXPECT_NE(bad_kv.status, 0);
  EXPECT_NE(bad_kv.output.find("--kv-cache-dtype"), std::string::npos) << bad_kv.output;
}

}  // namespace
}  // namespace lychee
