// Decode attention with several query positions per sequence (DecodeAttentionArgs::rows_per_seq,
// speculative verification's γ + 1 rows): the kernel against the double-precision reference of
// attention_reference.h, the row of new position p of a sequence of length L (all R new tokens
// counted) attending over its first L - (R - 1 - p) tokens. Every group size with R = 1..9 and 16
// (within one mma tile, group x R <= 16: the narrow variant up to 8 rows, the Wide one past it;
// beyond it the plan cuts a head's positions over several items and merges them apart), head dims
// 64 and 128, pages of 16 and 64, lengths that are not page multiples with the new tokens across a
// page boundary, several sequences, whole and split plans (the new tokens then span two items);
// and under programmatic dependent launch behind a slow producer of q and all R appended K/V rows,
// which holds the early-issued tiles to those wholly before the new tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/decode_attention.h"
#include "pdl_probe.h"

namespace lychee {
namespace {

using cuda::DecodePlan;
using cuda::DecodeWorkItem;
using test::to_device;
using test::to_device_bf16_bits;

// A verification problem: R new positions per sequence, already in the cache (seq_lens count them).
struct RowsProblem {
  int batch = 0, n_kv_heads = 2, group = 4, head_dim = 128, page_size = 64, rows = 1, max_pages = 0;
  std::vector<int32_t> seq_lens, block_table;  // [batch], [batch][max_pages]
  std::vector<uint16_t> q;                     // [batch][rows][n_heads][head_dim] bf16 bits
  std::vector<uint16_t> k, v;                  // [n_pool_pages][n_kv_heads][page_size][head_dim] bf16 bits
  int n_heads() const { return n_kv_heads * group; }
  float scale() const { return 1.0f / std::sqrt(float(head_dim)); }
};

RowsProblem make_rows_problem(std::vector<int32_t> lens, int n_kv_heads, int group, int head_dim, int page_size,
                              int rows, uint32_t seed) {
  RowsProblem p;
  p.batch = int(lens.size());
  p.n_kv_heads = n_kv_heads, p.group = group, p.head_dim = head_dim, p.page_size = page_size, p.rows = rows;
  p.seq_lens = std::move(lens);
  int used = 0;
  for (const int32_t len : p.seq_lens) {
    const int n = (len + page_size - 1) / page_size;
    p.max_pages = std::max(p.max_pages, n + 1);
    used += n;
  }
  const int n_pool = used + 3;
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n_pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.block_table.assign(size_t(p.batch) * p.max_pages, -1);
  size_t next = 0;
  for (int s = 0; s < p.batch; ++s)
    for (int i = 0; i < (p.seq_lens[size_t(s)] + page_size - 1) / page_size; ++i)
      p.block_table[size_t(s) * p.max_pages + i] = ids[next++];
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t>& x, size_t n, float sigma) {
    x.resize(n);
    for (auto& e : x) e = f32_to_bf16(sigma * normal(rng));
  };
  fill(p.q, size_t(p.batch) * rows * p.n_heads() * head_dim, 3.0f);  // peaked softmaxes
  const size_t pool = size_t(n_pool) * n_kv_heads * page_size * head_dim;
  fill(p.k, pool, 1.0f);
  fill(p.v, pool, 1.0f);
  return p;
}

// [batch][rows][n_heads][head_dim] in double: row (s, p) over tokens [0, L - (R - 1 - p)).
std::vector<double> rows_reference(const RowsProblem& p) {
  const int d = p.head_dim;
  std::vector<double> out(size_t(p.batch) * p.rows * p.n_heads() * d);
  for (int s = 0; s < p.batch; ++s) {
    const test::PagedSeqKv kv{p.k.data(), p.v.data(), &p.block_table[size_t(s) * p.max_pages], p.n_kv_heads,
                              p.page_size, d};
    for (int r = 0; r < p.rows; ++r)
      for (int h = 0; h < p.n_heads(); ++h) {
        const size_t row = ((size_t(s) * p.rows + r) * p.n_heads() + h) * d;
        const int seen = p.seq_lens[size_t(s)] - (p.rows - 1 - r);
        const std::vector<double> o = test::paged_attention_reference(&p.q[row], kv, h / p.group, seen, double(p.scale()));
        std::copy(o.begin(), o.end(), out.begin() + long(row));
      }
  }
  return out;
}

struct RowsDevice {
  cuda::DeviceBuffer<cuda::bf16> q, k, v, out;
  cuda::DeviceBuffer<int32_t> table, lens, n_items, merge_begin, merge_count;
  cuda::DeviceBuffer<DecodeWorkItem> items;
  cuda::DeviceBuffer<float> partial_o, partial_lse;
  cuda::DecodeAttentionArgs args{};
};

// The dense plan for R rows: one split per head (split false; past one tile, one item per group
// of positions), or the whole machine's worth of splits of at least a page.
DecodePlan rows_plan(const RowsProblem& p, bool split) {
  const auto heads = cuda::dense_decode_heads(p.seq_lens, p.n_kv_heads, p.group, p.page_size, p.max_pages);
  const int per_item = cuda::decode_positions_per_item(p.group, p.rows);
  const int chunks = (p.rows + per_item - 1) / per_item;
  if (!split)
    return cuda::plan_decode(heads, p.batch, p.n_heads(), p.n_kv_heads, 1, 1, 1 << 30, int(heads.size()) * chunks, 0,
                             p.rows);
  return cuda::plan_decode(heads, p.batch, p.n_heads(), p.n_kv_heads, 132, 2, p.page_size, 4096, 0, p.rows);
}

void rows_setup(RowsDevice& dp, const RowsProblem& p, const DecodePlan& plan) {
  dp.q = to_device_bf16_bits(p.q);
  dp.k = to_device_bf16_bits(p.k);
  dp.v = to_device_bf16_bits(p.v);
  dp.table = to_device(p.block_table);
  dp.lens = to_device(p.seq_lens);
  std::vector<DecodeWorkItem> items = plan.items;
  for (int i = 0; i < 5; ++i) {  // idle CTAs' garbage items, never read
    DecodeWorkItem junk{987654, -5, -1, -7, 1000000, 2000000, 123456};
    junk.unit = 3;
    junk.n_rows = 100;
    items.push_back(junk);
  }
  dp.items = to_device(items);
  dp.n_items = to_device(std::vector<int32_t>{int32_t(plan.items.size())});
  dp.merge_begin = to_device(plan.merge_begin);
  dp.merge_count = to_device(plan.merge_count);
  const size_t slots = std::max<size_t>(items.size(), 1), slot_rows = size_t(p.group) * p.rows;
  dp.partial_o = cuda::DeviceBuffer<float>(slots * slot_rows * p.head_dim);
  dp.partial_lse = cuda::DeviceBuffer<float>(slots * slot_rows);
  dp.out = cuda::DeviceBuffer<cuda::bf16>(size_t(p.batch) * p.rows * p.n_heads() * p.head_dim);
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
  a.rows_per_seq = p.rows;
}

void poison(RowsDevice& dp) {
  LY_CUDA_CHECK(cudaMemset(dp.out.data(), 0xFF, dp.out.bytes()));
  LY_CUDA_CHECK(cudaMemset(dp.partial_o.data(), 0xFF, dp.partial_o.bytes()));
  LY_CUDA_CHECK(cudaMemset(dp.partial_lse.data(), 0xFF, dp.partial_lse.bytes()));
}

// ||out - ref|| / ||ref|| <= 1e-2 (the decode kernel tests' bound), every element finite; the
// worst element and its (seq, position, head, dim) on failure.
void expect_rows_close(const std::vector<float>& out, const std::vector<double>& ref, const RowsProblem& p) {
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
  const size_t row = worst_i / p.head_dim, head = row % p.n_heads(), pos = row / p.n_heads() % p.rows,
               seq = row / p.n_heads() / p.rows;
  EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-300)), 1e-2)
      << "max abs error " << worst << " at index " << worst_i << " (seq " << seq << ", position " << pos << ", head "
      << head << ", dim " << worst_i % p.head_dim << "): got " << out[worst_i] << ", want " << ref[worst_i];
}

