// Decode attention: the split planner by its invariants (no GPU needed: every page of every head
// covered once, slots contiguous per head, balanced splits, at most max_items items), the argument
// checks, and the CUDA kernels against a double-precision CPU reference over the same bf16 inputs
// (random data, shuffled block tables, awkward lengths, every group size and head dim, with and
// without splits, idle CTAs, poisoned outputs, empty splits, CUDA graph capture).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

#ifdef LYCHEE_HAS_CUDA
#include "cuda/kernels/decode_attention.h"
#include "cuda/common/device_buffer.h"

namespace lychee {
namespace {

using cuda::DecodeHeadWork;
using cuda::DecodePlan;
using cuda::DecodeWorkItem;

// ------------------------------------------------------------------------------ planner

// Every invariant the kernels rely on, plus balance. `min_pages` is the planner's argument.
void check_plan(const DecodePlan& plan, const std::vector<DecodeHeadWork>& heads, int batch, int n_kv_heads,
                int min_pages, int max_items) {
  ASSERT_LE(int(plan.items.size()), max_items);
  const int group = 4;  // the planner tests use groups of 4 query heads, all served by each head work
  const int n_heads = n_kv_heads * group;
  ASSERT_EQ(plan.merge_begin.size(), size_t(batch) * n_heads);
  ASSERT_EQ(plan.merge_count.size(), size_t(batch) * n_heads);
  std::vector<int> head_of(size_t(batch) * n_kv_heads, -1);
  for (size_t h = 0; h < heads.size(); ++h) head_of[size_t(heads[h].seq) * n_kv_heads + heads[h].kv_head] = int(h);

  std::vector<std::vector<int>> covered(heads.size());
  std::vector<std::vector<int>> slots(heads.size());
  std::vector<int> slot_uses(size_t(plan.n_slots), 0);
  for (size_t h = 0; h < heads.size(); ++h) covered[h].assign(size_t(heads[h].n_entries), 0);
  for (const DecodeWorkItem& it : plan.items) {
    ASSERT_TRUE(it.seq >= 0 && it.seq < batch && it.kv_head >= 0 && it.kv_head < n_kv_heads);
    const int h = head_of[size_t(it.seq) * n_kv_heads + it.kv_head];
    ASSERT_GE(h, 0) << "item for a head that was not asked for";
    EXPECT_EQ(it.list, heads[h].list);
    EXPECT_EQ(it.unit, heads[h].unit);
    ASSERT_LT(it.begin, it.end) << "empty item";
    ASSERT_GE(it.begin, 0);
    ASSERT_LE(it.end, heads[h].n_entries);
    for (int p = it.begin; p < it.end; ++p) ++covered[h][p];
    if (it.slot >= 0) {
      ASSERT_LT(it.slot, plan.n_slots);
      ++slot_uses[it.slot];
    }
    slots[h].push_back(it.slot);
  }
  int sum_counts = 0;
  for (size_t h = 0; h < heads.size(); ++h) {
    for (int p = 0; p < heads[h].n_entries; ++p) ASSERT_EQ(covered[h][p], 1) << "head " << h << " page " << p;
    const size_t m = size_t(heads[h].seq) * n_heads + size_t(heads[h].kv_head) * group;
    if (slots[h].size() <= 1) {
      EXPECT_EQ(plan.merge_count[m], 0);
      if (!slots[h].empty()) {
        EXPECT_EQ(slots[h][0], -1) << "an only item writes out directly";
      }
      continue;
    }
    for (int r = 0; r < group; ++r) {
      EXPECT_EQ(plan.merge_count[m + r], int(slots[h].size()));
      EXPECT_EQ(plan.merge_begin[m + r], plan.merge_begin[m]);
    }
    std::sort(slots[h].begin(), slots[h].end());
    for (size_t i = 0; i < slots[h].size(); ++i) EXPECT_EQ(slots[h][i], plan.merge_begin[m] + int(i)) << "slots of head " << h;
    sum_counts += int(slots[h].size());
  }
  EXPECT_EQ(sum_counts, plan.n_slots);
  for (int u : slot_uses) EXPECT_EQ(u, 1);

  // Balance: split items are at least min_pages long and within a factor 2 of each other.
  int lo = INT32_MAX, hi = 0;
  for (const DecodeWorkItem& it : plan.items) {
    if (it.slot < 0) continue;
    const int len = it.end - it.begin;
    EXPECT_GE(len, min_pages);
    lo = std::min(lo, len);
    hi = std::max(hi, len);
  }
  if (hi > 0) {
    EXPECT_LE(hi, 2 * lo) << "split lengths " << lo << ".." << hi;
  }
  // Longest first.
  for (size_t i = 1; i < plan.items.size(); ++i)
    EXPECT_GE(plan.items[i - 1].end - plan.items[i - 1].begin, plan.items[i].end - plan.items[i].begin);
}

TEST(DecodePlan, OneLongSequenceSpreadsEvenlyOverTheMachine) {
  // Batch 1, 128K tokens, 8 KV heads, page 64: 8 x 2048 pages over 132 SMs x 2 CTAs.
  const std::vector<int32_t> lens = {131072};
  const auto heads = cuda::dense_decode_heads(lens, 8, 4, 64, 2048);
  const DecodePlan plan = cuda::plan_decode(heads, 1, 4 * (8), 8, 132, 2, 64 * (2), 1024);
  check_plan(plan, heads, 1, 8, 2, 1024);
  EXPECT_EQ(plan.items.size(), 264u);  // 33 splits per head of 62 or 63 pages
  for (const DecodeWorkItem& it : plan.items) {
    EXPECT_GE(it.end - it.begin, 62);
    EXPECT_LE(it.end - it.begin, 63);
  }
  EXPECT_EQ(plan.n_slots, 264);
}

TEST(DecodePlan, ManyHeadsAreNotSplit) {
  // 64 sequences x 8 KV heads = 512 heads > 264 CTAs: one item per head, all written directly.
  const std::vector<int32_t> lens(64, 4000);
  const auto heads = cuda::dense_decode_heads(lens, 8, 4, 64, 64);
  const DecodePlan plan = cuda::plan_decode(heads, 64, 4 * (8), 8, 132, 2, 64 * (2), 1024);
  check_plan(plan, heads, 64, 8, 2, 1024);
  EXPECT_EQ(plan.items.size(), 512u);
  EXPECT_EQ(plan.n_slots, 0);
}

TEST(DecodePlan, MinPagesPerSplitLimitsTheSplits) {
  const std::vector<int32_t> lens = {64 * 10};
  const auto heads = cuda::dense_decode_heads(lens, 2, 4, 64, 16);
  const DecodePlan plan = cuda::plan_decode(heads, 1, 4 * (2), 2, 132, 2, 64 * (4), 1024);
  check_plan(plan, heads, 1, 2, 4, 1024);
  EXPECT_EQ(plan.items.size(), 4u);  // 10 pages -> 2 splits of 5 (3 splits would be shorter than 4)
  const DecodePlan whole = cuda::plan_decode(heads, 1, 4 * (2), 2, 132, 2, 64 * (10), 1024);
  EXPECT_EQ(whole.items.size(), 2u);
  EXPECT_EQ(whole.n_slots, 0);
}

TEST(DecodePlan, MixedLengthsKeepTheLongestSplitShort) {
  // One long and many short sequences: the long one is cut, the short ones stay whole.
  std::vector<int32_t> lens(31, 100);
  lens.push_back(64 * 1000);
  const auto heads = cuda::dense_decode_heads(lens, 4, 4, 64, 1000);
  const DecodePlan plan = cuda::plan_decode(heads, 32, 4 * (4), 4, 132, 2, 64 * (1), 264);
  check_plan(plan, heads, 32, 4, 1, 264);
  int longest = 0;
  for (const DecodeWorkItem& it : plan.items) longest = std::max(longest, it.end - it.begin);
  // 4 x 1000 + 124 x 2 pages over 264 CTAs: about 31 pages each when perfectly spread.
  EXPECT_LE(longest, 32);
}

TEST(DecodePlan, RandomWorkloadsAreCoveredOnceAndBalanced) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + int(rng() % 12), n_kv = 1 + int(rng() % 8);
    const int sm_count = 1 + int(rng() % 140), ctas = 1 + int(rng() % 3), min_pages = 1 + int(rng() % 6);
    std::vector<DecodeHeadWork> heads;
    int n_with_pages = 0;
    for (int s = 0; s < batch; ++s)
      for (int h = 0; h < n_kv; ++h) {
        if (rng() % 7 == 0) continue;  // heads that are not asked for
        const int n_pages = (rng() % 5 == 0) ? 0 : 1 + int(rng() % (rng() % 2 ? 40 : 3000));
        n_with_pages += n_pages > 0;
        cuda::DecodeHeadWork w;
        w.seq = s;
        w.kv_head = h;
        w.n_entries = n_pages;
        w.unit = 64;
        w.n_rows = 4;
        w.list = s * 4096 + h;
        heads.push_back(w);
      }
    std::shuffle(heads.begin(), heads.end(), rng);
    const int max_items = std::max(1, n_with_pages) + int(rng() % 400);
    const DecodePlan plan = cuda::plan_decode(heads, batch, 4 * (n_kv), n_kv, sm_count, ctas, 64 * (min_pages), max_items);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_plan(plan, heads, batch, n_kv, min_pages, max_items);
    if (HasFatalFailure()) return;
    // Parallelism: when there is enough work, the plan uses at least half the target.
    int64_t total = 0;
    for (const auto& h : heads) total += h.n_entries;
    const int64_t target = std::min<int64_t>(max_items, int64_t(sm_count) * ctas);
    if (total >= 4 * target * min_pages) {
      EXPECT_GE(int64_t(plan.items.size()), target / 2);
    }
  }
}

