// Self-speculative decoding on the GPU (runtime/speculative.h, GpuSession::verify). The GPU's
// verification pass is one chunk through the prefill kernels (the split-KV fallback for a short
// chunk over a long cache) with every row's logits, so its rows equal Full's decode steps within
// bf16 rounding of another summation order, not bit for bit as on the CPU. Tested: the rows
// against Full's decode steps of the same tokens (the bound HybridPolicies uses for policies that
// read every token in another order), and greedy speculation against GPU Full over the eval's
// prompts on the default model: the same tokens, or a first difference only where Full's own top
// two logits lie within that rounding (a near-tie; the test prints every such case).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include "attention/policies.h"
#include "cuda/runner/gpu_runner.h"
#include "eval/tasks.h"
#include "model/chat_template.h"
#include "runtime/cuda_session.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/policy_settings.h"

namespace lychee {
namespace {

using test::rel_error;

constexpr double kRowBound = 1e-2;  // relative L2, bf16 rounding of another summation order

struct Gpu {
  Checkpoint ck;
  cuda::GpuRunner runner;
  explicit Gpu(const std::string& path)
      : ck(Checkpoint::open(path)), runner(cuda::upload_weights(ck), [] {
          cuda::RunnerOptions o;
          o.kv_memory_gib = 0.5;
          o.max_context = 4096;
          o.max_batch = 2;
          return o;
        }()) {}
};

std::unique_ptr<AttentionPolicy> lychee_draft(const ModelConfig& c) {
  PolicySettings s;
  s.policy = "lychee";
  s.budget = 96;
  s.sink = 16;
  s.recent = 16;
  return make_policy(s.options(c), c);
}

// top1 - top2 of a logits row, relative to its largest magnitude.
double relative_margin(std::span<const float> l) {
  std::vector<float> v(l.begin(), l.end());
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  float mag = 0.0f;
  for (float x : l) mag = std::max(mag, std::fabs(x));
  return double(v[0] - v[1]) / double(std::max(mag, 1e-6f));
}

TEST(CudaSpeculative, VerifyRowsMatchFullDecodeSteps) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  Gpu g(path);
  const ModelConfig& c = g.ck.config();
  std::vector<int32_t> prompt, rows_of;
  for (int i = 0; i < 900; ++i) prompt.push_back(int32_t((i * 37 + 11) % c.vocab_size));
  for (int i = 0; i < 9; ++i) rows_of.push_back(int32_t((i * 101 + 5) % c.vocab_size));
  const auto full = make_policy(PolicyOptions{}, c);
  GpuSession steps(g.runner, 1024), verified(g.runner, 1024);
  steps.set_policy(full.get());
  steps.feed(prompt);
  std::vector<std::vector<float>> want;
  for (const int32_t t : rows_of) {
    const auto l = steps.forward(std::span<const int32_t>(&t, 1));
    want.emplace_back(l.begin(), l.end());
  }
  verified.set_policy(full.get());
  verified.feed(prompt);
  const std::span<const float> rows = verified.verify(rows_of);
  ASSERT_EQ(rows.size(), rows_of.size() * size_t(c.vocab_size));
  EXPECT_EQ(verified.length(), steps.length());
  for (size_t i = 0; i < rows_of.size(); ++i) {
    const std::span<const float> got = rows.subspan(i * size_t(c.vocab_size), size_t(c.vocab_size));
    const double err = rel_error(got, want[i]);
    std::printf("row %zu: relative error %.2e\n", i, err);
    EXPECT_LT(err, kRowBound) << "row " << i;
    if (relative_margin(want[i]) > 2 * kRowBound) EXPECT_EQ(argmax(got), argmax(want[i])) << "row " << i;
  }
}

// Full's greedy tokens step by step on the GPU, with each step's relative margin.
std::vector<int32_t> full_greedy(GpuSession& s, std::span<const int32_t> ids, int n, const std::vector<int32_t>& stops,
                                 std::vector<double>& margins) {
  s.feed(ids);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::span<const float> l = s.logits();
    margins.push_back(relative_margin(l));
    out.push_back(argmax(l));
    if (std::find(stops.begin(), stops.end(), out.back()) != stops.end() || i + 1 == n) break;
    s.feed(std::span<const int32_t>(&out.back(), 1));
  }
  return out;
}

TEST(CudaSpeculative, GreedyGivesFullsTokensOnTheDefaultModelOverEvalPrompts) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  Gpu g(path);
  const ModelConfig& c = g.ck.config();
  const Tokenizer tok = load_tokenizer(g.ck);
  const TaskGenerator gen(tok, Haystack::synthetic());
  const ChatTemplate chat = ChatTemplate::of(tok);
  const auto full = make_policy(PolicyOptions{}, c);
  const auto draft = lychee_draft(c);
  SpeculateStats total;
  int identical = 0, near_ties = 0, prompts = 0;
  for (const TaskKind kind : {TaskKind::kPasskey, TaskKind::kNiahSingle, TaskKind::kVariableTracking,
                              TaskKind::kCommonWords}) {
    for (const int length : {900, 3000}) {
      const EvalSample s = gen.make({kind, length, 0.5, 7});
      const auto ids = tok.encode(chat.render({{"user", s.user_message}}).text + s.answer_prefix, false, true);
      GpuSession a(g.runner, 4096), b(g.runner, 4096);
      a.set_policy(full.get());
      std::vector<double> margins;
      const std::vector<int32_t> want = full_greedy(a, ids, s.max_new_tokens, tok.stop_ids(), margins);
      b.set_policy(draft.get());
      GenerateOptions o;
      o.max_new_tokens = s.max_new_tokens;
      o.stop_ids = tok.stop_ids();
      o.speculate.gamma = 4;
      const GenerateResult got = generate(b, ids, o);
      total.drafted += got.speculation.drafted;
      total.accepted += got.speculation.accepted;
      ++prompts;
      size_t first = 0;
      while (first < want.size() && first < got.tokens.size() && want[first] == got.tokens[first]) ++first;
      if (first == want.size() && first == got.tokens.size()) {
        ++identical;
        continue;
      }
      ASSERT_LT(first, margins.size()) << s.task << " " << length << ": Full stopped, speculation did not";
      std::printf("%s %d: first difference at token %zu, Full's relative margin there %.2e\n", s.task.c_str(), length,
                  first, margins[first]);
      EXPECT_LT(margins[first], 2 * kRowBound) << s.task << " " << length << ": a clear token differs at " << first;
      ++near_ties;
    }
  }
  std::printf("GPU: %d of %d prompts identical to Full, %d differ first at a near-tie; acceptance %.3f (%llu/%llu)\n",
              identical, prompts, near_ties, total.acceptance(), (unsigned long long)total.accepted,
              (unsigned long long)total.drafted);
  EXPECT_GT(total.accepted, 0u);
}

}  // namespace
}  // namespace lychee

#else
TEST(CudaSpeculative, NotBuilt) { LY_CUDA_NOT_BUILT("the GPU speculative decoding tests"); }
#endif  // LYCHEE_HAS_CUDA
