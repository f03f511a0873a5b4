// Tensor parallelism in the GPU runner (shard_weights + GpuRunner over shards; docs/scaling.md).
// On one GPU: a one-rank shard run through NCCL gives the plain runner's very bits (the slicing
// copies every row and column; an all-reduce over one rank changes nothing), eagerly and from
// graphs, and a one-rank shard with its KV heads in another order (what a permutation
// assignment does to a rank) equals the plain runner within bf16 rounding with the same selected
// sets; two ranks sharing the GPU (the all-reduce by a sum kernel) equal one rank. On two GPUs
// (skipped, visibly, below 2): TP = 2 equals TP = 1 within the bf16 logits
// tolerance (kBf16LogitsTol: each rank's partial output is rounded to bf16 before the sum, and
// the sum again, two more roundings of every residual update per layer; measured 1.05e-2 and
// 1.35e-2 after a prefill on the 3-layer tiny checkpoints, whose 96-wide residual averages
// little) on every logit, with the same selected sets and tokens read, for Full and LycheeDecode, on the 8B
// shape cut to 2 layers (random weights, a non-contiguous head split) and on two tiny
// checkpoints whose KV heads divide 2 (Llama 3.1 with RoPE scaling; Qwen3 with q/k norms and tied
// embeddings). Selected sets must be equal, except that two units whose scores are within bf16
// noise of each other may trade places at the selection boundary (counted, at most a tenth of
// the slots; the logits of that row at that step are printed but not bounded, since the row
// read other tokens there, and the bound holds again at the next step).
#include <gtest/gtest.h>