TEST(DecodePlan, RejectsBadHeads) {
  auto work = [](int seq, int kv, int n, int row_begin = 0, int n_rows = 4) {
    DecodeHeadWork w;
    w.seq = seq;
    w.kv_head = kv;
    w.n_entries = n;
    w.row_begin = row_begin;
    w.n_rows = n_rows;
    return w;
  };
  std::vector<DecodeHeadWork> heads = {work(0, 0, 4), work(0, 0, 4)};
  EXPECT_THROW(cuda::plan_decode(heads, 1, 4, 1, 132, 2, 64, 8), Error);  // listed twice
  heads = {work(0, 0, 4, 0, 2), work(0, 0, 4, 1, 1)};
  EXPECT_THROW(cuda::plan_decode(heads, 1, 4, 1, 132, 2, 64, 8), Error);  // query row 1 served twice
  heads = {work(0, 0, 4, 3, 2)};
  EXPECT_THROW(cuda::plan_decode(heads, 1, 4, 1, 132, 2, 64, 8), Error);  // rows outside the group
  heads = {work(1, 0, 4)};
  EXPECT_THROW(cuda::plan_decode(heads, 1, 4, 1, 132, 2, 64, 8), Error);  // seq out of range
  heads = {work(0, 0, 4), work(0, 1, 4), work(0, 2, 4)};
  EXPECT_THROW(cuda::plan_decode(heads, 1, 12, 3, 132, 2, 64, 2), Error);  // more heads than items
  const std::vector<int32_t> lens = {0};
  EXPECT_THROW(cuda::dense_decode_heads(lens, 1, 4, 64, 4), Error);
  const std::vector<int32_t> too_long = {64 * 4 + 1};
  EXPECT_THROW(cuda::dense_decode_heads(too_long, 1, 4, 64, 4), Error);
}

