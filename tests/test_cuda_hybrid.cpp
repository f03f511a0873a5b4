// The hybrid-head decode path on the GPU (issue 6): the selection kernels against the CPU
// reference's select_units (top-k / ratio exactly, ties to the lower index; top-p / threshold
// away from the float-vs-double boundary), the one-launch kernel over a mix of dense heads with
// fused scoring, page lists, 16-token and token lists, per-query-head lists, windows and lists
// planned at an upper bound, against a double-precision reference over the same bf16 inputs; and
// every policy on the default model against the CPU reference, plus the equalities (every head
// retrieval, budgets covering the sequence) that must reproduce full attention on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "attention/policies.h"
#include "attention/selection.h"
#include "attention_reference.h"
#include "core/dtype.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include "cpu/model.h"
#include "cuda/common/common.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/common/device_buffer.h"
#include "cuda/runner/gpu_runner.h"
#include "cuda/kernels/select.h"
#include "pdl_probe.h"
#include "runtime/cuda_session.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace lychee {
namespace {

using test::to_device;
using test::to_device_bf16_bits;
using test::to_host;

// ------------------------------------------------------------------------------ selection

struct SelectCase {
  int n, unit, score_unit;
  SelectParams params;
};

// Runs the GPU selection for one sequence over `scores` (entries of score_unit tokens) and
// returns the list; `unit_scores` gets the per-unit max the CPU reference selects over.
std::vector<int32_t> gpu_select(const SelectCase& c, const std::vector<float>& scores, float scale) {
  const int list_stride = (c.n + c.unit - 1) / c.unit + 1;
  auto d_scores = to_device(scores);
  auto d_lens = to_device(std::vector<int32_t>{c.n});
  auto d_heads = to_device(std::vector<int32_t>{0});
  cuda::DeviceBuffer<int32_t> lists(static_cast<size_t>(list_stride)), counts(1);
  cuda::DeviceBuffer<float> scratch(static_cast<size_t>(list_stride));
  cuda::SelectArgs a{};
  a.scores = d_scores.data();
  a.score_stride = int(scores.size());
  a.score_unit = c.score_unit;
  a.unit = c.unit;
  a.seq_lens = d_lens.data();
  a.heads = d_heads.data();
  a.n_select = 1;
  a.row_heads = 1;
  a.lists = lists.data();
  a.counts = counts.data();
  a.unit_scores = scratch.data();
  a.list_stride = list_stride;
  a.strategy = c.params.strategy;
  a.budget = c.params.budget;
  a.value = c.params.value;
  a.sink = c.params.sink;
  a.recent = c.params.recent;
  a.scale = scale;
  cuda::select_units(a, 1, nullptr);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  const int count = to_host(counts, 1)[0];
  EXPECT_GE(count, 1);
  EXPECT_LE(count, list_stride - 1);
  return to_host(lists, size_t(std::clamp(count, 0, list_stride)));
}

std::vector<float> unit_max(const std::vector<float>& scores, int n, int unit, int score_unit) {
  const int n_units = (n + unit - 1) / unit, per = unit / score_unit, n_score = (n + score_unit - 1) / score_unit;
  (void)n_units;
  std::vector<float> u(size_t(n_units), -INFINITY);
  for (int i = 0; i < n_score; ++i) u[size_t(i / per)] = std::max(u[size_t(i / per)], scores[size_t(i)]);
  return u;
}

TEST(HybridSelect, TopKAndRatioMatchTheReferenceExactly) {
  LY_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int trial = 0; trial < 120; ++trial) {
    SelectCase c;
    const int units[] = {1, 16, 64};
    c.unit = units[trial % 3];
    c.score_unit = c.unit == 1 ? 1 : 16;
    c.n = 1 + int(rng() % (trial % 2 ? 300 : 9000));
    c.params.strategy = trial % 4 == 3 ? SelectStrategy::kRatio : SelectStrategy::kTopK;
    c.params.budget = 1 + int(rng() % 2048);
    c.params.value = 0.02 + 0.5 * double(rng() % 1000) / 1000.0;
    c.params.sink = trial % 5 == 0 ? int(rng() % 100) : 0;
    c.params.recent = trial % 7 == 0 ? int(rng() % 300) : 0;
    const int n_score = (c.n + c.score_unit - 1) / c.score_unit;
    std::vector<float> scores(static_cast<size_t>(n_score));
    // Coarse values in half the trials: many exact ties, which go to the lower index, -0 and +0
    // among them (they tie on the CPU: a stable sort on `>`).
    for (float& s : scores) {
      s = trial % 2 ? float(int(rng() % 9) - 4) * 0.5f : std::normal_distribution<float>(0, 3)(rng);
      if (s == 0.0f && rng() % 2 == 0) s = -0.0f;
    }
    const auto us = unit_max(scores, c.n, c.unit, c.score_unit);
    const auto want = select_units(us, c.unit, c.n, c.params, 0.125f);
    const auto got = gpu_select(c, scores, 0.125f);
    ASSERT_EQ(got, want) << "trial " << trial << ": n " << c.n << " unit " << c.unit << " budget "
                         << c.params.budget << " sink " << c.params.sink << " recent " << c.params.recent;
  }
}