#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "attention/head_roles.h"
#include "attention/policies.h"
#include "attention/tp_assign.h"
#include "cuda/common/nccl_comm.h"
#include "cuda/runner/gpu_runner.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace lychee {
namespace {

using test::rel_error;

using test::device_count;

// A model to shard: a tiny checkpoint, or random weights of a shape (seed 1234).
struct Model {
  std::string name;
  ModelConfig c;
  std::optional<Checkpoint> ck;
  std::shared_ptr<const cuda::GpuWeights> whole() const {
    return ck ? cuda::upload_weights(*ck) : cuda::random_weights(c, 1234);
  }
  cuda::ShardedWeights shards(const cuda::TpPlan& plan) const {
    return cuda::shard_weights(ck ? &*ck : nullptr, c, 1234, GpuWeightFormat::kBf16, {}, plan);
  }
};

Model checkpoint_model(const std::string& name) {
  Model m;
  m.name = name;
  m.ck.emplace(Checkpoint::open(test::golden_dir() + "/models/" + name));
  m.c = m.ck->config();
  return m;
}

Model llama8b_two_layers() {
  Model m;
  m.name = "llama3-8b shape, 2 layers";
  m.c = llama3_8b_shape();
  m.c.n_layers = 2;
  return m;
}

// The plain runner's decode steps take the unfused layers here, as every sharded runner does
// (the fused decode layers need one GPU and no NCCL: RunnerOptions::fused_decode_max_rows), so
// the comparisons below are of the sharding alone.
cuda::RunnerOptions options() {
  cuda::RunnerOptions o;
  o.fused_decode_max_rows = 0;
  o.page_size = 16;
  o.max_batch = 2;
  o.max_context = 1024;
  o.kv_memory_gib = 0.25;
  o.max_prefill_tokens = 128;  // the prompts below take several chunks
  return o;
}

// LycheeDecode on 16-token blocks, 4 blocks per sparse head, roles drawn with a fixed seed.
DecodeSpec lychee_policy(const ModelConfig& c) {
  const HeadRoles roles = seeded_head_roles(c, std::max(c.n_kv_heads, c.n_layers * c.n_kv_heads / 3), 11);
  SelectParams select;
  select.budget = 64;
  return lychee_spec(c, roles, 16, select);
}

// Sets a and b of one slot: equal, or (counted in `swaps`) differing only by units of equal
// number whose scores in a's score row, sorted, pair up within tol = 2% of the row's largest
// unit score (bf16 noise at the selection boundary).
void expect_same_selection(const cuda::GpuRunner::SelectionProbe& a, const cuda::GpuRunner::SelectionProbe& b,
                           int length, const std::string& what, int& swaps) {
  if (a.units == b.units) return;
  std::vector<int32_t> only_a, only_b;
  std::set_difference(a.units.begin(), a.units.end(), b.units.begin(), b.units.end(), std::back_inserter(only_a));
  std::set_difference(b.units.begin(), b.units.end(), a.units.begin(), a.units.end(), std::back_inserter(only_b));
  ASSERT_EQ(only_a.size(), only_b.size()) << what << ": the sets differ in size";
  const int per_unit = a.unit / a.score_unit, n_units = (length + a.unit - 1) / a.unit;
  auto unit_score = [&](int u) {
    float s = -INFINITY;
    for (int e = u * per_unit; e < (u + 1) * per_unit && e < int(a.scores.size()); ++e) s = std::max(s, a.scores[size_t(e)]);
    return s;
  };
  float top = 0.0f;
  for (int u = 0; u < n_units; ++u) top = std::max(top, std::fabs(unit_score(u)));
  std::vector<float> sa, sb;
  for (int u : only_a) sa.push_back(unit_score(u));
  for (int u : only_b) sb.push_back(unit_score(u));
  std::sort(sa.begin(), sa.end());
  std::sort(sb.begin(), sb.end());
  for (size_t i = 0; i < sa.size(); ++i)
    ASSERT_LE(std::fabs(sa[i] - sb[i]), 0.02f * top)
        << what << ": unit scores " << sa[i] << " (only in the reference) and " << sb[i]
        << " (only in the other) are not a near-tie (largest unit score " << top << ")";
  ++swaps;
}

// Decodes the same token streams on `ref` and `other` (other samples greedily on the device and
// feeds itself; ref is given those tokens), comparing logits rows within `tol`, the tokens read
// and every selection slot after every step (0 tol: bit for bit, and sets exactly equal).
void expect_same_run(cuda::GpuRunner& ref, cuda::GpuRunner& other, const DecodeSpec& spec, double tol,
                     const std::string& what) {
  const ModelConfig& c = ref.config();
  ref.set_policy(spec);
  other.set_policy(spec);
  // Prompts of several prefill chunks, within the model's context (the tiny checkpoints have 256).
  const int lens[2] = {std::min(300, c.max_context - 32), std::min(177, c.max_context - 80)};
  std::vector<cuda::GpuSeq> a(2), b(2);
  std::vector<float> la(size_t(c.vocab_size)), lb(size_t(c.vocab_size));
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> ids(static_cast<size_t>(lens[s]));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 131 + size_t(s) * 17 + 5) % size_t(c.vocab_size));
    ref.prefill(a[size_t(s)], ids);
    other.prefill(b[size_t(s)], ids);
    ref.copy_logits(0, la);
    other.copy_logits(0, lb);
    if (tol == 0) ASSERT_EQ(la, lb) << what << ": prefill logits of prompt " << s;
    else ASSERT_LT(rel_error(lb, la), tol) << what << ": prefill logits of prompt " << s;
  }
  cuda::GpuSeq* pa[] = {&a[0], &a[1]};
  cuda::GpuSeq* pb[] = {&b[0], &b[1]};
  std::vector<int32_t> toks = {7, 11};
  (void)ref.take_token_reads();
  (void)other.take_token_reads();
  int swaps = 0, slots = 0;
  std::string errors;  // rel. L2 of the logits, rows 0 and 1 per step
  for (int step = 0; step < 6; ++step) {
    ref.decode(pa, toks);
    if (step == 0) other.decode(pb, toks);
    else other.decode(pb, {});  // the tokens it sampled, fed on the device (rank 0's, copied to the others)
    for (int r = 0; r < 2; ++r) {
      const std::string at = what + ", step " + std::to_string(step) + ", row " + std::to_string(r) + " (length " +
                             std::to_string(a[size_t(r)].length) + ")";
      // The selected sets first: after a near-tie swap the row read other tokens at this step, and
      // its logits differ by what those tokens' values add, not by rounding (the 8B shape, step 4:
      // 7.3e-2 with one swap, back to 1.0e-2 at step 5): they are printed, not bounded.
      const int swaps_before = swaps;
      for (int h = 0; h < c.n_kv_heads && spec.sparse(); ++h) {
        const auto sa = ref.selection(r, h), sb = other.selection(r, h);
        ++slots;
        if (tol == 0) ASSERT_EQ(sa.units, sb.units) << at << ", KV head " << h;
        else expect_same_selection(sa, sb, a[size_t(r)].length, at + ", KV head " + std::to_string(h), swaps);
      }
      ref.copy_logits(r, la);
      other.copy_logits(r, lb);
      if (tol == 0) {
        ASSERT_EQ(la, lb) << at;
      } else {
        const double e = rel_error(lb, la);
        const bool swapped = swaps > swaps_before;
        if (!swapped) {
          EXPECT_LT(e, tol) << at << " (selection swaps so far: " << swaps << ")";
        }
        errors += fmt::format(" {:.1e}{}", e, swapped ? "(swap)" : "");
      }
    }
    EXPECT_EQ(ref.take_token_reads(), other.take_token_reads()) << what << ": tokens read at step " << step;
    other.greedy(2, toks);  // the next tokens: other's own choice, which ref is fed
    std::vector<int32_t> mine(2);
    for (int r = 0; r < 2; ++r) {
      other.copy_logits(r, lb);
      mine[size_t(r)] = int32_t(std::max_element(lb.begin(), lb.end()) - lb.begin());
    }
    EXPECT_EQ(toks, mine) << what << ": rank 0's sampled tokens are not the argmax of its logits";
  }
  if (tol > 0) std::printf("  %s: logits rel. L2 per step (rows 0, 1):%s\n", what.c_str(), errors.c_str());
  if (spec.sparse()) {
    std::printf("  %s: %d selection slots compared, %d with a near-tie swap at the boundary\n", what.c_str(), slots, swaps);
    EXPECT_GT(slots, 0);
    EXPECT_LE(swaps * 10, slots) << what << ": near-tie swaps in more than a tenth of the slots";
  }
  for (auto& s : a) ref.release(s);
  for (auto& s : b) other.release(s);
}

