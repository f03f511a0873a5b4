// The GPU runner's host-side plans, without a GPU: a DecodeSpec in the hybrid kernel's terms
// (cuda/runner/policy_plan.h), the GPU-support predicate the CLI and the runner share, and the
// step planner that reuses split plans while every head's work is unchanged
// (cuda/runner/step_meta.h). Compiled with the CUDA layer (nvcc at configure time).
#include <gtest/gtest.h>

#include <numeric>

#include "attention/policies.h"
#include "core/error.h"
#include "spec_test_util.h"
#include "test_util.h"

#ifdef LYCHEE_HAS_CUDA

#include "cuda/kernels/bf16_gemv.h"
#include "cuda/runner/gpu_runner.h"
#include "cuda/runner/policy_plan.h"
#include "cuda/runner/step_meta.h"

namespace lychee {
namespace {

using cuda::GpuPolicyPlan;
using cuda::KernelHead;
using cuda::ListKind;

ModelConfig shape(int n_layers = 4, int n_heads = 8, int n_kv_heads = 2, int head_dim = 64) {
  return test::model_shape(n_layers, n_heads, n_kv_heads, head_dim);
}
using test::roles_of;

// LYCHEE_FUSED_PDL's list: the fused decode products launched with PDL.
TEST(RunnerPlan, PdlProductListsParseToTheirMask) {
  using O = cuda::RunnerOptions;
  EXPECT_EQ(O::parse_pdl_products("qkv,o,gate_up"), O::kPdlQkv | O::kPdlOutput | O::kPdlGateUp);
  EXPECT_EQ(O::parse_pdl_products("down"), O::kPdlDown);
  EXPECT_EQ(O::parse_pdl_products("none"), 0);
  EXPECT_EQ(O().fused_pdl_products, O::kPdlQkv | O::kPdlOutput | O::kPdlGateUp);  // the measured default
  test::expect_error([] { O::parse_pdl_products("qkv,up"); }, ErrorCode::kInvalidArgument, {"'up'", "qkv, o"});
  test::expect_error([] { O::parse_pdl_products("o,,down"); }, ErrorCode::kInvalidArgument, {"''"});
}

// LYCHEE_GEMV_EPILOGUES's list: the epilogues the plain bf16 GEMV takes outside the fused layers.
TEST(RunnerPlan, GemvEpilogueListsParseToTheirMask) {
  using O = cuda::RunnerOptions;
  EXPECT_EQ(O::parse_gemv_epilogues("rope,swiglu"), O::kEpilogueRope | O::kEpilogueSwiGlu);
  EXPECT_EQ(O::parse_gemv_epilogues("swiglu"), O::kEpilogueSwiGlu);
  EXPECT_EQ(O::parse_gemv_epilogues("none"), 0);
  EXPECT_EQ(O().gemv_epilogues, O::kEpilogueRope | O::kEpilogueSwiGlu);
  test::expect_error([] { O::parse_gemv_epilogues("rope,norm"); }, ErrorCode::kInvalidArgument,
                     {"'norm'", "rope, swiglu, none"});
}

TEST(RunnerPlan, LycheeBecomesScoredDenseItemsUnitListsAndKvHeadSelectors) {
  const ModelConfig c = shape();
  SelectParams sel;
  sel.budget = 256;
  const GpuPolicyPlan g =
      cuda::plan_gpu_policy(lychee_spec(c, roles_of(c, {{1, 1}, {0, 1}, {0, 0}, {1, 0}}), 16, sel), c, 64, 1000);
  const KernelHead scored{ListKind::kDense, cuda::ScoreKind::kGroupChunk16, 0, false};
  const KernelHead units{ListKind::kUnits, cuda::ScoreKind::kNone, 16, false};
  const KernelHead dense{};
  EXPECT_EQ(g.patterns[size_t(g.layers[0].pattern)], (std::vector<KernelHead>{scored, scored}));
  EXPECT_EQ(g.patterns[size_t(g.layers[1].pattern)], (std::vector<KernelHead>{units, scored}));
  EXPECT_EQ(g.patterns[size_t(g.layers[2].pattern)], (std::vector<KernelHead>{units, units}));
  EXPECT_EQ(g.patterns[size_t(g.layers[3].pattern)], (std::vector<KernelHead>{dense, units}));
  EXPECT_EQ(g.selectors, (std::vector<int32_t>{0, 1, 1}));  // layer 0: both; layer 1: head 1; last: none
  EXPECT_EQ(g.layers[1].sel_offset, 2);
  EXPECT_EQ(g.layers[1].n_sel, 1);
  EXPECT_EQ(g.layers[3].n_sel, 0);
  EXPECT_EQ(g.row_heads, 2);
  EXPECT_EQ(g.score_unit, 16);
  EXPECT_EQ(g.list_stride, 1000 / 16 + 2);
  EXPECT_EQ(g.score_stride, 1000 / 16 + 2);
  EXPECT_FALSE(g.layers[1].union_count || g.layers[1].page_bound);
}

TEST(RunnerPlan, TokenModeScoresTokens) {
  const ModelConfig c = shape();
  const GpuPolicyPlan g = cuda::plan_gpu_policy(lychee_spec(c, head_roles_from_layers(c, {0}), 1, {}), c, 64, 500);
  EXPECT_EQ(g.patterns[size_t(g.layers[0].pattern)][0].score, cuda::ScoreKind::kGroupToken);
  EXPECT_EQ(g.score_unit, 1);
  EXPECT_EQ(g.list_stride, 501);
}

TEST(RunnerPlan, PerQueryHeadPoliciesSelectPerRowAndCountUnions) {
  const ModelConfig c = shape(6);
  const GpuPolicyPlan t = cuda::plan_gpu_policy(tidal_spec(c, 64, {2, 4}, 2), c, 64, 800);
  EXPECT_EQ(t.row_heads, 8);
  EXPECT_EQ(t.patterns[size_t(t.layers[2].pattern)][1].score, cuda::ScoreKind::kRowToken);
  EXPECT_EQ(t.layers[2].n_sel, 8);  // every query head of both KV heads
  EXPECT_EQ(t.patterns[size_t(t.layers[3].pattern)][0], (KernelHead{ListKind::kUnits, cuda::ScoreKind::kNone, 1, true}));
  EXPECT_TRUE(t.layers[3].union_count);
  EXPECT_FALSE(t.layers[1].union_count);

  const GpuPolicyPlan q = cuda::plan_gpu_policy(quest_spec(c, 128, 16, 2), c, 64, 800);
  EXPECT_TRUE(q.layers[2].page_bound && q.layers[2].union_count);
  EXPECT_FALSE(q.layers[1].page_bound);
  EXPECT_EQ(q.layers[5].n_sel, 8);
  EXPECT_EQ(q.score_unit, 16);
  EXPECT_EQ(q.list_stride, 800 / 16 + 1);
}

TEST(RunnerPlan, OneSupportPredicateNamesTheOption) {
  const ModelConfig c = shape();
  const HeadRoles r = head_roles_from_layers(c, {0});
  EXPECT_EQ(cuda::gpu_unsupported(lychee_spec(c, r, 32, {}), c, 64), "");
  EXPECT_EQ(cuda::gpu_unsupported(lychee_spec(c, r, 1, {}), c, 64), "");
  const std::string block = cuda::gpu_unsupported(lychee_spec(c, r, 48, {}), c, 64);
  EXPECT_NE(block.find("--block-size 48"), std::string::npos) << block;
  EXPECT_NE(block.find("--device cpu"), std::string::npos) << block;
  EXPECT_NE(cuda::gpu_unsupported(lychee_spec(c, r, 8, {}), c, 64), "");
  EXPECT_NE(cuda::gpu_unsupported(lychee_spec(c, r, 128, {}), c, 64), "");  // larger than the page
  EXPECT_EQ(cuda::gpu_unsupported(quest_spec(c, 64, 8, 2), c, 64), "");
  const std::string page = cuda::gpu_unsupported(quest_spec(c, 64, 24, 2), c, 64);
  EXPECT_NE(page.find("--quest-page 24"), std::string::npos) << page;
  const ModelConfig odd = shape(4, 8, 2, 96);
  // The GPU's decode and prefill kernels serve head_dim 64 and 128 only, whatever the policy.
  for (const DecodeSpec& s : {full_spec(odd), duo_spec(odd, head_roles_from_layers(odd, {0}), 4, 8)}) {
    const std::string why = cuda::gpu_unsupported(s, odd, 64);
    EXPECT_NE(why.find("head_dim 64 or 128"), std::string::npos) << why;
    EXPECT_NE(why.find("has 96"), std::string::npos) << why;
  }
  test::expect_error([&] { cuda::plan_gpu_policy(lychee_spec(c, r, 48, {}), c, 64, 100); }, ErrorCode::kUnsupported,
                     "--block-size 48");
}

TEST(RunnerPlan, HeadEntriesAreExactWhereTheHostKnowsThem) {
  const ModelConfig c = shape();
  SelectParams sel;
  sel.budget = 64;
  sel.sink = 20;
  const GpuPolicyPlan g = cuda::plan_gpu_policy(lychee_spec(c, head_roles_from_layers(c, {0}), 16, sel), c, 64, 4000);
  const KernelHead units{ListKind::kUnits, cuda::ScoreKind::kNone, 16, false};
  EXPECT_EQ(cuda::head_entries(g, KernelHead{}, 64, 130), 3);  // pages
  EXPECT_EQ(cuda::head_entries(g, units, 64, 1000), selected_units(sel, 16, 1000));
  const GpuPolicyPlan d = cuda::plan_gpu_policy(duo_spec(c, head_roles_from_layers(c, {0}), 4, 10), c, 64, 4000);
  EXPECT_EQ(cuda::head_entries(d, KernelHead{ListKind::kWindow, cuda::ScoreKind::kNone, 1, false}, 64, 100), 14);
  EXPECT_EQ(cuda::head_entries(d, KernelHead{ListKind::kWindow, cuda::ScoreKind::kNone, 1, false}, 64, 9), 9);
}

// The step planner's shape in these tests: the model's heads, pages of 64, 132 SMs x 2 CTAs.
cuda::PlannerShape planner_shape(const ModelConfig& c) {
  cuda::PlannerShape s;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.page_size = 64;
  s.sm_count = 132;
  s.ctas_per_sm = 2;
  s.max_items = 1056;
  return s;
}

// Plans are rebuilt only when a head's work changes; the plan written equals plan_decode's.
TEST(RunnerPlan, StepPlannerReusesPlansUntilTheWorkChanges) {
  const ModelConfig c = shape();
  const GpuPolicyPlan g = cuda::plan_gpu_policy(lychee_spec(c, head_roles_from_layers(c, {0}), 64, {}), c, 64, 8192);
  const cuda::PlannerShape s = planner_shape(c);
  const cuda::MetaLayout m(64, 4, 130, s.max_items, c.n_heads, c.n_layers + 1);
  std::vector<uint8_t> meta(m.total, 0);
  cuda::StepPlanner planner(s, m);
  const std::vector<int> lens = {700, 5000};
  EXPECT_GT(planner.plan(&g, lens, meta.data()), m.n_items);  // wrote plans
  EXPECT_EQ(planner.replans(), 1);
  int waits = 0;
  EXPECT_EQ(planner.plan(&g, std::vector<int>{701, 5001}, meta.data(), [&] { ++waits; }), 0u);  // same pages
  EXPECT_EQ(waits, 0);  // nothing written: no wait for the last plan upload either
  EXPECT_EQ(planner.replans(), 1);
  // 5000 -> 5121 tokens: 79 -> 81 pages, within the dense horizon (81); 700 -> 705: 11 -> 12 pages.
  EXPECT_EQ(planner.plan(&g, std::vector<int>{700, 5121}, meta.data()), 0u);
  EXPECT_GT(planner.plan(&g, std::vector<int>{705, 5121}, meta.data(), [&] { ++waits; }), m.n_items);  // a new page
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(planner.replans(), 2);
  EXPECT_GT(planner.plan(nullptr, std::vector<int>{705, 5121}, meta.data()), m.n_items);  // dense step
  EXPECT_GT(planner.plan(&g, std::vector<int>{705}, meta.data()), m.n_items);            // membership
  planner.invalidate();
  EXPECT_GT(planner.plan(&g, std::vector<int>{705}, meta.data()), m.n_items);
  EXPECT_EQ(planner.replans(), 5);

  // The dense plan written for two sequences is plan_decode's over dense_decode_heads, each head
  // planned to its horizon (the kernel clips at the device-side length).
  planner.plan(nullptr, std::vector<int>{700, 5000}, meta.data());
  const std::vector<int32_t> lens32 = {700, 5000};
  auto heads = cuda::dense_decode_heads(lens32, c.n_kv_heads, c.group_size(), 64, 130);
  for (auto& h : heads) h.n_entries = cuda::dense_horizon(h.n_entries, 130);
  const cuda::DecodePlan want = cuda::plan_decode(heads, 2, c.n_heads, c.n_kv_heads, 132, 2, 128, s.max_items);
  const auto* n_items = reinterpret_cast<const int32_t*>(meta.data() + m.n_items);
  const auto* items = reinterpret_cast<const cuda::DecodeWorkItem*>(meta.data() + m.items);
  ASSERT_EQ(n_items[0], int32_t(want.items.size()));
  for (size_t i = 0; i < want.items.size(); ++i) {
    EXPECT_EQ(items[i].seq, want.items[i].seq) << i;
    EXPECT_EQ(items[i].kv_head, want.items[i].kv_head) << i;
    EXPECT_EQ(items[i].begin, want.items[i].begin) << i;
    EXPECT_EQ(items[i].end, want.items[i].end) << i;
    EXPECT_EQ(items[i].slot, want.items[i].slot) << i;
  }
}

// Prefill passes: max_tokens each, or power-of-two lengths with a short tail (no padded query
// rows in cuDNN's graph of a pass but the tail's).
TEST(RunnerPlan, PrefillPassesAreWholeChunksOrPowersOfTwo) {
  using V = std::vector<int>;
  EXPECT_EQ(cuda::prefill_pass_sizes(32768, 8192), (V{8192, 8192, 8192, 8192}));
  EXPECT_EQ(cuda::prefill_pass_sizes(32768, 8192, 512), (V{8192, 8192, 8192, 8192}));
  EXPECT_EQ(cuda::prefill_pass_sizes(4670, 8192), (V{4670}));
  EXPECT_EQ(cuda::prefill_pass_sizes(4670, 8192, 512), (V{4096, 512, 62}));
  EXPECT_EQ(cuda::prefill_pass_sizes(12812, 8192, 512), (V{8192, 4096, 512, 12}));
  EXPECT_EQ(cuda::prefill_pass_sizes(4670, 2048), (V{2048, 2048, 574}));
  EXPECT_EQ(cuda::prefill_pass_sizes(300, 8192, 512), (V{300}));
  EXPECT_EQ(cuda::prefill_pass_sizes(512, 8192, 512), (V{512}));
  EXPECT_EQ(cuda::prefill_pass_sizes(513, 8192, 512), (V{512, 1}));
  EXPECT_EQ(cuda::prefill_pass_sizes(200, 96, 16), (V{64, 64, 64, 8}));
  // A max_tokens that is no power of two: the passes are, below it.
  EXPECT_EQ(cuda::prefill_pass_sizes(10000, 3000, 512), (V{2048, 2048, 2048, 2048, 1024, 512, 272}));
  EXPECT_EQ(cuda::prefill_pass_sizes(10000, 3000), (V{3000, 3000, 3000, 1000}));
  EXPECT_TRUE(cuda::prefill_pass_sizes(0, 2048, 512).empty());
  EXPECT_EQ(cuda::prefill_pass_sizes(7, 1, 512), (V{1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(cuda::prefill_pass_sizes(7, 8, 1), (V{4, 2, 1}));
  for (const int tail : {0, 1, 512})
    for (const int n : {1, 511, 513, 2049, 65535, 131072}) {
      const V p = cuda::prefill_pass_sizes(n, 8192, tail);
      EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0), n);
      for (const int x : p) EXPECT_TRUE(x >= 1 && x <= 8192);
    }
  EXPECT_THROW(cuda::prefill_pass_sizes(10, 0), Error);
  EXPECT_THROW(cuda::prefill_pass_sizes(-1, 8), Error);
  EXPECT_THROW(cuda::prefill_pass_sizes(10, 8, -1), Error);
  // A pass's attention parts: the same cut within the pass, or the pass whole.
  EXPECT_EQ(cuda::prefill_attention_parts(4670, 0), (V{4670}));
  EXPECT_EQ(cuda::prefill_attention_parts(4670, 512), (V{4096, 512, 62}));
  EXPECT_EQ(cuda::prefill_attention_parts(8192, 512), (V{8192}));
  EXPECT_EQ(cuda::prefill_attention_parts(200, 16), (V{128, 64, 8}));
  EXPECT_EQ(cuda::prefill_attention_parts(65535, 1).size(), 16u);
  EXPECT_LE(cuda::prefill_attention_parts(65535, 1).size(), size_t(cuda::kMaxAttnParts));
}

// The logits rows hold a decode step's batch and a verification pass (17 rows), and with them
// every verification step GpuRunner::verify takes (verify_step_rows_fit: past the fused decode
// layers' rows in chunks of them, up to these rows).
TEST(RunnerPlan, LogitRowsHoldAVerificationStep) {
  const auto rows = [](int max_batch) {
    cuda::RunnerOptions o;
    o.max_batch = max_batch;
    return cuda::logit_rows(o);
  };
  EXPECT_EQ(rows(1), cuda::kMaxVerifyRows);
  EXPECT_EQ(rows(8), cuda::kMaxVerifyRows);
  EXPECT_EQ(rows(100), 100);
  EXPECT_GE(rows(1), cuda::RunnerOptions{}.fused_decode_max_rows);
  EXPECT_GE(rows(1), cuda::kBf16GemvMaxRows);
}

// verify_step_fits' shape bounds: within the fused decode layers' rows (8) always; past them, a
// verification step (R > 1) with fused_verify_chunks, up to the logits rows and 16 rows a
// sequence; a step of one row per sequence past them, or with the chunks off, or unfused: no.
TEST(RunnerPlan, VerifyStepRowsPastTheFusedRowsWithChunks) {
  cuda::RunnerOptions o;
  o.max_batch = 4;
  const int fr = o.fused_decode_max_rows;
  ASSERT_EQ(fr, 8);
  ASSERT_EQ(cuda::logit_rows(o), 17);
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 1, 8));
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 4, 2));
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 4, 3));   // 12 rows: two chunks
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 2, 5));   // 10
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 1, 16));  // kDecodeMaxVerifyRows
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 4, 4));   // 16
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 1, 17)); // past kDecodeMaxVerifyRows
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 2, 9));  // 18 > 17 logits rows
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 5, 2));  // past max_batch
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 0, 2));
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 1, 0));
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, 0, 1, 2));   // not fused
  o.max_batch = 12;
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 8, 1));
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 9, 1));  // one row a sequence: a plain step's cuBLASLt
  o.fused_verify_chunks = false;                          // the old bound: the fused rows
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, fr, 4, 2));
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 4, 3));
  EXPECT_FALSE(cuda::verify_step_rows_fit(o, fr, 1, 9));
  o.fused_verify_chunks = true;
  EXPECT_TRUE(cuda::verify_step_rows_fit(o, 4, 1, 5));    // fused rows 4 (LYCHEE_FUSED_DECODE_ROWS): chunks of 4
}