// Rows as long as a 128K-256K context's: unit 16 (up to 16K units, in shared memory) and unit 1
// past the kernel's 32768 shared units (global scratch), top-k with ties, forced sink and recent.
TEST(HybridSelect, LongRowsMatchTheReferenceInSharedAndGlobalScratch) {
  LY_REQUIRE_GPU();
  std::mt19937 rng(21);
  for (int trial = 0; trial < 12; ++trial) {
    SelectCase c;
    c.unit = trial % 3 == 2 ? 1 : 16;
    c.score_unit = c.unit == 1 ? 1 : 16;
    c.n = c.unit == 1 ? 32768 + 1 + int(rng() % 20000) : 100000 + int(rng() % 160000);
    c.params.strategy = trial % 4 == 3 ? SelectStrategy::kRatio : SelectStrategy::kTopK;
    c.params.budget = 256 + int(rng() % 8192);
    c.params.value = 0.01 + 0.2 * double(rng() % 1000) / 1000.0;
    c.params.sink = trial % 2 ? 64 : 0;
    c.params.recent = trial % 2 ? 256 : 0;
    std::vector<float> scores(size_t((c.n + c.score_unit - 1) / c.score_unit));
    for (float& s : scores) s = trial % 2 ? float(int(rng() % 17) - 8) * 0.25f : std::normal_distribution<float>(0, 3)(rng);
    const auto us = unit_max(scores, c.n, c.unit, c.score_unit);
    const auto want = select_units(us, c.unit, c.n, c.params, 0.125f);
    const auto got = gpu_select(c, scores, 0.125f);
    ASSERT_EQ(got, want) << "trial " << trial << ": n " << c.n << " unit " << c.unit << " budget " << c.params.budget;
  }
}

TEST(HybridSelect, TopPAndThresholdMatchAwayFromTheBoundary) {
  LY_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (int trial = 0; trial < 80; ++trial) {
    SelectCase c;
    c.unit = trial % 2 ? 64 : 1;
    c.score_unit = c.unit == 1 ? 1 : 16;
    c.n = 1 + int(rng() % 6000);
    c.params.strategy = trial % 4 < 2 ? SelectStrategy::kTopP : SelectStrategy::kThreshold;
    c.params.value = c.params.strategy == SelectStrategy::kTopP ? 0.05 + 0.9 * double(rng() % 1000) / 1000.0
                                                                : 0.0005 + 0.02 * double(rng() % 1000) / 1000.0;
    c.params.sink = trial % 3 == 0 ? 4 : 0;
    std::vector<float> scores(size_t((c.n + c.score_unit - 1) / c.score_unit));
    for (float& s : scores) s = std::normal_distribution<float>(0, 6)(rng);
    const float scale = 0.125f;
    const auto us = unit_max(scores, c.n, c.unit, c.score_unit);
    const auto want = select_units(us, c.unit, c.n, c.params, scale);
    const auto got = gpu_select(c, scores, scale);
    // Units where they differ must sit on the boundary: their probability within 1e-5 of the
    // threshold, or (top-p) the cumulative mass before them within 1e-4 of p. The GPU sums
    // __expf terms in float with atomics in any order: over up to 6000 units the sum's relative
    // error is bounded by n·u = 6000 · 6e-8 ≈ 3.6e-4 (typically sqrt(n)·u ≈ 5e-6), plus __expf's
    // few ulp. A unit's probability (≤ 0.0205 here) carries that relative error: ≤ 7.4e-6 < 1e-5
    // absolute. The mass before a unit (up to 1) carries it whole: up to 3.6e-4 in the worst
    // order, so 1e-4 is already tighter than the worst case and cannot go to 1e-5.
    std::vector<int32_t> diff;
    std::set_symmetric_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(diff));
    double mx = -INFINITY, sum = 0.0;
    for (float s : us) mx = std::max(mx, double(s) * scale);
    std::vector<double> p(us.size());
    for (size_t i = 0; i < us.size(); ++i) sum += p[i] = std::exp(double(us[i]) * scale - mx);
    for (double& v : p) v /= sum;
    for (int32_t u : diff) {
      if (c.params.strategy == SelectStrategy::kThreshold) {
        EXPECT_NEAR(p[size_t(u)], c.params.value, 1e-5) << "trial " << trial << " unit " << u;
      } else {
        double before = 0.0;
        for (size_t i = 0; i < us.size(); ++i)
          if (us[i] > us[size_t(u)] || (us[i] == us[size_t(u)] && int(i) < u)) before += p[i];
        EXPECT_NEAR(before, c.params.value, 1e-4) << "trial " << trial << " unit " << u;
      }
    }
    EXPECT_LE(diff.size(), 2u) << "trial " << trial;
  }
}

// ------------------------------------------------------------------------------ the kernel

// A paged problem like test_cuda_decode_attention.cpp's, with a token list per (seq, query head).
struct Hybrid {
  int batch = 0, n_kv = 0, group = 0, d = 0, ps = 0, max_pages = 0, n_pool = 0;
  std::vector<int32_t> lens, table;
  std::vector<uint16_t> q;     // [batch][n_kv * group][d] bf16 bits
  std::vector<uint16_t> k, v;  // [n_pool][n_kv][ps][d] bf16 bits
  test::PagedSeqKv seq_kv(int s) const { return {k.data(), v.data(), &table[size_t(s) * max_pages], n_kv, ps, d}; }
  float kf(int s, int kvh, int t, int i) const { return float(seq_kv(s).k(kvh, t, i)); }
  const uint16_t* q_row(int s, int h) const { return &q[(size_t(s) * n_kv * group + h) * d]; }
  float qf(int s, int h, int i) const { return bf16_to_f32(q_row(s, h)[i]); }
};