std::vector<int> all_heads(const ModelConfig& c) {
  std::vector<int> h(static_cast<size_t>(c.n_kv_heads));
  std::iota(h.begin(), h.end(), 0);
  return h;
}

TEST(TensorParallel, OneRankThroughNcclIsBitForBitThePlainRunner) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_NCCL_BUILD("the tensor-parallel test");
  const Model m = checkpoint_model("llama31_untied_bf16_sharded");
  for (bool graphs : {false, true}) {
    cuda::RunnerOptions o = options();
    o.cuda_graphs = graphs;
    cuda::GpuRunner plain(m.whole(), o);
    o.nccl = true;
    cuda::GpuRunner one(m.shards({{0}, {all_heads(m.c)}}), o);
    EXPECT_EQ(one.tensor_parallel(), 1);
    for (const DecodeSpec& spec : {full_spec(m.c), lychee_policy(m.c)})
      expect_same_run(plain, one, spec, 0.0, spec.name + (graphs ? " (graphs)" : " (eager)"));
    // Two all-reduces per layer per forward pass, d_model bf16 per token each: per policy, 2
    // prompts of 224 and 176 tokens (the model's 256 less 32 and 80) in chunks of 128 (2 + 2
    // passes) and 6 decode steps of 2 rows.
    ASSERT_EQ(m.c.max_context, 256);
    const uint64_t passes = 2 * (4 + 6), tokens = 2 * (224 + 176 + 6 * 2);
    const cuda::TpStats st = one.tp_stats();
    EXPECT_EQ(st.all_reduces, passes * 2 * uint64_t(m.c.n_layers));
    EXPECT_EQ(st.payload_bytes, tokens * 2 * uint64_t(m.c.n_layers) * uint64_t(m.c.d_model) * 2);
    EXPECT_EQ(st.wire_bytes, 0.0);  // one rank sends nothing
    EXPECT_EQ(st.selection_bytes, 0u);
  }
}

