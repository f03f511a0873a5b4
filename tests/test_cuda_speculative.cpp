// Self-speculative decoding on the GPU (runtime/speculative.h, GpuSession::verify). The GPU's
// verification is one decode step of γ + 1 <= 16 rows per sequence (GpuRunner::verify, the decode
// kernel's rows_per_seq: the KV read once where the model's GQA group x (γ + 1) fits one mma tile
// of 16 rows, the default model's group of 3 up to γ = 4, once per tile's worth of positions
// past it), else one chunk through the prefill kernels (the split-KV fallback for a short chunk
// over a long cache) with every row's logits (FP8 KV pages, γ = 16; compared here through
// GpuRunner::prefill's all_logits directly). Either way its
// rows equal Full's decode steps within bf16 rounding of another summation order, not bit for
// bit as on the CPU. Tested: the rows of both against Full's decode steps of the same tokens (the
// bound HybridPolicies uses for policies that read every token in another order) and against each
// other, a batched step against each sequence alone (and Session::verify_batch's sessions against
// each verified alone), the cache after a rollback, and greedy
// speculation (γ = 4: the decode step) against GPU Full over the eval's prompts on the default
// model: the same tokens, or a first difference only where Full's own top two logits lie within
// that rounding (a near-tie; the test prints every such case).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include "attention/policies.h"
#include "cuda/kernels/decode_attention.h"
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
    if (relative_margin(want[i]) > 2 * kRowBound) {
      EXPECT_EQ(argmax(got), argmax(want[i])) << "row " << i;
    }
  }
}

// The logits rows [n][vocab] the runner holds after a pass.
std::vector<std::vector<float>> rows_of_logits(cuda::GpuRunner& r, int n) {
  std::vector<std::vector<float>> out(size_t(n), std::vector<float>(size_t(r.config().vocab_size)));
  for (int i = 0; i < n; ++i) r.copy_logits(i, out[size_t(i)]);
  return out;
}

void expect_rows_near(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = rel_error(got[i], want[i]);
    std::printf("%s row %zu: relative error %.2e\n", what, i, err);
    EXPECT_LT(err, kRowBound) << what << " row " << i;
    if (relative_margin(want[i]) > 2 * kRowBound) {
      EXPECT_EQ(argmax(got[i]), argmax(want[i])) << what << " row " << i;
    }
  }
}