Hybrid make_hybrid(std::vector<int32_t> lens, int n_kv, int group, int d, int ps, uint32_t seed) {
  Hybrid p;
  p.batch = int(lens.size());
  p.n_kv = n_kv, p.group = group, p.d = d, p.ps = ps;
  p.lens = std::move(lens);
  int used = 0;
  for (int32_t len : p.lens) {
    p.max_pages = std::max(p.max_pages, (len + ps - 1) / ps + 1);
    used += (len + ps - 1) / ps;
  }
  p.n_pool = used + 3;
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(p.n_pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.table.assign(size_t(p.batch) * p.max_pages, -1);
  size_t next = 0;
  for (int s = 0; s < p.batch; ++s)
    for (int i = 0; i < (p.lens[size_t(s)] + ps - 1) / ps; ++i) p.table[size_t(s) * p.max_pages + i] = ids[next++];
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t>& x, size_t n, float sigma) {
    x.resize(n);
    for (auto& e : x) e = f32_to_bf16(sigma * normal(rng));
  };
  fill(p.q, size_t(p.batch) * n_kv * group * d, 3.0f);
  fill(p.k, size_t(p.n_pool) * n_kv * ps * d, 1.0f);
  fill(p.v, size_t(p.n_pool) * n_kv * ps * d, 1.0f);
  return p;
}