TEST(TensorParallel, OneRankWithItsHeadsPermutedEqualsThePlainRunner) {
  LY_REQUIRE_GPU();
  const Model m = llama8b_two_layers();
  const cuda::RunnerOptions o = options();
  cuda::GpuRunner plain(m.whole(), o);
  std::vector<int> heads = {5, 0, 3, 6, 1, 7, 2, 4};
  cuda::GpuRunner permuted(m.shards({{0}, {heads}}), o);
  for (const DecodeSpec& spec : {full_spec(m.c), lychee_policy(m.c)})
    expect_same_run(plain, permuted, spec, 1e-2, m.name + ", heads permuted, " + spec.name);
}

TEST(TensorParallel, ErrorsNameWhatIsWrong) {
  LY_REQUIRE_GPU();
  const Model m = checkpoint_model("llama31_untied_bf16_sharded");
  test::expect_error([&] { (void)m.shards({{0, 0, 0}, {{0}, {1}, {0}}}); }, ErrorCode::kInvalidArgument,
                     "which 3 does not divide");
  test::expect_error([&] { (void)m.shards({{0, 99}, {{0}, {1}}}); }, ErrorCode::kInvalidArgument,
                     "CUDA device 99 does not exist");
  auto w = m.whole();
  cuda::ShardedWeights wrong = {w, w};  // two copies of a whole model are not two ranks
  test::expect_error([&] { cuda::GpuRunner r(wrong, options()); }, ErrorCode::kInvalidArgument, "holds rank 0 of 1");
}

// Two ranks on one GPU (RunnerOptions::tp_one_device: the all-reduce by a sum kernel with NCCL's
// two-rank rounding, eager steps): the sharded forward (every layer's Q/K/V rows, output
// columns, MLP halves, the rank's part of the policy, rank 0's sampling fed to rank 1, the LM head
// on rank 0 or split by vocabulary) equals one rank, as on two GPUs, without NCCL.
TEST(TensorParallel, TwoRanksOnOneGpuEqualOneRank) {
  LY_REQUIRE_GPU();
  struct Case {
    Model m;
    std::vector<std::vector<int>> heads;
  };
  for (const Case& k : {Case{llama8b_two_layers(), {{0, 3, 5, 6}, {1, 2, 4, 7}}},
                        Case{checkpoint_model("llama31_untied_bf16_sharded"), {{1}, {0}}},
                        Case{checkpoint_model("qwen3_tied_bf16"), {{0}, {1}}}}) {
    cuda::RunnerOptions o = options();
    o.cuda_graphs = false;
    cuda::GpuRunner one(k.m.whole(), o);
    for (bool split : {false, true}) {  // the LM head on rank 0, or split by vocabulary
      cuda::RunnerOptions t = o;
      t.tp_one_device = true;
      t.tp_split_lm_head = split;
      cuda::GpuRunner two(k.m.shards({{0, 0}, k.heads}), t);
      ASSERT_EQ(two.tensor_parallel(), 2);
      for (const DecodeSpec& spec : {full_spec(k.m.c), lychee_policy(k.m.c)})
        expect_same_run(one, two, spec, test::kBf16LogitsTol,
                        k.m.name + ", 2 ranks on one GPU" + (split ? ", LM head split, " : ", ") + spec.name);
      EXPECT_GT(two.tp_stats().all_reduces, 0u);
      EXPECT_EQ(two.tp_stats().lm_gathers > 0, split);
    }
  }
  // Sharing a device is a test mode, and without graphs only.
  const Model m = checkpoint_model("llama31_untied_bf16_sharded");
  test::expect_error([&] { cuda::GpuRunner r(m.shards({{0, 0}, {{0}, {1}}}), options()); }, ErrorCode::kInvalidArgument,
                     "two ranks on one CUDA device");
}