// The verification step (GpuRunner::verify: one decode step of R rows, the decode kernel's
// rows_per_seq) against the prefill pass's verification of the same tokens and against R
// successive Full decode steps, R = 1..8 (the default model's group of 3 fits one tile up to 5;
// 6..8 take two items per head); then the cache after a rejection: truncated to the accepted
// tokens, the next Full step equals the step over a cache built from those tokens alone.
TEST(CudaSpeculative, VerifyStepRowsMatchPrefillVerifyAndFullSteps) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  Gpu g(path);
  cuda::GpuRunner& r = g.runner;
  const ModelConfig& c = g.ck.config();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 900; ++i) prompt.push_back(int32_t((i * 37 + 11) % c.vocab_size));
  ASSERT_EQ(cuda::decode_positions_per_item(c.group_size(), 9), 5);
  ASSERT_FALSE(r.verify_step_fits(1, cuda::kDecodeMaxVerifyRows + 1));
  // Past the fused decode layers' rows the products run in chunks of them (RunnerOptions::
  // fused_verify_chunks; VerifyStepPastTheFusedRowsMatchesFullStepsBitForBit); a one-row-per-
  // sequence step past them would be a plain decode step's cuBLASLt products, and the logits rows
  // bound the rest.
  ASSERT_EQ(r.fused_decode_rows(), 8);
  ASSERT_TRUE(r.verify_step_fits(1, 9));
  ASSERT_TRUE(r.verify_step_fits(2, 5));
  ASSERT_FALSE(r.verify_step_fits(2, 9));  // 18 rows: past the 17 logits rows of max_batch 2
  for (int rows = 1; rows <= 8; ++rows) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    ASSERT_TRUE(r.verify_step_fits(1, rows));
    std::vector<int32_t> toks;
    for (int i = 0; i < rows; ++i) toks.push_back(int32_t((i * 101 + 5 + rows) % c.vocab_size));
    cuda::GpuSeq a, b, f;
    cuda::GpuSeq* pa[] = {&a};
    r.prefill(a, prompt);
    r.verify(pa, toks, rows);
    EXPECT_EQ(a.length, int(prompt.size()) + rows);
    const auto step = rows_of_logits(r, rows);
    r.prefill(b, prompt);
    r.prefill(b, toks, /*all_logits=*/true);
    const auto pass = rows_of_logits(r, rows);
    r.prefill(f, prompt);
    std::vector<std::vector<float>> full;
    cuda::GpuSeq* pf[] = {&f};
    for (const int32_t t : toks) {
      r.decode(pf, std::span<const int32_t>(&t, 1), false);
      full.push_back(rows_of_logits(r, 1)[0]);
    }
    expect_rows_near(step, pass, "step vs prefill pass");
    expect_rows_near(step, full, "step vs Full steps");
    // Reject after the first token: keep prompt + toks[0], then one Full step of another token.
    const int keep = int(prompt.size()) + 1;
    const int32_t next = int32_t(4242 % c.vocab_size);
    r.truncate(a, keep);
    r.decode(pa, std::span<const int32_t>(&next, 1), false);
    const auto after = rows_of_logits(r, 1);
    cuda::GpuSeq fresh;
    cuda::GpuSeq* pn[] = {&fresh};
    std::vector<int32_t> accepted = prompt;
    accepted.push_back(toks[0]);
    r.prefill(fresh, accepted);
    r.decode(pn, std::span<const int32_t>(&next, 1), false);
    expect_rows_near(after, rows_of_logits(r, 1), "step after the rollback");
    for (cuda::GpuSeq* s : {&a, &b, &f, &fresh}) r.release(*s);
  }
}

// Two sequences of different lengths in one verification step (their rows b R + r) against each
// verified alone, and against Full steps.
TEST(CudaSpeculative, BatchedVerifyStepMatchesEachSequenceAlone) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  Gpu g(path);
  cuda::GpuRunner& r = g.runner;
  const ModelConfig& c = g.ck.config();
  constexpr int kRows = 4;
  ASSERT_TRUE(r.verify_step_fits(2, kRows));
  std::vector<int32_t> p0, p1, toks;
  for (int i = 0; i < 700; ++i) p0.push_back(int32_t((i * 37 + 11) % c.vocab_size));
  for (int i = 0; i < 131; ++i) p1.push_back(int32_t((i * 53 + 3) % c.vocab_size));
  for (int i = 0; i < 2 * kRows; ++i) toks.push_back(int32_t((i * 97 + 19) % c.vocab_size));
  cuda::GpuSeq s0, s1;
  cuda::GpuSeq* both[] = {&s0, &s1};
  r.prefill(s0, p0);
  r.prefill(s1, p1);
  r.verify(both, toks, kRows);
  const auto batched = rows_of_logits(r, 2 * kRows);
  for (int b = 0; b < 2; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::span<const int32_t> mine = std::span<const int32_t>(toks).subspan(size_t(b * kRows), kRows);
    cuda::GpuSeq alone, f;
    cuda::GpuSeq* pa[] = {&alone};
    cuda::GpuSeq* pf[] = {&f};
    r.prefill(alone, b == 0 ? p0 : p1);
    r.verify(pa, mine, kRows);
    const auto want = rows_of_logits(r, kRows);
    r.prefill(f, b == 0 ? p0 : p1);
    std::vector<std::vector<float>> full;
    for (const int32_t t : mine) {
      r.decode(pf, std::span<const int32_t>(&t, 1), false);
      full.push_back(rows_of_logits(r, 1)[0]);
    }
    const std::vector<std::vector<float>> got(batched.begin() + b * kRows, batched.begin() + (b + 1) * kRows);
    expect_rows_near(got, want, "batched vs alone");
    expect_rows_near(got, full, "batched vs Full steps");
    r.release(alone);
    r.release(f);
  }
  r.release(s0);
  r.release(s1);
}