TEST(HybridKernel, MixedHeadsInOneLaunchMatchTheReference) {
  LY_REQUIRE_GPU();
  for (const int d : {64, 128}) {
    // KV heads: 0 dense + group-chunk scores, 1 page list, 2 16-token list planned at an upper
    // bound, 3 per-query-head token lists, 4 window, 5 dense + per-row token scores.
    const int n_kv = 6, group = 4, ps = 64, n_heads = n_kv * group;
    const Hybrid p = make_hybrid({1, 63, 64, 700, 3001}, n_kv, group, d, ps, 77u + uint32_t(d));
    std::mt19937 rng(3);
    const int max_units = 3001 + 1, sink = 5, recent = 37;
    const int rows = p.batch * n_heads;
    // List rows: (seq, KV head) rows first, then one per (seq, query head).
    std::vector<int32_t> lists(size_t(rows + p.batch * n_kv) * max_units, 0), counts(size_t(rows + p.batch * n_kv), 0);
    std::vector<std::vector<int32_t>> reads(static_cast<size_t>(rows));  // tokens each (seq, query head) reads
    std::vector<cuda::DecodeHeadWork> heads;
    auto random_units = [&](int n_units, int want) {  // ascending, the last unit included
      std::vector<int32_t> all(static_cast<size_t>(n_units - 1));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(size_t(std::min(want, n_units) - 1));
      all.push_back(n_units - 1);
      std::sort(all.begin(), all.end());
      return all;
    };
    for (int s = 0; s < p.batch; ++s) {
      const int len = p.lens[size_t(s)];
      for (int h = 0; h < n_kv; ++h) {
        cuda::DecodeHeadWork w;
        w.seq = s;
        w.kv_head = h;
        w.n_rows = group;
        const int krow = s * n_kv + h;  // KV-head list rows
        std::vector<int32_t> all(static_cast<size_t>(len));
        std::iota(all.begin(), all.end(), 0);
        std::vector<int32_t> toks;
        if (h == 0 || h == 5) {
          w.n_entries = (len + ps - 1) / ps;
          w.score = h == 0 ? cuda::ScoreKind::kGroupChunk16 : cuda::ScoreKind::kRowToken;
          toks = all;
        } else if (h == 1 || h == 2) {
          const int unit = h == 1 ? ps : 16;
          const auto u = random_units((len + unit - 1) / unit, 1 + len / (3 * unit));
          std::copy(u.begin(), u.end(), lists.begin() + size_t(krow) * max_units);
          counts[size_t(krow)] = int(u.size());
          w.kind = cuda::ListKind::kUnits;
          w.unit = unit;
          w.list = krow * max_units;
          w.count = krow;
          w.n_entries = h == 1 ? int(u.size()) : (len + unit - 1) / unit;  // head 2: an upper bound
          units_to_tokens(u, unit, len, toks);
        } else if (h == 4) {
          w.kind = cuda::ListKind::kWindow;
          w.unit = 1;
          const int se = std::min(sink, len), re = std::min(recent, len - se);
          w.n_entries = se + re;
          for (int t = 0; t < se; ++t) toks.push_back(t);
          for (int t = len - re; t < len; ++t) toks.push_back(t);
        }
        if (h == 3) {
          for (int g = 0; g < group; ++g) {
            const int qrow = s * n_heads + h * group + g;  // a row of its own, past the KV rows
            const int lrow = p.batch * n_kv + qrow;
            auto u = random_units(len, 1 + int(rng() % 500));
            std::copy(u.begin(), u.end(), lists.begin() + size_t(lrow) * max_units);
            counts[size_t(lrow)] = int(u.size());
            cuda::DecodeHeadWork wq = w;
            wq.kind = cuda::ListKind::kUnits;
            wq.unit = 1;
            wq.row_begin = g;
            wq.n_rows = 1;
            wq.list = lrow * max_units;
            wq.count = lrow;
            wq.n_entries = int(u.size());
            heads.push_back(wq);
            reads[size_t(qrow)] = u;
          }
          continue;
        }
        heads.push_back(w);
        for (int g = 0; g < group; ++g) reads[size_t(s * n_heads + h * group + g)] = toks;
      }
    }
    for (const int sms : {1, 132}) {
      const cuda::DecodePlan plan = cuda::plan_decode(heads, p.batch, n_heads, n_kv, sms, 2, 2 * ps, 4096);
      auto dq = to_device_bf16_bits(p.q), dk = to_device_bf16_bits(p.k), dv = to_device_bf16_bits(p.v);
      auto dt = to_device(p.table), dl = to_device(p.lens), dlists = to_device(lists), dcounts = to_device(counts);
      auto ditems = to_device(plan.items);
      auto dn = to_device(std::vector<int32_t>{int32_t(plan.items.size())});
      auto dmb = to_device(plan.merge_begin), dmc = to_device(plan.merge_count);
      const int stride = 3001 + 1;
      cuda::DeviceBuffer<float> po(plan.items.size() * group * d + 1), pl(plan.items.size() * group + 1),
          scores(size_t(p.batch) * n_heads * stride);
      LY_CUDA_CHECK(cudaMemset(scores.data(), 0xFF, scores.bytes()));
      cuda::DeviceBuffer<cuda::bf16> out(size_t(p.batch) * n_heads * d);
      LY_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
      cuda::DeviceBuffer<unsigned long long> reads_d(static_cast<size_t>(p.batch));
      LY_CUDA_CHECK(cudaMemset(reads_d.data(), 0, reads_d.bytes()));
      cuda::DecodeAttentionArgs a{};
      a.q = dq.data(), a.k_pool = dk.data(), a.v_pool = dv.data(), a.block_table = dt.data();
      a.max_pages = p.max_pages, a.unit_lists = dlists.data(), a.list_counts = dcounts.data();
      a.seq_lens = dl.data(), a.items = ditems.data(), a.n_items = dn.data();
      a.merge_begin = dmb.data(), a.merge_count = dmc.data(), a.partial_o = po.data(), a.partial_lse = pl.data();
      a.out = out.data(), a.scores = scores.data(), a.score_stride = stride, a.token_reads = reads_d.data();
      a.window_sink = sink, a.window_recent = recent;
      a.batch = p.batch, a.n_heads = n_heads, a.n_kv_heads = n_kv, a.head_dim = d, a.page_size = ps;
      a.max_items = int(plan.items.size()) + 7;
      a.scale = 1.0f / std::sqrt(float(d));
      cuda::decode_attention(a, nullptr);
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got_f = test::to_host_bf16(out);
      double err2 = 0.0, ref2 = 0.0;
      for (int s = 0; s < p.batch; ++s)
        for (int h = 0; h < n_heads; ++h) {
          const auto want = test::paged_attention_reference(p.q_row(s, h), p.seq_kv(s), h / group,
                                                            reads[size_t(s * n_heads + h)], 1.0 / std::sqrt(double(d)));
          for (int i = 0; i < d; ++i) {
            const double g = got_f[(size_t(s) * n_heads + h) * d + i];
            ASSERT_TRUE(std::isfinite(g)) << "seq " << s << " head " << h << " not written";
            err2 += (g - want[size_t(i)]) * (g - want[size_t(i)]);
            ref2 += want[size_t(i)] * want[size_t(i)];
          }
        }
      EXPECT_LE(std::sqrt(err2 / ref2), 1e-2) << "d " << d << " sms " << sms;
      // Fused scores: KV head 0 per 16 tokens (max of q̄·k), KV head 5 per query row and token.
      const std::vector<float> sc = to_host(scores, scores.size());
      for (int s = 0; s < p.batch; ++s) {
        const int len = p.lens[size_t(s)];
        for (int t0 = 0; t0 < len; t0 += 16) {
          double best = -INFINITY;
          for (int t = t0; t < std::min(len, t0 + 16); ++t) {
            double dot = 0.0;
            for (int i = 0; i < d; ++i) {
              double qbar = 0.0;
              for (int g = 0; g < group; ++g) qbar += p.qf(s, g, i);
              dot += qbar / group * p.kf(s, 0, t, i);
            }
            best = std::max(best, dot);
          }
          const float g = sc[size_t(s * n_kv + 0) * stride + size_t(t0 / 16)];
          ASSERT_NEAR(g, best, 2e-3 * (1.0 + std::fabs(best))) << "seq " << s << " chunk " << t0 / 16;
        }
        for (int g = 0; g < group; ++g)
          for (int t = 0; t < len; t += 97) {
            double dot = 0.0;
            for (int i = 0; i < d; ++i) dot += double(p.qf(s, 5 * group + g, i)) * p.kf(s, 5, t, i);
            const float got = sc[(size_t(s) * n_heads + 5 * group + g) * stride + size_t(t)];
            ASSERT_NEAR(got, dot, 2e-3 * (1.0 + std::fabs(dot))) << "seq " << s << " row " << g << " token " << t;
          }
      }
      // Token reads of GQA-packed heads, per sequence.
      const auto counted = to_host(reads_d, size_t(p.batch));
      for (int s = 0; s < p.batch; ++s) {
        uint64_t want = 0;
        for (int h = 0; h < n_kv; ++h)
          if (h != 3) want += reads[size_t(s * n_heads + h * group)].size();
        EXPECT_EQ(counted[size_t(s)], want) << "seq " << s;
      }
      // The same launch under programmatic dependent launch behind a slow kernel that writes q and
      // the appended token's K/V 2 ms after letting it start (NaN until then; pdl_probe.h, and
      // DecodeAttentionUnderPdl in test_cuda_decode_attention.cpp for the dense plans): every list
      // kind's pre-wait loads must leave them alone, and the output keeps its bits.
      if (std::getenv("LYCHEE_NO_PDL") == nullptr) {
        const std::vector<uint16_t> first = test::to_host_bf16_bits(out);
        const auto q_true = to_device_bf16_bits(p.q), k_true = to_device_bf16_bits(p.k),
                   v_true = to_device_bf16_bits(p.v);
        std::vector<test::CopyRange> ranges = {{dq.data(), q_true.data(), uint32_t(dq.bytes())}};
        for (int s = 0; s < p.batch; ++s) {
          const int pos = p.lens[size_t(s)] - 1, page = p.table[size_t(s) * p.max_pages + pos / ps];
          for (int h = 0; h < n_kv; ++h) {
            const size_t at = ((size_t(page) * n_kv + h) * ps + pos % ps) * d;
            ranges.push_back({dk.data() + at, k_true.data() + at, uint32_t(d) * 2});
            ranges.push_back({dv.data() + at, v_true.data() + at, uint32_t(d) * 2});
          }
        }
        const auto d_ranges = to_device(ranges);
        test::launch_slow_producer(nullptr, 0, 0, nullptr);  // loaded outside the race (lazy loading)
        LY_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
        LY_CUDA_CHECK(cudaMemset(po.data(), 0xFF, po.bytes()));
        LY_CUDA_CHECK(cudaMemset(pl.data(), 0xFF, pl.bytes()));
        for (const test::CopyRange& r : ranges) LY_CUDA_CHECK(cudaMemset(r.dst, 0xFF, r.bytes));
        LY_CUDA_CHECK(cudaDeviceSynchronize());
        test::launch_slow_producer(d_ranges.data(), int(ranges.size()), 2'000'000, nullptr);
        cuda::decode_attention(a, nullptr);
        LY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> again = test::to_host_bf16_bits(out);
        size_t differ = 0;
        for (size_t i = 0; i < first.size(); ++i) differ += again[i] != first[i];
        EXPECT_EQ(differ, 0u) << "d " << d << " sms " << sms << ": outputs that moved behind the slow producer";
      }
    }
  }
}

