// Decode attention: the CUDA kernels against the double-precision reference of
// attention_reference.h over the same bf16 inputs (random data, shuffled block tables, awkward
// lengths, every group size and head dim, with and without splits, idle CTAs, poisoned outputs,
// empty splits, CUDA graph capture), and under programmatic dependent launch behind a slow kernel
// that writes q and the appended token's K/V (the loads before griddepcontrol.wait). The planner
// and the argument checks, which need no GPU, are in test_cuda_host_only.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "core/dtype.h"
#include "core/error.h"
#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include <cstdlib>

#include "cuda/kernels/decode_attention.h"
#include "cuda/common/device_buffer.h"
#include "pdl_probe.h"

namespace lychee {
namespace {

using test::to_device;
using test::to_device_bf16_bits;

using cuda::DecodeHeadWork;
using cuda::DecodePlan;
using cuda::DecodeWorkItem;

// ------------------------------------------------------------------------------ kernels

// A paged decode problem: random bf16 q, K, V; block tables of shuffled page ids (unused entries -1).
struct Problem {
  int batch = 0, n_kv_heads = 2, group = 4, head_dim = 128, page_size = 64, max_pages = 0, n_pool_pages = 0;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> block_table;  // [batch][max_pages]
  std::vector<uint16_t> q;           // [batch][n_heads][head_dim] bf16 bits
  std::vector<uint16_t> k, v;        // [n_pool_pages][n_kv_heads][page_size][head_dim] bf16 bits
  int n_heads() const { return n_kv_heads * group; }
  float scale() const { return 1.0f / std::sqrt(float(head_dim)); }
};

Problem make_problem(std::vector<int32_t> lens, int n_kv_heads, int group, int head_dim, int page_size,
                     uint32_t seed) {
  Problem p;
  p.batch = int(lens.size());
  p.n_kv_heads = n_kv_heads;
  p.group = group;
  p.head_dim = head_dim;
  p.page_size = page_size;
  p.seq_lens = std::move(lens);
  int used = 0;
  for (int32_t len : p.seq_lens) {
    const int n = (len + page_size - 1) / page_size;
    p.max_pages = std::max(p.max_pages, n + 1);
    used += n;
  }
  p.n_pool_pages = used + 5;  // spare pages nobody owns
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(size_t(p.n_pool_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.block_table.assign(size_t(p.batch) * p.max_pages, -1);
  size_t next = 0;
  for (int s = 0; s < p.batch; ++s)
    for (int i = 0; i < (p.seq_lens[s] + page_size - 1) / page_size; ++i) p.block_table[size_t(s) * p.max_pages + i] = ids[next++];
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t>& x, size_t n, float sigma) {
    x.resize(n);
    for (auto& e : x) e = f32_to_bf16(sigma * normal(rng));
  };
  // q scaled up so that the softmax is peaked (logits spread over several units).
  fill(p.q, size_t(p.batch) * p.n_heads() * head_dim, 3.0f);
  const size_t pool = size_t(p.n_pool_pages) * n_kv_heads * page_size * head_dim;
  fill(p.k, pool, 1.0f);
  fill(p.v, pool, 1.0f);
  return p;
}

// Every head over its whole sequence, in double ([batch][n_heads][head_dim]).
std::vector<double> reference(const Problem& p) {
  const int d = p.head_dim;
  std::vector<double> out(size_t(p.batch) * p.n_heads() * d, 0.0);
  for (int s = 0; s < p.batch; ++s) {
    const test::PagedSeqKv kv{p.k.data(), p.v.data(), &p.block_table[size_t(s) * p.max_pages], p.n_kv_heads,
                              p.page_size, d};
    for (int h = 0; h < p.n_heads(); ++h) {
      const size_t row = (size_t(s) * p.n_heads() + h) * d;
      const std::vector<double> o =
          test::paged_attention_reference(&p.q[row], kv, h / p.group, p.seq_lens[s], double(p.scale()));
      std::copy(o.begin(), o.end(), out.begin() + long(row));
    }
  }
  return out;
}

// Device copies of a problem and the buffers of one launch.
struct DeviceProblem {
  cuda::DeviceBuffer<cuda::bf16> q, k, v, out;
  cuda::DeviceBuffer<int32_t> table, lens, n_items, merge_begin, merge_count;
  cuda::DeviceBuffer<DecodeWorkItem> items;
  cuda::DeviceBuffer<float> partial_o, partial_lse;
  cuda::DecodeAttentionArgs args{};
};

// Uploads the problem and the plan; the grid has `extra_ctas` idle CTAs past the plan's items,
// whose items are garbage that must never be read.
void setup(DeviceProblem& dp, const Problem& p, const DecodePlan& plan, int extra_ctas) {
  dp.q = to_device_bf16_bits(p.q);
  dp.k = to_device_bf16_bits(p.k);
  dp.v = to_device_bf16_bits(p.v);
  dp.table = to_device(p.block_table);
  dp.lens = to_device(p.seq_lens);
  std::vector<DecodeWorkItem> items = plan.items;
  for (int i = 0; i < extra_ctas; ++i) {
    DecodeWorkItem junk{987654, -5, -1, -7, 1000000, 2000000, 123456};
    junk.unit = 3;
    junk.n_rows = 100;
    items.push_back(junk);
  }
  dp.items = to_device(items);
  dp.n_items = to_device(std::vector<int32_t>{int32_t(plan.items.size())});
  dp.merge_begin = to_device(plan.merge_begin);
  dp.merge_count = to_device(plan.merge_count);
  const size_t max_slots = std::max<size_t>(items.size(), 1);
  dp.partial_o = cuda::DeviceBuffer<float>(max_slots * p.group * p.head_dim);
  dp.partial_lse = cuda::DeviceBuffer<float>(max_slots * p.group);
  dp.out = cuda::DeviceBuffer<cuda::bf16>(size_t(p.batch) * p.n_heads() * p.head_dim);

  cuda::DecodeAttentionArgs& a = dp.args;
  a.q = dp.q.data();
  a.k_pool = dp.k.data();
  a.v_pool = dp.v.data();
  a.block_table = dp.table.data();
  a.max_pages = p.max_pages;
  a.seq_lens = dp.lens.data();
  a.items = dp.items.data();
  a.n_items = dp.n_items.data();
  a.merge_begin = dp.merge_begin.data();
  a.merge_count = dp.merge_count.data();
  a.partial_o = dp.partial_o.data();
  a.partial_lse = dp.partial_lse.data();
  a.out = dp.out.data();
  a.batch = p.batch;
  a.n_heads = p.n_heads();
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.page_size = p.page_size;
  a.max_items = int(items.size());
  a.scale = p.scale();
}

// Poisons the outputs and partials with NaN (0xFF bytes), runs once, returns out as float.
std::vector<float> run(DeviceProblem& dp, cudaStream_t stream = nullptr) {
  LY_CUDA_CHECK(cudaMemset(dp.out.data(), 0xFF, dp.out.bytes()));
  LY_CUDA_CHECK(cudaMemset(dp.partial_o.data(), 0xFF, dp.partial_o.bytes()));
  LY_CUDA_CHECK(cudaMemset(dp.partial_lse.data(), 0xFF, dp.partial_lse.bytes()));
  cuda::decode_attention(dp.args, stream);
  LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  return test::to_host_bf16(dp.out);
}

// ||out - ref|| / ||ref|| <= 1e-2, every element written (finite); the worst element on failure.
void expect_close(const std::vector<float>& out, const std::vector<double>& ref, const Problem& p) {
  ASSERT_EQ(out.size(), ref.size());
  double err2 = 0.0, ref2 = 0.0, worst = -1.0;
  size_t worst_i = 0, n_bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      if (n_bad++ == 0) ADD_FAILURE() << "out[" << i << "] = " << out[i] << " (not written, or NaN)";
      continue;
    }
    const double e = std::fabs(double(out[i]) - ref[i]);
    err2 += e * e;
    ref2 += ref[i] * ref[i];
    if (e > worst) worst = e, worst_i = i;
  }
  EXPECT_EQ(n_bad, 0u) << "non-finite outputs";
  const size_t row = worst_i / p.head_dim;
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-300));
  EXPECT_LE(rel, 1e-2) << "max abs error " << worst << " at index " << worst_i << " (seq " << row / p.n_heads()
                       << ", head " << row % p.n_heads() << ", dim " << worst_i % p.head_dim << "): got "
                       << out[worst_i] << ", want " << ref[worst_i];
}