// Lengths (the R new tokens included) with the new tokens at awkward places: the whole sequence,
// across a 16- and a 64-token page boundary, just past one, and long ones cut into many splits.
std::vector<int32_t> rows_lengths(int rows) { return {rows, rows + 2, 63, 64 + rows / 2, 1000, 4097}; }

TEST(DecodeAttentionRows, MatchTheCausalReference) {
  LY_REQUIRE_GPU();
  int cases = 0;
  for (const int d : {64, 128})
    for (const int ps : {16, 64})
      for (const int group : {1, 3, 4, 8})
        for (const int rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
          const RowsProblem p = make_rows_problem(rows_lengths(rows), 2, group, d, ps, rows,
                                                  uint32_t(7 * d + 3 * ps + 11 * group + 101 * rows));
          const std::vector<double> want = rows_reference(p);
          for (const bool split : {false, true}) {
            SCOPED_TRACE("d " + std::to_string(d) + ", page " + std::to_string(ps) + ", group " +
                         std::to_string(group) + ", rows " + std::to_string(rows) + (split ? ", split" : ", whole"));
            const DecodePlan plan = rows_plan(p, split);
            if (split) {
              ASSERT_GT(plan.n_slots, 0);
            }
            RowsDevice dp;
            rows_setup(dp, p, plan);
            poison(dp);
            cuda::decode_attention(dp.args, nullptr);
            LY_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> out = test::to_host_bf16(dp.out);
            expect_rows_close(out, want, p);
            poison(dp);  // same inputs, same bits: a moving result would be a race
            cuda::decode_attention(dp.args, nullptr);
            LY_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_EQ(std::memcmp(out.data(), test::to_host_bf16(dp.out).data(), out.size() * sizeof(float)), 0);
            ++cases;
            if (HasFailure()) return;
          }
        }
  std::printf("%d rows_per_seq cases against the reference\n", cases);
}