// A verification step's plan (rows_per_seq R): dense only; a change of R replans (past one tile
// the items carry position groups), the same R reuses the plan, and the plan written is
// plan_decode's with that R.
TEST(RunnerPlan, StepPlannerPlansVerificationRows) {
  const ModelConfig c = shape();
  const GpuPolicyPlan g = cuda::plan_gpu_policy(lychee_spec(c, head_roles_from_layers(c, {0}), 64, {}), c, 64, 8192);
  const cuda::PlannerShape s = planner_shape(c);
  const cuda::MetaLayout m(64, 4, 130, s.max_items, c.n_heads, c.n_layers + 1);
  std::vector<uint8_t> meta(m.total, 0);
  cuda::StepPlanner planner(s, m);
  const std::vector<int> lens = {705, 5005};
  test::expect_error([&] { planner.plan(&g, lens, meta.data(), {}, false, 5); }, ErrorCode::kInvalidArgument,
                     "dense attention only");
  const int rows = cuda::kDecodeMaxTileRows / c.group_size() + 1;  // past one tile
  EXPECT_GT(planner.plan(nullptr, lens, meta.data()), m.n_items);
  EXPECT_GT(planner.plan(nullptr, lens, meta.data(), {}, false, rows), m.n_items);  // R changed
  EXPECT_EQ(planner.plan(nullptr, lens, meta.data(), {}, false, rows), 0u);
  EXPECT_GT(planner.plan(nullptr, lens, meta.data()), m.n_items);  // back to R = 1
  planner.plan(nullptr, lens, meta.data(), {}, false, rows);
  const std::vector<int32_t> lens32 = {705, 5005};
  auto heads = cuda::dense_decode_heads(lens32, c.n_kv_heads, c.group_size(), 64, 130);
  for (auto& h : heads) h.n_entries = cuda::dense_horizon(h.n_entries, 130);
  const cuda::DecodePlan want = cuda::plan_decode(heads, 2, c.n_heads, c.n_kv_heads, 132, 2, 128, s.max_items, 0, rows);
  const auto* n_items = reinterpret_cast<const int32_t*>(meta.data() + m.n_items);
  const auto* items = reinterpret_cast<const cuda::DecodeWorkItem*>(meta.data() + m.items);
  ASSERT_EQ(n_items[0], int32_t(want.items.size()));
  int with_positions = 0;
  for (size_t i = 0; i < want.items.size(); ++i) {
    EXPECT_EQ(items[i].slot, want.items[i].slot) << i;
    EXPECT_EQ(items[i].pos_begin, want.items[i].pos_begin) << i;
    EXPECT_EQ(items[i].n_pos, want.items[i].n_pos) << i;
    with_positions += items[i].n_pos > 0;
  }
  EXPECT_EQ(with_positions, n_items[0]);  // every item serves a group of positions
}

// Dense heads are planned a little ahead: never fewer pages than they have, never past the row,
// at most 1/32 (+1 page) more, and a growing sequence replans rarely (about 32 times per doubling).
TEST(RunnerPlan, DenseHorizonPlansAheadWithinAFewPercent) {
  int changes = 0, last = 0;
  for (int pages = 1; pages <= 4096; ++pages) {
    const int h = cuda::dense_horizon(pages, 1 << 20);
    ASSERT_GE(h, pages);
    ASSERT_LE(h, pages + (pages + 31) / 32) << pages;
    ASSERT_GE(h, last) << pages;  // monotone: a plan is never shrunk by growth
    if (h != last) ++changes;
    last = h;
  }
  EXPECT_LT(changes, 32 * 13 + 32);  // vs 4096 replans when planning exact page counts
  EXPECT_EQ(cuda::dense_horizon(2000, 2010), 2010);  // capped at the block-table row
  EXPECT_EQ(cuda::dense_horizon(1, 1), 1);
}

}  // namespace
}  // namespace lychee

#else

TEST(RunnerPlan, NeedsTheCudaLayer) {
  GTEST_SKIP() << "built without nvcc: the GPU runner's host-side plan tests (RunnerPlan.*) are not compiled";
}

#endif