// Verification steps past the fused decode layers' 8 rows (batch 4 x 3 = 12 rows, batch 2 x 5 =
// 10: every product in two chunks, RunnerOptions::fused_verify_chunks) against the same tokens fed
// as one-row Full decode steps of the same sequences (a step per position, the batch together):
// every row's logits equal bit for bit (each product row's bits depend only on k, bf16_gemv.h, and
// the decode kernel's rows as a one-row step's) where the verified rows add no KV page, so that
// the verification step and each Full step cut a head's KV into the same splits (plan_decode splits
// whole pages; prompts of 64 m + 1 tokens keep the rows in one page). Where the rows cross a page
// (a prompt of 64 m - 1 tokens), a Full step before the boundary merges fewer splits than the
// verification step, and its rows agree within the bf16 rounding of the split-KV merge (measured on
// an H200: up to 2.1e-3 relative). Prints the first differing rows' error.
TEST(CudaSpeculative, VerifyStepPastTheFusedRowsMatchesFullStepsBitForBit) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  cuda::RunnerOptions o;
  o.kv_memory_gib = 0.5;
  o.max_context = 4096;
  o.max_batch = 4;
  cuda::GpuRunner r(cuda::upload_weights(ck), o);
  const ModelConfig& c = ck.config();
  ASSERT_EQ(r.fused_decode_rows(), 8);
  const int page = o.page_size;
  struct Case {
    int batch, rows;
    bool crosses_page;  // the second sequence's rows cross a page boundary
  };
  for (const Case& k : {Case{4, 3, false}, Case{2, 5, false}, Case{4, 3, true}, Case{2, 5, true}}) {
    const int batch = k.batch, rows = k.rows;
    SCOPED_TRACE("batch " + std::to_string(batch) + " x rows " + std::to_string(rows) +
                 (k.crosses_page ? ", across a page" : ", within a page"));
    ASSERT_GT(batch * rows, r.fused_decode_rows());
    ASSERT_TRUE(r.verify_step_fits(batch, rows));
    ASSERT_LT(rows + 1, page);
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
    for (int b = 0; b < batch; ++b) {
      const int n = page * (4 + 3 * b) + (k.crosses_page && b == 1 ? -1 : 1);
      for (int i = 0; i < n; ++i) prompts[size_t(b)].push_back(int32_t((i * 37 + 11 + 7 * b) % c.vocab_size));
    }
    std::vector<int32_t> toks;  // [batch][rows]
    for (int i = 0; i < batch * rows; ++i) toks.push_back(int32_t((i * 97 + 19) % c.vocab_size));
    std::vector<cuda::GpuSeq> v(static_cast<size_t>(batch)), f(static_cast<size_t>(batch));
    std::vector<cuda::GpuSeq*> pv, pf;
    for (int b = 0; b < batch; ++b) {
      r.prefill(v[size_t(b)], prompts[size_t(b)]);
      r.prefill(f[size_t(b)], prompts[size_t(b)]);
      pv.push_back(&v[size_t(b)]);
      pf.push_back(&f[size_t(b)]);
    }
    r.verify(pv, toks, rows);
    const auto step = rows_of_logits(r, batch * rows);
    std::vector<std::vector<float>> full(static_cast<size_t>(batch * rows));
    for (int j = 0; j < rows; ++j) {  // position j of every sequence as one decode step
      std::vector<int32_t> t;
      for (int b = 0; b < batch; ++b) t.push_back(toks[size_t(b * rows + j)]);
      r.decode(pf, t, false);
      const auto got = rows_of_logits(r, batch);
      for (int b = 0; b < batch; ++b) full[size_t(b * rows + j)] = got[size_t(b)];
    }
    int differing = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      if (step[i] == full[i]) continue;
      if (++differing <= 4) std::printf("row %zu differs: relative error %.2e\n", i, rel_error(step[i], full[i]));
    }
    if (!k.crosses_page) EXPECT_EQ(differing, 0) << "of " << step.size() << " rows";
    else std::printf("across a page: %d of %zu rows differ from Full's steps\n", differing, step.size());
    expect_rows_near(step, full, "chunked step vs Full steps");
    for (int b = 0; b < batch; ++b) {
      EXPECT_EQ(v[size_t(b)].length, f[size_t(b)].length);
      r.release(v[size_t(b)]);
      r.release(f[size_t(b)]);
    }
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