enum class SplitMode { kNone, kAll, kMixed };
const std::vector<int32_t> kAwkwardLengths = {1, 3, 63, 64, 65, 1000, 4097};

// The plan for a mode: kNone (one item per head, all written directly), kAll (the whole machine:
// every long head split), kMixed (a few CTAs: some heads split, some direct).
DecodePlan plan_for(const Problem& p, SplitMode mode) {
  const auto heads = cuda::dense_decode_heads(p.seq_lens, p.n_kv_heads, p.group, p.page_size, p.max_pages);
  const int n_work = int(heads.size()), ps = p.page_size, nh = p.n_heads();
  switch (mode) {
    case SplitMode::kNone: return cuda::plan_decode(heads, p.batch, nh, p.n_kv_heads, 1, 1, 1 << 30, n_work);
    case SplitMode::kAll: return cuda::plan_decode(heads, p.batch, nh, p.n_kv_heads, 132, 2, ps, 4096);
    case SplitMode::kMixed: return cuda::plan_decode(heads, p.batch, nh, p.n_kv_heads, n_work + 6, 1, 2 * ps, 4096);
  }
  return {};
}

using KernelCase = std::tuple<int /*head_dim*/, int /*page_size*/, int /*group*/, SplitMode>;
class DecodeAttentionKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(DecodeAttentionKernel, MatchesTheReference) {
  LY_REQUIRE_GPU();
  const auto [d, ps, group, mode] = GetParam();
  const Problem p = make_problem(kAwkwardLengths, 2, group, d, ps, 17u * d + 5u * ps + group + 100u * int(mode));
  const DecodePlan plan = plan_for(p, mode);
  if (mode == SplitMode::kNone) {
    ASSERT_EQ(plan.n_slots, 0);
  } else {
    ASSERT_GT(plan.n_slots, 0);
  }
  DeviceProblem dp;
  setup(dp, p, plan, 37);
  const std::vector<float> out = run(dp);
  expect_close(out, reference(p), p);
  // Same inputs, same bits: a moving result would be a race.
  const std::vector<float> again = run(dp);
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0) << "results differ between runs";
}