// ------------------------------------------------------------------------------ policies

struct DefaultPair {
  Checkpoint ck;
  cpu::Model cpu_model;
  cuda::GpuRunner runner;
  explicit DefaultPair(const std::string& path)
      : ck(Checkpoint::open(path)), cpu_model(ck.config(), HostWeights::load(ck)),
        runner(cuda::upload_weights(ck), [] {
          cuda::RunnerOptions o;
          o.kv_memory_gib = 0.5;
          o.max_context = 4096;
          o.max_batch = 2;
          return o;
        }()) {}
};

std::vector<int32_t> prompt_ids(int n, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::mt19937 rng(42);
  for (auto& t : ids) t = int32_t(rng() % uint32_t(vocab - 10)) + 5;
  return ids;
}

// Logits after prefill + `steps` decode steps (teacher-forced tokens), and the stats.
struct Trace {
  std::vector<std::vector<float>> logits;
  KvReadStats stats;
};
Trace run_session(Session& s, AttentionPolicy* policy, const std::vector<int32_t>& ids, int prefill) {
  Trace t;
  s.set_policy(policy);
  s.feed(std::span<const int32_t>(ids).first(size_t(prefill)));
  for (size_t i = size_t(prefill); i < ids.size(); ++i) {
    s.feed(std::span<const int32_t>(&ids[i], 1));
    auto l = s.logits();
    t.logits.emplace_back(l.begin(), l.end());
  }
  t.stats = s.stats();
  return t;
}

using test::rel_error;

std::vector<PolicyOptions> all_policies(const ModelConfig& c, int budget) {
  std::vector<PolicyOptions> v;
  PolicyOptions o;
  o.block_size = 64;  // the page unit (the default is 16 since the block-unit measurement; 16 is below)
  v.push_back(o);
  o.select.budget = budget;
  o.kind = PolicyKind::kLychee;
  v.push_back(o);
  PolicyOptions tok = o;
  tok.block_size = 1;
  v.push_back(tok);
  PolicyOptions b16 = o;
  b16.block_size = 16;
  b16.select.sink = 16;
  b16.select.recent = 32;
  v.push_back(b16);
  PolicyOptions topp = o;
  topp.select.strategy = SelectStrategy::kTopP;
  topp.select.value = 0.9;
  v.push_back(topp);
  PolicyOptions thr = o;
  thr.select.strategy = SelectStrategy::kThreshold;
  thr.select.value = 0.001;
  v.push_back(thr);
  PolicyOptions ratio = o;
  ratio.select.strategy = SelectStrategy::kRatio;
  ratio.select.value = 0.2;
  v.push_back(ratio);
  o.kind = PolicyKind::kTidal;
  v.push_back(o);
  o.kind = PolicyKind::kQuest;
  v.push_back(o);
  o.kind = PolicyKind::kDuo;
  o.duo_sink = 64;
  o.duo_recent = budget - 64;
  v.push_back(o);
  (void)c;
  return v;
}