TEST(DecodePlan, DenseHeadsReadTheirWholeSequence) {
  const std::vector<int32_t> lens = {1, 64, 65};
  const auto heads = cuda::dense_decode_heads(lens, 2, 4, 64, 8);
  ASSERT_EQ(heads.size(), 6u);
  EXPECT_EQ(heads[0].n_entries, 1);
  EXPECT_EQ(heads[3].n_entries, 1);
  EXPECT_EQ(heads[5].n_entries, 2);
  EXPECT_EQ(heads[5].kind, cuda::ListKind::kDense);
  EXPECT_EQ(heads[5].n_rows, 4);
  EXPECT_EQ(heads[5].kv_head, 1);
}

TEST(DecodePlan, PoolsDenseAndSparseHeadsIntoEqualSplits) {
  // Batch 1, 128K, 8 KV heads: 2 dense heads (2048 pages) and 6 sparse heads (205 pages) and 24
  // per-query-head token lists of 4096 tokens: the splits of every kind hold about the same tokens.
  std::vector<DecodeHeadWork> heads;
  for (int h = 0; h < 8; ++h) {
    DecodeHeadWork w;
    w.kv_head = h;
    w.n_rows = 4;
    w.unit = 64;
    w.n_entries = 2048;
    if (h >= 2 && h < 6) {
      w.kind = cuda::ListKind::kUnits;
      w.n_entries = 205;
      w.list = h * 3000;
      w.count = h;
    }
    if (h >= 6) {
      for (int g = 0; g < 4; ++g) {
        w.kind = cuda::ListKind::kUnits;
        w.unit = 1;
        w.n_entries = 4096;
        w.row_begin = g;
        w.n_rows = 1;
        heads.push_back(w);
      }
      continue;
    }
    heads.push_back(w);
  }
  const DecodePlan plan = cuda::plan_decode(heads, 1, 32, 8, 132, 2, 128, 1024);
  int64_t lo = INT64_MAX, hi = 0;
  for (const DecodeWorkItem& it : plan.items) {
    const int64_t tokens = int64_t(it.end - it.begin) * it.unit;
    lo = std::min(lo, tokens);
    hi = std::max(hi, tokens);
  }
  EXPECT_LE(int(plan.items.size()), 264);
  EXPECT_GE(int(plan.items.size()), 200);
  EXPECT_LE(hi, 2 * lo) << "split sizes " << lo << ".." << hi << " tokens";
  // Per-query-head rows are merged per query head.
  for (int g = 0; g < 4; ++g) EXPECT_GT(plan.merge_count[size_t(6 * 4 + g)], 1);
}