std::string case_name(const ::testing::TestParamInfo<KernelCase>& info) {
  const auto [d, ps, group, mode] = info.param;
  const char* m = mode == SplitMode::kNone ? "whole" : mode == SplitMode::kAll ? "split" : "mixed";
  return "d" + std::to_string(d) + "_page" + std::to_string(ps) + "_group" + std::to_string(group) + "_" + m;
}

INSTANTIATE_TEST_SUITE_P(Grid, DecodeAttentionKernel,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(16, 64),
                                            ::testing::Values(1, 3, 4, 8),
                                            ::testing::Values(SplitMode::kNone, SplitMode::kAll, SplitMode::kMixed)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(OtherPageSizes, DecodeAttentionKernel,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(32, 128), ::testing::Values(4),
                                            ::testing::Values(SplitMode::kNone, SplitMode::kAll)),
                         case_name);

TEST(DecodeAttentionKernelExtra, LlamaShapeWithALongSequence) {
  LY_REQUIRE_GPU();
  // 32 query / 8 KV heads, d = 128, page 64, one long and two short sequences, whole machine.
  const Problem p = make_problem({20000, 129, 7}, 8, 4, 128, 64, 99);
  const auto heads = cuda::dense_decode_heads(p.seq_lens, p.n_kv_heads, p.group, p.page_size, p.max_pages);
  const DecodePlan plan = cuda::plan_decode(heads, p.batch, p.n_heads(), p.n_kv_heads, cuda::device_info().sm_count,
                                            cuda::decode_attention_ctas_per_sm(128, 64), 128, 1024);
  DeviceProblem dp;
  setup(dp, p, plan, 0);
  expect_close(run(dp), reference(p), p);
}