// ---------------------------------------------------------------------------------- two GPUs

#define LY_REQUIRE_TWO_GPUS()                                                                        \
  LY_REQUIRE_GPU();                                                                                  \
  LY_REQUIRE_NCCL_BUILD("the tensor-parallel test");                                                 \
  if (device_count() < 2)                                                                            \
  GTEST_SKIP() << "tensor parallelism over 2 GPUs: this machine has " << device_count()              \
               << " CUDA device(s); the TP=2 equality test did not run"

void two_gpus_equal_one(const Model& m, const std::vector<std::vector<int>>& heads, bool split_lm_head = false) {
  const cuda::RunnerOptions o = options();
  cuda::GpuRunner one(m.whole(), o);
  cuda::RunnerOptions t = o;
  t.tp_split_lm_head = split_lm_head;
  cuda::GpuRunner two(m.shards({{0, 1}, heads}), t);
  ASSERT_EQ(two.tensor_parallel(), 2);
  // The same bytes per GPU hold half the KV heads: twice the pages (each rank's pool the same).
  EXPECT_NEAR(two.n_pages(), 2 * one.n_pages(), 1);
  for (const DecodeSpec& spec : {full_spec(m.c), lychee_policy(m.c)})
    expect_same_run(one, two, spec, test::kBf16LogitsTol, m.name + ", TP=2, " + spec.name);
  const cuda::TpStats st = two.tp_stats();
  EXPECT_EQ(st.ranks, 2);
  EXPECT_GT(st.all_reduces, 0u);
  EXPECT_DOUBLE_EQ(st.wire_bytes, double(st.payload_bytes));  // 2 (N-1)/N = 1 at N = 2
  EXPECT_EQ(st.selection_bytes, 0u);
}

TEST(TensorParallel, TwoGpusEqualOneOnThe8bShape) {
  LY_REQUIRE_TWO_GPUS();
  two_gpus_equal_one(llama8b_two_layers(), {{0, 3, 5, 6}, {1, 2, 4, 7}});
  two_gpus_equal_one(llama8b_two_layers(), {{0, 3, 5, 6}, {1, 2, 4, 7}}, /*split_lm_head=*/true);
}

TEST(TensorParallel, TwoGpusEqualOneOnTinyCheckpoints) {
  LY_REQUIRE_TWO_GPUS();
  two_gpus_equal_one(checkpoint_model("llama31_untied_bf16_sharded"), {{1}, {0}});
  two_gpus_equal_one(checkpoint_model("qwen3_tied_bf16"), {{0}, {1}});
}

TEST(TensorParallel, TwoGpusWithTheBalancedAssignment) {
  LY_REQUIRE_TWO_GPUS();
  const Model m = llama8b_two_layers();
  const HeadRoles roles = seeded_head_roles(m.c, std::max(m.c.n_kv_heads, m.c.n_layers * m.c.n_kv_heads / 3), 11);
  const TpAssignment a = tp_assign(m.c, roles, 2);
  two_gpus_equal_one(m, tp_rank_heads(a));
}

}  // namespace
}  // namespace lychee

#else

TEST(TensorParallel, NotBuilt) { LY_CUDA_NOT_BUILT("the tensor-parallel runner tests"); }

#endif  // LYCHEE_HAS_CUDA