TEST(DecodeAttention, ArgumentChecksNameTheField) {
  cuda::DecodeAttentionArgs a{};
  a.head_dim = 96;
  a.page_size = 64;
  try {
    cuda::check_decode_args(a);
    FAIL() << "head_dim 96 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("unsupported head_dim: 96"), std::string::npos) << e.what();
  }
  a.head_dim = 128;
  a.page_size = 48;
  EXPECT_THROW(cuda::check_decode_args(a), Error);
  a.page_size = 64;
  a.n_heads = 32;
  a.n_kv_heads = 2;  // group 16
  try {
    cuda::check_decode_args(a);
    FAIL() << "group 16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------ kernels

float bf16_to_float(cuda::bf16 x) { return __bfloat162float(x); }

// A paged decode problem: random bf16 q, K, V; block tables of shuffled page ids (unused entries -1).
struct Problem {
  int batch = 0, n_kv_heads = 2, group = 4, head_dim = 128, page_size = 64, max_pages = 0, n_pool_pages = 0;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> block_table;  // [batch][max_pages]
  std::vector<cuda::bf16> q;         // [batch][n_heads][head_dim]
  std::vector<cuda::bf16> k, v;      // [n_pool_pages][n_kv_heads][page_size][head_dim]
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
  auto fill = [&](std::vector<cuda::bf16>& x, size_t n, float sigma) {
    x.resize(n);
    for (auto& e : x) e = __float2bfloat16(sigma * normal(rng));
  };
  // q scaled up so that the softmax is peaked (logits spread over several units).
  fill(p.q, size_t(p.batch) * p.n_heads() * head_dim, 3.0f);
  const size_t pool = size_t(p.n_pool_pages) * n_kv_heads * page_size * head_dim;
  fill(p.k, pool, 1.0f);
  fill(p.v, pool, 1.0f);
  return p;
}

// softmax(q . k * scale) . v over the sequence's tokens, read through its pages, in double.
std::vector<double> reference(const Problem& p) {
  const int d = p.head_dim;
  std::vector<double> out(size_t(p.batch) * p.n_heads() * d, 0.0);
  for (int s = 0; s < p.batch; ++s)
    for (int h = 0; h < p.n_heads(); ++h) {
      const int kvh = h / p.group, len = p.seq_lens[s];
      const cuda::bf16* q = &p.q[(size_t(s) * p.n_heads() + h) * d];
      auto row = [&](const std::vector<cuda::bf16>& pool, int t) {
        const int page = p.block_table[size_t(s) * p.max_pages + t / p.page_size];
        return &pool[((size_t(page) * p.n_kv_heads + kvh) * p.page_size + t % p.page_size) * d];
      };
      std::vector<double> logit(static_cast<size_t>(len));
      double mx = -INFINITY;
      for (int t = 0; t < len; ++t) {
        const cuda::bf16* k = row(p.k, t);
        double dot = 0.0;
        for (int i = 0; i < d; ++i) dot += double(bf16_to_float(q[i])) * double(bf16_to_float(k[i]));
        logit[t] = dot * double(p.scale());
        mx = std::max(mx, logit[t]);
      }
      double sum = 0.0;
      for (int t = 0; t < len; ++t) sum += (logit[t] = std::exp(logit[t] - mx));
      double* o = &out[(size_t(s) * p.n_heads() + h) * d];
      for (int t = 0; t < len; ++t) {
        const cuda::bf16* v = row(p.v, t);
        for (int i = 0; i < d; ++i) o[i] += logit[t] / sum * double(bf16_to_float(v[i]));
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

template <typename T>
void upload(cuda::DeviceBuffer<T>& dst, const std::vector<T>& src) {
  dst = cuda::DeviceBuffer<T>(std::max<size_t>(src.size(), 1));
  if (!src.empty()) LY_CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Uploads the problem and the plan; the grid has `extra_ctas` idle CTAs past the plan's items,
// whose items are garbage that must never be read.
void setup(DeviceProblem& dp, const Problem& p, const DecodePlan& plan, int extra_ctas) {
  upload(dp.q, p.q);
  upload(dp.k, p.k);
  upload(dp.v, p.v);
  upload(dp.table, p.block_table);
  upload(dp.lens, p.seq_lens);
  std::vector<DecodeWorkItem> items = plan.items;
  for (int i = 0; i < extra_ctas; ++i) {
    DecodeWorkItem junk{987654, -5, -1, -7, 1000000, 2000000, 123456};
    junk.unit = 3;
    junk.n_rows = 100;
    items.push_back(junk);
  }
  upload(dp.items, items);
  upload(dp.n_items, std::vector<int32_t>{int32_t(plan.items.size())});
  upload(dp.merge_begin, plan.merge_begin);
  upload(dp.merge_count, plan.merge_count);
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
  std::vector<cuda::bf16> host(dp.out.size());
  LY_CUDA_CHECK(cudaMemcpy(host.data(), dp.out.data(), dp.out.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = bf16_to_float(host[i]);
  return out;
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

bool have_gpu() { return cuda::cuda_available(); }
#define LY_REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: GPU test skipped"

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
  std::vector<cuda::bf16> host(dp.out.size());
  LY_CUDA_CHECK(cudaMemcpy(host.data(), dp.out.data(), dp.out.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = bf16_to_float(host[i]);
  expect_close(out, reference(p), p);
  LY_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LY_CUDA_CHECK(cudaGraphDestroy(graph));
  LY_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace lychee

#endif  // LYCHEE_HAS_CUDA