TEST(DecodeAttentionKernelExtra, EmptySplitsMergeWithoutNaN) {
  LY_REQUIRE_GPU();
  // A hand-made plan with items past the sequence's end (lse = -inf): seq 0 (100 tokens, page 64)
  // kv head 0 is cut into [0,1) [1,2) and an empty [2,3); kv head 1's only slot is empty, so its
  // output must be exactly 0. Sequence 1 is written directly.
  Problem p = make_problem({100, 70}, 2, 4, 128, 64, 7);
  ASSERT_GE(p.max_pages, 3);
  DecodePlan plan;
  auto item = [](int seq, int kv, int begin, int end, int slot) {
    DecodeWorkItem it{seq, kv, 0, 0, begin, end, slot};
    it.unit = 64;
    it.row_begin = 0;
    it.n_rows = 4;
    it.kind = cuda::ListKind::kDense;
    it.score = cuda::ScoreKind::kNone;
    return it;
  };
  plan.items = {item(0, 0, 0, 1, 0), item(0, 0, 1, 2, 1), item(0, 0, 2, 3, 2), item(0, 1, 2, 3, 3),
                item(1, 0, 0, 2, -1), item(1, 1, 0, 2, -1)};
  plan.merge_begin.assign(16, 0);
  plan.merge_count.assign(16, 0);
  for (int r = 0; r < 4; ++r) {
    plan.merge_count[size_t(r)] = 3;      // seq 0, kv head 0's rows
    plan.merge_begin[size_t(4 + r)] = 3;  // seq 0, kv head 1's rows: one empty slot
    plan.merge_count[size_t(4 + r)] = 1;
  }
  plan.n_slots = 4;
  DeviceProblem dp;
  setup(dp, p, plan, 3);
  const std::vector<float> out = run(dp);
  std::vector<double> ref = reference(p);
  const int d = p.head_dim;
  for (int h = p.group; h < 2 * p.group; ++h)  // seq 0, kv head 1
    for (int i = 0; i < d; ++i) {
      ASSERT_EQ(out[size_t(h) * d + i], 0.0f) << "head " << h << " dim " << i;
      ref[size_t(h) * d + i] = 0.0;
    }
  expect_close(out, ref, p);
}

TEST(DecodeAttentionKernelExtra, ReplaysFromACudaGraph) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(kAwkwardLengths, 2, 4, 128, 64, 3);
  const DecodePlan plan = plan_for(p, SplitMode::kAll);
  DeviceProblem dp;
  setup(dp, p, plan, 5);
  run(dp);  // outside capture first: the first launch of a variant configures its kernel
  cudaStream_t stream;
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::decode_attention(dp.args, stream);
  LY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LY_CUDA_CHECK(cudaMemset(dp.out.data(), 0xFF, dp.out.bytes()));
  for (int i = 0; i < 3; ++i) LY_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_close(test::to_host_bf16(dp.out), reference(p), p);
  LY_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LY_CUDA_CHECK(cudaGraphDestroy(graph));
  LY_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------ under programmatic dependent launch

// The attention kernel copies its first item's K/V tiles in before griddepcontrol.wait, all but
// the tile holding the sequence's last token, because only the kernel before it writes anything it
// reads: q and the K/V of the token the step appended (run_item in decode_attention.cu). Here that
// kernel is slow: it lets the attention launch at once, spins kPdlDelayNs, and only then writes q
// and the appended rows, which until then hold NaN. A load of them before the wait reads NaN on
// every run (the probe test shows the window is there), and NaN reaches the output whatever the
// softmax weights are: the result must still equal the reference.
constexpr uint64_t kPdlDelayNs = 2'000'000;  // 2 ms: thousands of times a CTA's time to its wait

// LYCHEE_NO_PDL=1 launches every kernel plainly (cuda/common/launch.cuh): nothing can race.
#define LY_REQUIRE_PDL()                                                                             \
  if (std::getenv("LYCHEE_NO_PDL") != nullptr)                                                       \
  GTEST_SKIP() << "LYCHEE_NO_PDL is set: kernels launch without PDL, no pre-wait load to test"