// Every policy on the GPU against the CPU reference on the default model: logits within bf16
// tolerance at every step, and the KV reads equal (the policies read the same number of tokens;
// Tidal's and Quest's unions within 5%, their per-head sets depending on near-ties of bf16 q·k).
TEST(HybridPolicies, EveryPolicyMatchesTheCpuReference) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  const auto ids = prompt_ids(1400, c.vocab_size);
  for (const PolicyOptions& o : all_policies(c, 512)) {
    auto policy = make_policy(o, c);
    CpuSession cpu(p.cpu_model, 2048);
    GpuSession gpu(p.runner, 2048);
    const Trace want = run_session(cpu, policy.get(), ids, 1392);
    auto policy_gpu = make_policy(o, c);
    const Trace got = run_session(gpu, policy_gpu.get(), ids, 1392);
    ASSERT_EQ(got.logits.size(), want.logits.size()) << o.label();
    // Full attention reads the same tokens on both backends: the bf16 bound of every GPU-vs-CPU
    // logits check (test::kBf16LogitsTol, was 6e-2 here). A sparse policy can select differently
    // where two scores are within bf16 rounding of each other (bf16 q·k on the GPU, f32 on the
    // CPU); a different read set is not a rounding error of the same sums, so no rounding bound
    // covers it and its 6e-2 stays.
    const double tol = o.kind == PolicyKind::kFull ? test::kBf16LogitsTol : 6e-2;
    double worst = 0.0;
    for (size_t i = 0; i < want.logits.size(); ++i) {
      const double e = rel_error(got.logits[i], want.logits[i]);
      EXPECT_LT(e, tol) << o.label() << " step " << i;
      worst = std::max(worst, e);
    }
    std::printf("[ gpu-vs-cpu logits ] %-32s worst rel. L2 %.2e (tolerance %.0e)\n", o.label().c_str(), worst, tol);
    EXPECT_EQ(got.stats.decode_steps, want.stats.decode_steps) << o.label();
    EXPECT_EQ(got.stats.dense_token_reads, want.stats.dense_token_reads) << o.label();
    EXPECT_EQ(got.stats.metadata_bytes, want.stats.metadata_bytes) << o.label();
    const double ratio = double(got.stats.token_reads) / double(want.stats.token_reads);
    if (o.kind == PolicyKind::kTidal || o.kind == PolicyKind::kQuest ||
        o.select.strategy == SelectStrategy::kTopP || o.select.strategy == SelectStrategy::kThreshold) {
      EXPECT_NEAR(ratio, 1.0, 0.05) << o.label();
    } else {
      EXPECT_EQ(got.stats.token_reads, want.stats.token_reads) << o.label();
    }
  }
}

// Split plans are rebuilt only when a head's work changes (a page or selection-unit boundary, the
// batch, the policy), not every step: 130 decode steps under LycheeDecode (block 64, pages of 64)
// from a 700-token prompt cross two page boundaries, so a handful of plans serve them all.
TEST(HybridPolicies, DecodeStepsReuseTheirPlans) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  PolicyOptions o;
  o.kind = PolicyKind::kLychee;
  o.select.budget = 256;
  auto policy = make_policy(o, c);
  GpuSession s(p.runner, 1024);
  s.set_policy(policy.get());
  const auto ids = prompt_ids(830, c.vocab_size);
  const int before = p.runner.replans();
  s.feed(std::span<const int32_t>(ids).first(700));
  for (size_t i = 700; i < ids.size(); ++i) s.feed(std::span<const int32_t>(&ids[i], 1));
  const int replans = p.runner.replans() - before;
  EXPECT_GE(replans, 3);   // the first step and the two page boundaries (768, 832 tokens)
  EXPECT_LE(replans, 12);  // and not one per step (130)
}

// generate's pipelined loop (the GPU session queues step i+1 before token i reaches the host) gives
// what the step-by-step loop gives: the same tokens (greedy and seeded sampling), the same cache
// length after a stop (the queued step dropped) and the same read counts; and in steady state the
// host never waited for the device to free its staging memory (host_stalls unchanged).
TEST(HybridPolicies, PipelinedGenerateEqualsStepByStep) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  PolicyOptions o;
  o.kind = PolicyKind::kLychee;
  o.select.budget = 256;
  const auto ids = prompt_ids(700, c.vocab_size);
  for (const float temperature : {0.0f, 0.8f}) {
    GenerateOptions g;
    g.max_new_tokens = 90;
    g.sampling.temperature = temperature;
    g.sampling.top_p = 0.95f;
    g.sampling.seed = 11;
    // Step by step: sample, then feed (what decode_from did before it ran ahead).
    auto pol_a = make_policy(o, c);
    GpuSession a(p.runner, 1024);
    a.set_policy(pol_a.get());
    a.feed(ids);
    Sampler sampler(g.sampling);
    std::vector<int32_t> want;
    for (int i = 0; i < g.max_new_tokens; ++i) {
      want.push_back(a.sample(sampler));
      if (i + 1 < g.max_new_tokens) a.feed(std::span<const int32_t>(&want.back(), 1));
    }
    // Pipelined, through decode_from; then again with a stop at token 60.
    auto pol_b = make_policy(o, c);
    GpuSession b(p.runner, 1024);
    b.set_policy(pol_b.get());
    b.feed(ids);
    const uint64_t stalls = p.runner.host_stalls();
    const GenerateResult got = decode_from(b, g, {});
    EXPECT_EQ(p.runner.host_stalls(), stalls) << "temperature " << temperature;
    EXPECT_EQ(got.tokens, want) << "temperature " << temperature;
    EXPECT_EQ(b.length(), a.length());
    // The read counts of a stopped pipelined run against 60 steps fed one by one.
    auto pol_c = make_policy(o, c);
    GpuSession cs(p.runner, 1024);
    cs.set_policy(pol_c.get());
    cs.feed(ids);
    for (int i = 0; i < 60; ++i) cs.feed(std::span<const int32_t>(&want[size_t(i)], 1));
    auto pol_d = make_policy(o, c);
    GpuSession ds(p.runner, 1024);
    ds.set_policy(pol_d.get());
    ds.feed(ids);
    GenerateOptions stop = g;
    stop.stop_ids = {want[60]};
    // (with sampling, a stop id may also occur earlier in `want`: stop at its first occurrence)
    const size_t first = size_t(std::find(want.begin(), want.end(), want[60]) - want.begin());
    const GenerateResult stopped = decode_from(ds, stop, {});
    EXPECT_EQ(stopped.finish_reason, "stop");
    EXPECT_EQ(stopped.tokens, std::vector<int32_t>(want.begin(), want.begin() + long(first) + 1));
    EXPECT_EQ(ds.length(), int(ids.size() + first));  // the step queued after the stop token was dropped
    if (first == 60) {
      EXPECT_EQ(ds.stats().decode_steps, cs.stats().decode_steps);
      EXPECT_EQ(ds.stats().token_reads, cs.stats().token_reads);
      EXPECT_EQ(ds.stats().dense_token_reads, cs.stats().dense_token_reads);
      EXPECT_EQ(ds.stats().metadata_bytes, cs.stats().metadata_bytes);
    }
  }
}