// Session::verify_batch on GPU sessions: the two of 3 rows in one verification step (the runner's
// max_batch is 2), the one of 2 rows alone; each session's rows near what its verify() alone gives
// and its cache as long.
TEST(CudaSpeculative, VerifyBatchOfSessionsMatchesEachAlone) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  Gpu g(path);
  const ModelConfig& c = g.ck.config();
  ASSERT_TRUE(g.runner.verify_step_fits(2, 3));
  const auto full = make_policy(PolicyOptions{}, c);
  const std::vector<int> prompt_len = {700, 131, 402}, rows = {3, 3, 2};
  std::vector<std::vector<int32_t>> prompts(3), toks(3);
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < prompt_len[size_t(b)]; ++i)
      prompts[size_t(b)].push_back(int32_t((i * 37 + 11 * b + 5) % c.vocab_size));
    for (int i = 0; i < rows[size_t(b)]; ++i) toks[size_t(b)].push_back(int32_t((i * 97 + 19 + b) % c.vocab_size));
  }
  std::vector<std::unique_ptr<GpuSession>> batch;
  std::vector<Session*> sessions;
  std::vector<std::span<const int32_t>> spans;
  for (int b = 0; b < 3; ++b) {
    batch.push_back(std::make_unique<GpuSession>(g.runner, 1024));
    batch.back()->set_policy(full.get());
    batch.back()->feed(prompts[size_t(b)]);
    sessions.push_back(batch.back().get());
    spans.push_back(toks[size_t(b)]);
  }
  std::vector<std::vector<std::vector<float>>> got(3);
  std::vector<int> order;
  Session::verify_batch(sessions, spans, [&](size_t i, std::span<const float> r) {
    order.push_back(int(i));
    for (int k = 0; k < rows[i]; ++k) {
      const auto row = r.subspan(size_t(k) * size_t(c.vocab_size), size_t(c.vocab_size));
      got[i].emplace_back(row.begin(), row.end());
    }
  });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  for (int b = 0; b < 3; ++b) {
    SCOPED_TRACE("session " + std::to_string(b));
    EXPECT_EQ(batch[size_t(b)]->length(), prompt_len[size_t(b)] + rows[size_t(b)]);
    GpuSession alone(g.runner, 1024);
    alone.set_policy(full.get());
    alone.feed(prompts[size_t(b)]);
    const std::span<const float> r = alone.verify(toks[size_t(b)]);
    std::vector<std::vector<float>> want;
    for (int k = 0; k < rows[size_t(b)]; ++k) {
      const auto row = r.subspan(size_t(k) * size_t(c.vocab_size), size_t(c.vocab_size));
      want.emplace_back(row.begin(), row.end());
    }
    expect_rows_near(got[size_t(b)], want, "verify_batch vs verify alone");
  }
  test::expect_error([&] { Session::verify_batch(sessions, std::span(spans).first(2), nullptr); },
                     ErrorCode::kInvalidArgument, {"3 sessions but 2 token lists"});
}

}  // namespace
}  // namespace lychee

#else
TEST(CudaSpeculative, NotBuilt) { LY_CUDA_NOT_BUILT("the GPU speculative decoding tests"); }
#endif  // LYCHEE_HAS_CUDA