// The rows' results do not depend on the other rows: position p of an R-row step equals the
// one-row step (R = 1) of the sequence cut to its length L - (R - 1 - p), bit for bit when both
// plans are whole (one split per head: the same tokens in the same order; the 8-row and 16-row
// variants sum the same products; past one tile each group of positions its own item).
TEST(DecodeAttentionRows, EachRowEqualsTheOneRowStepOfItsPrefix) {
  LY_REQUIRE_GPU();
  for (const auto& [group, rows] :
       {std::pair{4, 4}, std::pair{3, 5}, std::pair{8, 2}, std::pair{1, 16}, std::pair{4, 9}, std::pair{8, 5}}) {
    SCOPED_TRACE("group " + std::to_string(group) + ", rows " + std::to_string(rows));
    const RowsProblem p = make_rows_problem({1000, 65}, 2, group, 128, 16, rows, 77u + uint32_t(group));
    RowsDevice dp;
    rows_setup(dp, p, rows_plan(p, false));
    poison(dp);
    cuda::decode_attention(dp.args, nullptr);
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> all = test::to_host_bf16(dp.out);
    const size_t row_elems = size_t(p.n_heads()) * p.head_dim;
    for (int r = 0; r < rows; ++r) {
      RowsProblem one = p;
      one.rows = 1;
      one.q.clear();
      for (int s = 0; s < p.batch; ++s) {
        one.seq_lens[size_t(s)] = p.seq_lens[size_t(s)] - (rows - 1 - r);
        const auto first = p.q.begin() + long((size_t(s) * rows + r) * row_elems);
        one.q.insert(one.q.end(), first, first + long(row_elems));
      }
      RowsDevice d1;
      rows_setup(d1, one, rows_plan(one, false));
      poison(d1);
      cuda::decode_attention(d1.args, nullptr);
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> want = test::to_host_bf16(d1.out);
      for (int s = 0; s < p.batch; ++s)
        EXPECT_EQ(std::memcmp(all.data() + (size_t(s) * rows + r) * row_elems, want.data() + size_t(s) * row_elems,
                              row_elems * sizeof(float)),
                  0)
            << "seq " << s << ", position " << r;
    }
  }
}

// Under PDL: the previous kernel (here a slow producer) writes q and the K/V of all R appended
// tokens; they hold NaN until it does. A tile holding any of them loaded before the wait would
// carry NaN into the output.
TEST(DecodeAttentionRows, AppendedRowsWrittenSlowlyBeforeTheStep) {
  LY_REQUIRE_GPU();
  if (std::getenv("LYCHEE_NO_PDL") != nullptr) GTEST_SKIP() << "LYCHEE_NO_PDL is set: nothing can race";
  for (const auto& [group, rows, ps] : {std::tuple{4, 4, 16}, std::tuple{3, 5, 64}, std::tuple{1, 16, 16},
                                        std::tuple{8, 1, 64}, std::tuple{4, 7, 16}})
    for (const bool split : {false, true}) {
      SCOPED_TRACE("group " + std::to_string(group) + ", rows " + std::to_string(rows) + ", page " +
                   std::to_string(ps) + (split ? ", split" : ", whole"));
      const RowsProblem p = make_rows_problem({20000, 70, 1000}, 2, group, 128, ps, rows, 5u + uint32_t(rows));
      RowsDevice dp;
      rows_setup(dp, p, rows_plan(p, split));
      poison(dp);
      cuda::decode_attention(dp.args, nullptr);  // outside the race: module loading, attributes
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      const cuda::DeviceBuffer<cuda::bf16> q = to_device_bf16_bits(p.q), k = to_device_bf16_bits(p.k),
                                           v = to_device_bf16_bits(p.v);
      std::vector<test::CopyRange> ranges = {{dp.q.data(), q.data(), uint32_t(dp.q.bytes())}};
      const uint32_t row_bytes = uint32_t(p.head_dim) * 2;
      for (int s = 0; s < p.batch; ++s)
        for (int pos = p.seq_lens[size_t(s)] - rows; pos < p.seq_lens[size_t(s)]; ++pos) {
          const int page = p.block_table[size_t(s) * p.max_pages + pos / p.page_size];
          for (int h = 0; h < p.n_kv_heads; ++h) {
            const size_t at = ((size_t(page) * p.n_kv_heads + h) * p.page_size + pos % p.page_size) * p.head_dim;
            ranges.push_back({dp.k.data() + at, k.data() + at, row_bytes});
            ranges.push_back({dp.v.data() + at, v.data() + at, row_bytes});
          }
        }
      const cuda::DeviceBuffer<test::CopyRange> d_ranges = to_device(ranges);
      poison(dp);
      for (const test::CopyRange& r : ranges) LY_CUDA_CHECK(cudaMemset(r.dst, 0xFF, r.bytes));  // bf16 NaN
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      test::launch_slow_producer(d_ranges.data(), int(ranges.size()), 2'000'000, nullptr);
      cuda::decode_attention(dp.args, nullptr);
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      expect_rows_close(test::to_host_bf16(dp.out), rows_reference(p), p);
    }
}

}  // namespace
}  // namespace lychee

#else
TEST(DecodeAttentionRows, NotBuilt) { LY_CUDA_NOT_BUILT("the decode attention rows_per_seq tests"); }
#endif  // LYCHEE_HAS_CUDA