// The server's batched step: Session::decode_batch over five sessions of the same runner (batch
// of at most 2) — three LycheeDecode sessions with equal settings (a batch of two, later one),
// one dense, one Quest — gives each session the logits and reads it gets decoded alone (within
// bf16 rounding: the products of a batch of two round differently from a batch of one), and a
// greedy token sampled in `after` equal to the token of the session alone.
TEST(HybridPolicies, BatchedSessionsGetWhatEachGetsAlone) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  PolicyOptions lo, qo, fo;
  lo.kind = PolicyKind::kLychee;
  lo.select.budget = 256;
  qo.kind = PolicyKind::kQuest;
  qo.select.budget = 256;
  const std::vector<PolicyOptions> kinds = {lo, lo, fo, lo, qo};
  const int steps = 24;
  std::vector<std::vector<int32_t>> ids;
  std::vector<Trace> alone;
  for (size_t i = 0; i < kinds.size(); ++i) {
    ids.push_back(prompt_ids(700 + 37 * int(i), c.vocab_size - int(i)));
    auto policy = kinds[i].kind == PolicyKind::kFull ? nullptr : make_policy(kinds[i], c);
    GpuSession s(p.runner, 1024);
    alone.push_back(run_session(s, policy.get(), ids[i], int(ids[i].size()) - steps));
  }
  std::vector<std::unique_ptr<AttentionPolicy>> policies;
  std::vector<std::unique_ptr<GpuSession>> owned;
  std::vector<Session*> sessions;
  for (size_t i = 0; i < kinds.size(); ++i) {
    policies.push_back(kinds[i].kind == PolicyKind::kFull ? nullptr : make_policy(kinds[i], c));
    owned.push_back(std::make_unique<GpuSession>(p.runner, 1024));
    owned.back()->set_policy(policies.back().get());
    owned.back()->feed(std::span<const int32_t>(ids[i]).first(ids[i].size() - steps));
    sessions.push_back(owned.back().get());
  }
  const uint64_t forwards = p.runner.forwards();
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < kinds.size(); ++i) tokens.push_back(ids[i][ids[i].size() - steps + size_t(step)]);
    std::vector<size_t> order;
    Session::decode_batch(sessions, tokens, [&](size_t i) {
      order.push_back(i);
      const auto l = sessions[i]->logits();
      const std::vector<float>& want = alone[i].logits[size_t(step)];
      EXPECT_LT(rel_error(std::vector<float>(l.begin(), l.end()), want), test::kBf16LogitsTol)
          << "session " << i << " step " << step;
      Sampler greedy(SamplingParams{});
      const int32_t best = int32_t(std::max_element(want.begin(), want.end()) - want.begin());
      EXPECT_EQ(sessions[i]->sample(greedy), best) << "session " << i << " step " << step;
    });
    // A batch starts at the first session not yet stepped and takes the later ones with the same
    // policy, at most 2: {0, 1}, then {2} (dense), {3} (the third LycheeDecode), {4}.
    EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4})) << "step " << step;
  }
  EXPECT_EQ(p.runner.forwards() - forwards, uint64_t(4 * steps));
  for (size_t i = 0; i < kinds.size(); ++i) {
    const KvReadStats& got = sessions[i]->stats();
    EXPECT_EQ(got.decode_steps, alone[i].stats.decode_steps) << i;
    EXPECT_EQ(got.dense_token_reads, alone[i].stats.dense_token_reads) << i;
    if (kinds[i].kind == PolicyKind::kQuest)
      EXPECT_NEAR(double(got.token_reads) / double(alone[i].stats.token_reads), 1.0, 0.05) << i;
    else
      EXPECT_EQ(got.token_reads, alone[i].stats.token_reads) << i;
  }
}