// How many elements of a and b differ (sizes must match).
template <typename T>
size_t n_differ(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i];
  return n;
}

// The harness itself: a probe launched with PDL behind the slow producer reads the old contents
// before its wait and the producer's after it (so the kernels tested below do start while the
// producer still spins), and the kernel behind the probe starts only once the producer is done.
TEST(DecodeAttentionUnderPdl, TheSlowProducerIsStillWritingWhenTheNextKernelStarts) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_PDL();
  constexpr uint32_t kWords = 1024;
  std::vector<uint32_t> pattern(kWords);
  for (uint32_t i = 0; i < kWords; ++i) pattern[i] = 0x01000193u * (i + 1);
  const cuda::DeviceBuffer<uint32_t> src = to_device(pattern);
  cuda::DeviceBuffer<uint32_t> data(kWords), before(kWords), after(kWords), second_before(kWords), second_after(kWords);
  const cuda::DeviceBuffer<test::CopyRange> range =
      to_device(std::vector<test::CopyRange>{{data.data(), src.data(), kWords * 4}});
  for (int rep = 0; rep < 2; ++rep) {  // the first also loads the kernels' modules
    LY_CUDA_CHECK(cudaMemset(data.data(), 0, data.bytes()));
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    test::launch_slow_producer(range.data(), 1, kPdlDelayNs, nullptr);
    test::launch_pdl_probe(data.data(), before.data(), after.data(), kWords * 4, nullptr);
    test::launch_pdl_probe(data.data(), second_before.data(), second_after.data(), kWords * 4, nullptr);
    LY_CUDA_CHECK(cudaDeviceSynchronize());
  }
  EXPECT_EQ(n_differ(test::to_host(before), std::vector<uint32_t>(kWords, 0u)), 0u)
      << "words of the producer's data the probe read before its wait: it did not start while the producer spun";
  EXPECT_EQ(n_differ(test::to_host(after), pattern), 0u) << "the probe's wait did not wait for the producer";
  EXPECT_EQ(n_differ(test::to_host(second_before), pattern), 0u)
      << "the second probe started before the producer ended";
  EXPECT_EQ(n_differ(test::to_host(second_after), pattern), 0u);
}

// The element offsets of the K/V rows of every sequence's last token, one per (sequence, KV head).
std::vector<size_t> appended_rows(const Problem& p) {
  std::vector<size_t> rows;
  for (int s = 0; s < p.batch; ++s) {
    const int pos = p.seq_lens[size_t(s)] - 1;
    const int page = p.block_table[size_t(s) * p.max_pages + pos / p.page_size];
    for (int h = 0; h < p.n_kv_heads; ++h)
      rows.push_back(((size_t(page) * p.n_kv_heads + h) * p.page_size + pos % p.page_size) * p.head_dim);
  }
  return rows;
}

// One decode step's attention (and merge, where the plan splits) behind the slow producer of q and
// the appended K/V rows; then a probe behind the attention (and merge) that reads q before its
// wait: the attention lets the kernel after it launch only past its own wait, so the probe must
// see the producer's q (what the GEMVs' and the next layer's pre-wait loads rest on).
void expect_step_behind_a_slow_producer(const Problem& p, const DecodePlan& plan, int extra_ctas) {
  DeviceProblem dp;
  setup(dp, p, plan, extra_ctas);
  // Outside the race first: the first launch of a kernel loads it (lazy module loading) and a
  // variant configures its shared memory, neither of which should sit between producer and consumer.
  run(dp);
  test::launch_slow_producer(nullptr, 0, 0, nullptr);
  test::launch_pdl_probe(dp.q.data(), dp.out.data(), dp.out.data(), 0, nullptr);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> want = reference(p);
  const cuda::DeviceBuffer<cuda::bf16> q = to_device_bf16_bits(p.q), k = to_device_bf16_bits(p.k),
                                       v = to_device_bf16_bits(p.v);
  const uint32_t row_bytes = uint32_t(p.head_dim) * 2;
  std::vector<test::CopyRange> ranges = {{dp.q.data(), q.data(), uint32_t(dp.q.bytes())}};
  for (const size_t at : appended_rows(p)) {
    ranges.push_back({dp.k.data() + at, k.data() + at, row_bytes});
    ranges.push_back({dp.v.data() + at, v.data() + at, row_bytes});
  }
  const cuda::DeviceBuffer<test::CopyRange> d_ranges = to_device(ranges);
  const uint32_t q_bytes = uint32_t(dp.q.bytes());
  cuda::DeviceBuffer<uint8_t> probe_before(q_bytes), probe_after(q_bytes);
  for (int rep = 0; rep < 2; ++rep) {
    LY_CUDA_CHECK(cudaMemset(dp.out.data(), 0xFF, dp.out.bytes()));
    LY_CUDA_CHECK(cudaMemset(dp.partial_o.data(), 0xFF, dp.partial_o.bytes()));
    LY_CUDA_CHECK(cudaMemset(dp.partial_lse.data(), 0xFF, dp.partial_lse.bytes()));
    LY_CUDA_CHECK(cudaMemset(dp.q.data(), 0xFF, dp.q.bytes()));  // bf16 0xFFFF: NaN
    for (const test::CopyRange& r : ranges)
      if (r.dst != dp.q.data()) LY_CUDA_CHECK(cudaMemset(r.dst, 0xFF, r.bytes));
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    test::launch_slow_producer(d_ranges.data(), int(ranges.size()), kPdlDelayNs, nullptr);
    cuda::decode_attention(dp.args, nullptr);
    test::launch_pdl_probe(dp.q.data(), probe_before.data(), probe_after.data(), q_bytes, nullptr);
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    SCOPED_TRACE("run " + std::to_string(rep) + " behind the slow producer");
    expect_close(test::to_host_bf16(dp.out), want, p);
    EXPECT_EQ(n_differ(test::to_host(probe_before), test::to_host(probe_after)), 0u)
        << "bytes of q the kernel after the attention read before its wait were not the producer's: it started "
           "before the producer ended";
  }
}

TEST(DecodeAttentionUnderPdl, AppendedTokenWrittenSlowlyBeforeTheStep) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_PDL();
  for (const auto& [d, ps, group] : {std::tuple{128, 64, 4}, std::tuple{64, 16, 8}, std::tuple{128, 16, 1}})
    for (const SplitMode mode : {SplitMode::kNone, SplitMode::kAll, SplitMode::kMixed}) {
      SCOPED_TRACE("d " + std::to_string(d) + ", page " + std::to_string(ps) + ", group " + std::to_string(group) +
                   ", mode " + std::to_string(int(mode)));
      const Problem p = make_problem(kAwkwardLengths, 2, group, d, ps, 31u * d + 7u * ps + group + 100u * int(mode));
      expect_step_behind_a_slow_producer(p, plan_for(p, mode), 9);
    }
}

// A long sequence over the whole machine (every CTA's first item is pre-loaded, the last token's
// tile in one of them), the Llama-3-8B head layout.
TEST(DecodeAttentionUnderPdl, LlamaShapeWithALongSequenceBehindASlowProducer) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_PDL();
  const Problem p = make_problem({20000, 129, 7}, 8, 4, 128, 64, 5);
  const auto heads = cuda::dense_decode_heads(p.seq_lens, p.n_kv_heads, p.group, p.page_size, p.max_pages);
  const DecodePlan plan = cuda::plan_decode(heads, p.batch, p.n_heads(), p.n_kv_heads, cuda::device_info().sm_count,
                                            cuda::decode_attention_ctas_per_sm(128, 64), 128, 1024);
  expect_step_behind_a_slow_producer(p, plan, 0);
}

}  // namespace
}  // namespace lychee

#else
TEST(DecodeAttentionKernel, NotBuilt) { LY_CUDA_NOT_BUILT("the decode attention kernel tests"); }
#endif  // LYCHEE_HAS_CUDA