// Sessions share one runner (the server steps many): each session's policy, logits and KV-read
// counts stay its own when steps of sessions with different policies interleave — the same logits
// bit for bit and the same reads as the session run alone.
TEST(HybridPolicies, InterleavedSessionsWithDifferentPoliciesStayApart) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  PolicyOptions lo, qo;
  lo.kind = PolicyKind::kLychee;
  lo.select.budget = 256;
  qo.kind = PolicyKind::kQuest;
  qo.select.budget = 256;
  const auto ids_a = prompt_ids(760, c.vocab_size), ids_b = prompt_ids(700, c.vocab_size - 3);
  std::vector<Trace> alone;
  for (const auto& [o, ids] : {std::pair{lo, ids_a}, std::pair{qo, ids_b}}) {
    auto policy = make_policy(o, c);
    GpuSession s(p.runner, 1024);
    alone.push_back(run_session(s, policy.get(), ids, int(ids.size()) - 40));
  }
  auto pa = make_policy(lo, c), pb = make_policy(qo, c);
  GpuSession a(p.runner, 1024), b(p.runner, 1024);
  a.set_policy(pa.get());
  b.set_policy(pb.get());
  a.feed(std::span<const int32_t>(ids_a).first(ids_a.size() - 40));
  b.feed(std::span<const int32_t>(ids_b).first(ids_b.size() - 40));
  test::expect_error([&] { a.logits(); }, ErrorCode::kInternal, "another session");  // b ran last
  for (size_t i = 0; i < 40; ++i) {
    for (auto [s, ids, k] : {std::tuple{&a, &ids_a, 0}, std::tuple{&b, &ids_b, 1}}) {
      const size_t at = ids->size() - 40 + i;
      s->feed(std::span<const int32_t>(&(*ids)[at], 1));
      const auto l = s->logits();
      ASSERT_EQ(std::vector<float>(l.begin(), l.end()), alone[size_t(k)].logits[i]) << "session " << k << " step " << i;
    }
  }
  EXPECT_EQ(a.stats().token_reads, alone[0].stats.token_reads);
  EXPECT_EQ(b.stats().token_reads, alone[1].stats.token_reads);
  EXPECT_EQ(b.stats().metadata_bytes, alone[1].stats.metadata_bytes);
}

// Equalities on the GPU: LycheeDecode with every head retrieval, or with a budget covering the
// sequence, reads exactly what full attention reads in the same splits: identical logits.
// DuoAttention with windows covering the sequence, TidalDecode and Quest with covering budgets
// read every token through token / chunk lists: equal within bf16 rounding of the split order.
TEST(HybridPolicies, CoveringPoliciesReproduceFullAttention) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  const auto ids = prompt_ids(900, c.vocab_size);
  GpuSession full_s(p.runner, 1024);
  SpecPolicy full(full_spec(c));
  const Trace ref = run_session(full_s, &full, ids, 890);
  std::vector<std::pair<PolicyOptions, bool>> cases;  // options, bit-exact
  PolicyOptions o;
  o.kind = PolicyKind::kLychee;
  o.block_size = 64;  // bit-exact needs the page unit: 16-token units split the same reads differently
  o.roles = make_head_roles(c);
  std::fill(o.roles->retrieval.begin(), o.roles->retrieval.end(), uint8_t(1));
  cases.push_back({o, true});
  o.roles.reset();
  o.select.budget = 4096;
  cases.push_back({o, true});
  o.kind = PolicyKind::kTidal;
  cases.push_back({o, false});
  o.kind = PolicyKind::kQuest;
  cases.push_back({o, false});
  o.kind = PolicyKind::kDuo;
  o.duo_sink = 100;
  o.duo_recent = 1000;
  cases.push_back({o, false});
  for (const auto& [opt, exact] : cases) {
    auto policy = make_policy(opt, c);
    GpuSession s(p.runner, 1024);
    const Trace got = run_session(s, policy.get(), ids, 890);
    ASSERT_EQ(got.logits.size(), ref.logits.size()) << opt.label();
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      if (exact) {
        ASSERT_EQ(got.logits[i], ref.logits[i]) << opt.label() << " step " << i;
      } else {
        EXPECT_LT(rel_error(got.logits[i], ref.logits[i]), 1e-2) << opt.label() << " step " << i;
      }
    }
    EXPECT_EQ(got.stats.token_reads, ref.stats.token_reads) << opt.label();
  }
}

// A session reused across policies (eval truncates to the prompt and switches budgets) gets the
// same logits as a fresh one: Quest's page metadata is rebuilt for each policy setting.
TEST(HybridPolicies, SwitchingPoliciesOnALiveSessionKeepsQuestMetadataRight) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  const ModelConfig& c = p.ck.config();
  const auto ids = prompt_ids(1100, c.vocab_size);
  PolicyOptions small, large;
  small.kind = large.kind = PolicyKind::kQuest;
  small.select.budget = 128;
  large.select.budget = 512;
  auto ps = make_policy(small, c), pl = make_policy(large, c);
  GpuSession fresh(p.runner, 2048);
  const Trace want = run_session(fresh, pl.get(), ids, 1090);
  GpuSession reused(p.runner, 2048);
  run_session(reused, ps.get(), ids, 1090);
  reused.truncate(1090);
  reused.set_policy(pl.get());
  for (size_t i = 1090; i < ids.size(); ++i) {
    reused.feed(std::span<const int32_t>(&ids[i], 1));
    const auto l = reused.logits();
    ASSERT_EQ(std::vector<float>(l.begin(), l.end()), want.logits[i - 1090]) << "step " << i - 1090;
  }
}

TEST(HybridPolicies, UnsupportedGpuFormsAreClearErrors) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_DEFAULT_MODEL(path);
  DefaultPair p(path);
  PolicyOptions o;
  o.kind = PolicyKind::kLychee;
  o.block_size = 48;
  auto policy = make_policy(o, p.ck.config());
  GpuSession s(p.runner, 512);
  test::expect_error([&] { s.set_policy(policy.get()); }, ErrorCode::kUnsupported, {"--block-size 48", "--device cpu"});
}

}  // namespace
}  // namespace lychee

#else
TEST(Hybrid, NotBuilt) { LY_CUDA_NOT_BUILT("the hybrid-head kernel and GPU policy tests"); }
#endif  // LYCHEE_HAS_CUDA
