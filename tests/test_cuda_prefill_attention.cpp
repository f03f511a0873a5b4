// Prefill attention over the paged KV cache (cuDNN and the fallback kernel) against a plain CPU
// double-precision causal attention on the same bf16 inputs.
//
// One batch mixes fresh prompts (kv_len == q_len) and later chunks (kv_len > q_len) at awkward
// lengths; pages are a random permutation of the pool, unused table entries hold random valid
// ids (a kernel that reads past kv_len picks up wrong data and fails), the output is poisoned
// with NaN and every valid element must be written. One tolerance: |out - ref| / |ref| <= 1e-2.
// The reference is attention_reference.h's. kv_contiguous (one sequence's pool as its one page)
// equals the gathered pages. The bucket and argument checks, which need no GPU,
// are in test_cuda_host_only.cpp.
#include <gtest/gtest.h>

#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attention_reference.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/prefill_attention.h"

namespace lychee::cuda {
namespace {

using Backend = PrefillAttention::Backend;

struct Seq {
  int q_len, kv_len;
};

// The batch every configuration runs: fresh prompts, then later chunks of longer sequences.
const std::vector<Seq> kMixedBatch = {{1, 1},   {7, 7},     {64, 64},  {100, 100},  {513, 513},
                                      {1, 300}, {7, 135},   {64, 200}, {100, 1000}, {513, 1100}};

// Host copy of one problem: bf16 values as raw bits, shapes as in PrefillAttentionArgs.
struct Problem {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  int batch = 0, q_len_max = 0, max_kv_len = 0, max_pages = 0, n_pages = 0;
  float scale = 0.0f;
  std::vector<Seq> seqs;
  std::vector<uint16_t> q;       // [batch][q_len_max][n_heads][head_dim]
  std::vector<uint16_t> k, v;    // [n_pages][n_kv_heads][page_size][head_dim]
  std::vector<int32_t> table;    // [batch][max_pages]
  std::vector<int32_t> q_lens, kv_lens;
};

// What the pool holds where no sequence has written. kRandom: rows past each kv_len hold random
// values and unused table entries point to any page (other sequences' data). kZero, kNan: rows
// past each kv_len in its last page, and the spare pages that unused table entries then point
// to, hold zeros (the production pool: zeroed at allocation) or NaN.
enum class Garbage { kRandom, kZero, kNan };

Problem make_problem(int n_kv_heads, int group, int head_dim, int page_size, const std::vector<Seq>& seqs,
                     uint64_t seed, int q_len_pad = 0, Garbage garbage = Garbage::kRandom) {
  const bool fill_garbage = garbage != Garbage::kRandom;
  Problem p;
  p.n_kv_heads = n_kv_heads;
  p.n_heads = n_kv_heads * group;
  p.head_dim = head_dim;
  p.page_size = page_size;
  p.seqs = seqs;
  p.batch = int(seqs.size());
  p.scale = 1.0f / std::sqrt(float(head_dim));
  int pages_used = 0;
  for (const Seq& s : seqs) {
    p.q_len_max = std::max(p.q_len_max, s.q_len);
    p.max_kv_len = std::max(p.max_kv_len, s.kv_len);
    pages_used += (s.kv_len + page_size - 1) / page_size;
  }
  p.q_len_max += q_len_pad;
  p.max_pages = (p.max_kv_len + page_size - 1) / page_size + 3;  // slack: entries past the last page
  p.n_pages = pages_used + 5;                                     // spare pages hold data too

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t>& x, size_t n, float stddev) {
    x.resize(n);
    for (auto& e : x) {
      float f = 0.0f;
      while (f == 0.0f) f = stddev * normal(rng);  // never zeros
      e = ::lychee::f32_to_bf16(f);
    }
  };
  const size_t pool = size_t(p.n_pages) * n_kv_heads * page_size * head_dim;
  fill(p.q, size_t(p.batch) * p.q_len_max * p.n_heads * head_dim, 2.0f);  // logits of std ~2
  fill(p.k, pool, 1.0f);
  fill(p.v, pool, 1.0f);

  std::vector<int32_t> ids(p.n_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  // Unused entries: any page (its data is another sequence's: a kernel reading it gets wrong
  // values), or with kZero / kNan a spare page (ids[pages_used..]) full of that value.
  std::uniform_int_distribution<int32_t> any_page(0, p.n_pages - 1), any_spare(pages_used, p.n_pages - 1);
  const size_t page_elems = size_t(n_kv_heads) * page_size * head_dim;
  const uint16_t garbage_bits = garbage == Garbage::kNan ? uint16_t(0x7fc0) : uint16_t(0);  // bf16 NaN or +0
  p.table.resize(size_t(p.batch) * p.max_pages);
  size_t next = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int used = (seqs[b].kv_len + page_size - 1) / page_size;
    for (int j = 0; j < p.max_pages; ++j)
      p.table[size_t(b) * p.max_pages + j] = j < used ? ids[next++] : ids[fill_garbage ? any_spare(rng) : any_page(rng)];
    if (fill_garbage) {
      const size_t last = size_t(p.table[size_t(b) * p.max_pages + used - 1]);
      for (int kvh = 0; kvh < n_kv_heads; ++kvh)
        for (int r = (seqs[b].kv_len - 1) % page_size + 1; r < page_size; ++r)
          for (int d = 0; d < head_dim; ++d) {
            const size_t at = last * page_elems + (size_t(kvh) * page_size + r) * head_dim + d;
            p.k[at] = p.v[at] = garbage_bits;
          }
    }
    p.q_lens.push_back(seqs[b].q_len);
    p.kv_lens.push_back(seqs[b].kv_len);
  }
  if (fill_garbage)
    for (int i = pages_used; i < p.n_pages; ++i) {
      std::fill_n(p.k.begin() + size_t(ids[i]) * page_elems, page_elems, garbage_bits);
      std::fill_n(p.v.begin() + size_t(ids[i]) * page_elems, page_elems, garbage_bits);
    }
  return p;
}

// Causal attention in double: ref[b][i][h][d] for i < q_len (other rows 0); query i of a chunk
// sees the kv_len - q_len earlier tokens and itself.
std::vector<double> reference(const Problem& p) {
  const int H = p.n_heads, D = p.head_dim, group = p.n_heads / p.n_kv_heads;
  std::vector<double> ref(size_t(p.batch) * p.q_len_max * H * D, 0.0);
  auto one_head = [&](int h) {
    for (int b = 0; b < p.batch; ++b) {
      const int q_len = p.seqs[b].q_len, kv_len = p.seqs[b].kv_len;
      const test::PagedSeqKv kv{p.k.data(), p.v.data(), &p.table[size_t(b) * p.max_pages], p.n_kv_heads,
                                p.page_size, D};
      for (int i = 0; i < q_len; ++i) {
        const size_t row = ((size_t(b) * p.q_len_max + i) * H + h) * D;
        const std::vector<double> o =
            test::paged_attention_reference(&p.q[row], kv, h / group, kv_len - q_len + i + 1, double(p.scale));
        std::copy(o.begin(), o.end(), ref.begin() + long(row));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int h = 0; h < H; ++h) threads.emplace_back(one_head, h);  // heads write disjoint rows
  for (auto& t : threads) t.join();
  return ref;
}

// Runs the problem on `attn` and returns the output (poisoned with NaN before the run).
std::vector<uint16_t> run_gpu(PrefillAttention& attn, const Problem& p, bool kv_contiguous = false) {
  auto q = test::to_device_bf16_bits(p.q);
  auto k = test::to_device_bf16_bits(p.k);
  auto v = test::to_device_bf16_bits(p.v);
  auto table = test::to_device(p.table);
  auto q_lens = test::to_device(p.q_lens);
  auto kv_lens = test::to_device(p.kv_lens);
  DeviceBuffer<bf16> out(p.q.size());
  LY_CUDA_CHECK(cudaMemset(out.data(), 0xff, out.bytes()));  // 0xffff is a bf16 NaN
  PrefillAttentionArgs a;
  a.q = q.data();
  a.k_pool = k.data();
  a.v_pool = v.data();
  a.page_table = table.data();
  a.q_lens = q_lens.data();
  a.kv_lens = kv_lens.data();
  a.out = out.data();
  a.batch = p.batch;
  a.q_len_max = p.q_len_max;
  a.max_kv_len = p.max_kv_len;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.page_size = p.page_size;
  a.n_pages = p.n_pages;
  a.max_pages = p.max_pages;
  a.scale = p.scale;
  a.kv_contiguous = kv_contiguous;
  attn.run(a, nullptr);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  return test::to_host_bf16_bits(out);
}

// ||out - ref|| / ||ref|| over the valid rows; every valid element must be finite (written).
// Returns "" when the output passes, else what is wrong (worst element and its index).
std::string compare(const Problem& p, const std::vector<uint16_t>& out, const std::vector<double>& ref) {
  const int H = p.n_heads, D = p.head_dim;
  double err2 = 0.0, ref2 = 0.0, worst = -1.0;
  size_t worst_at = 0, n_unwritten = 0, first_unwritten = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.seqs[b].q_len; ++i)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t at = ((size_t(b) * p.q_len_max + i) * H + h) * D + d;
          const double o = ::lychee::bf16_to_f32(out[at]);
          if (!std::isfinite(o)) {
            if (n_unwritten++ == 0) first_unwritten = at;
            continue;
          }
          const double e = std::fabs(o - ref[at]);
          err2 += e * e;
          ref2 += ref[at] * ref[at];
          if (e > worst) worst = e, worst_at = at;
        }
  auto where = [&](size_t at) {
    const size_t d = at % D, h = at / D % H, i = at / D / H % p.q_len_max, b = at / D / H / p.q_len_max;
    return "b " + std::to_string(b) + " (q_len " + std::to_string(p.seqs[b].q_len) + ", kv_len " +
           std::to_string(p.seqs[b].kv_len) + ") query " + std::to_string(i) + " head " + std::to_string(h) +
           " d " + std::to_string(d);
  };
  std::string msg;
  if (n_unwritten > 0)
    msg += std::to_string(n_unwritten) + " valid elements not written or not finite, first at " +
           where(first_unwritten) + ". ";
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-300));
  if (!(rel <= 1e-2))
    msg += "relative error " + std::to_string(rel) + "; worst |out - ref| = " + std::to_string(worst) + " at " +
           where(worst_at) + ": out " + std::to_string(::lychee::bf16_to_f32(out[worst_at])) + ", ref " +
           std::to_string(ref[worst_at]);
  return msg;
}

void expect_close(const Problem& p, const std::vector<uint16_t>& out, const std::vector<double>& ref,
                  const std::string& what) {
  const std::string msg = compare(p, out, ref);
  EXPECT_TRUE(msg.empty()) << what << ": " << msg;
}

struct Config {
  int group, head_dim, page_size;
  Backend backend;
};

std::string config_name(const testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return std::string(c.backend == Backend::kCudnn ? "Cudnn" : "Fallback") + "_G" + std::to_string(c.group) + "_D" +
         std::to_string(c.head_dim) + "_P" + std::to_string(c.page_size);
}

class PrefillAttentionTest : public testing::TestWithParam<Config> {};

// The problem and its reference, built once per (group, head_dim, page_size) and shared by both
// backends (the reference is the slow part).
const std::pair<Problem, std::vector<double>>& cached_problem(int group, int head_dim, int page_size) {
  static std::map<std::tuple<int, int, int>, std::pair<Problem, std::vector<double>>> cache;
  auto key = std::make_tuple(group, head_dim, page_size);
  auto it = cache.find(key);
  if (it == cache.end()) {
    Problem p = make_problem(2, group, head_dim, page_size, kMixedBatch, 1000 + 31 * group + head_dim + page_size);
    std::vector<double> ref = reference(p);
    it = cache.emplace(key, std::make_pair(std::move(p), std::move(ref))).first;
  }
  return it->second;
}

TEST_P(PrefillAttentionTest, MatchesCpuReference) {
  LY_REQUIRE_GPU();
  const Config c = GetParam();
  const auto& [p, ref] = cached_problem(c.group, c.head_dim, c.page_size);
  PrefillAttention attn;
  attn.set_backend(c.backend);
  const std::vector<uint16_t> out = run_gpu(attn, p);
  if (c.backend == Backend::kCudnn) {
    ASSERT_EQ(attn.last_backend(), Backend::kCudnn)
        << "cuDNN " << PrefillAttention::cudnn_version() << " was not used: " << attn.fallback_reason();
  }
  expect_close(p, out, ref, config_name(testing::TestParamInfo<Config>(c, 0)));
}

std::vector<Config> all_configs() {
  std::vector<Config> v;
  for (Backend be : {Backend::kCudnn, Backend::kFallback}) {
    for (int group : {1, 3, 4, 8})
      for (int d : {64, 128}) v.push_back({group, d, 64, be});
    for (int d : {64, 128}) v.push_back({4, d, 16, be});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(PagedCausal, PrefillAttentionTest, testing::ValuesIn(all_configs()), config_name);

// One instance, several shapes: a graph is reused across q_len_max / max_kv_len of one bucket
// (the ragged offsets, not the graph, carry the buffer's row stride) and a new bucket builds a
// second graph; every run is still right.
TEST(PrefillAttentionCache, ReusesGraphsWithinABucket) {
  LY_REQUIRE_GPU();
  PrefillAttention attn;
  const std::vector<Seq> a = {{100, 100}, {37, 90}, {1, 65}};   // q_len_max 100, kv 100: buckets 128 / 128
  const std::vector<Seq> b = {{120, 120}, {3, 110}, {77, 77}};  // q_len_max 120 (+5 pad), kv 120: same
  const std::vector<Seq> c = {{200, 700}, {5, 5}, {64, 300}};   // kv 700: a new kv bucket
  int run = 0;
  for (const auto& [seqs, pad] : {std::pair{a, 0}, std::pair{b, 5}, std::pair{c, 0}}) {
    const Problem p = make_problem(2, 4, 128, 64, seqs, 77 + run, pad);
    const std::vector<double> ref = reference(p);
    const std::vector<uint16_t> out = run_gpu(attn, p);
    ASSERT_EQ(attn.last_backend(), Backend::kCudnn) << "cuDNN was not used: " << attn.fallback_reason();
    expect_close(p, out, ref, "cached-graph run " + std::to_string(run));
    EXPECT_EQ(attn.n_graphs(), run < 2 ? 1 : 2) << "after run " << run;
    ++run;
  }
}

// Stale KV pool contents past kv_len must not reach the output. Finite stale data (another
// sequence's rows) is covered by MatchesCpuReference's random garbage. Beyond that, each backend
// is held to what it is given in production: cuDNN reads whole pages, and 0 · NaN in P·V would
// let a NaN past kv_len through, so the runner zeroes the KV pool at allocation (KvPool) and
// cuDNN sees zeros there: its instance runs on a pool whose unwritten rows are zeros. Our
// fallback kernel never reads past kv_len, so its instance runs with NaN there. Any difference
// from the reference, or an unwritten output, fails.
class PrefillAttentionGarbage : public testing::TestWithParam<Backend> {};

TEST_P(PrefillAttentionGarbage, NanPastKvLenIsIgnored) {
  LY_REQUIRE_GPU();
  const bool cudnn = GetParam() == Backend::kCudnn;
  const Problem p = make_problem(2, 4, 128, 64, kMixedBatch, 4242, 0, cudnn ? Garbage::kZero : Garbage::kNan);
  const std::vector<double> ref = reference(p);
  PrefillAttention attn;
  attn.set_backend(GetParam());
  const std::vector<uint16_t> out = run_gpu(attn, p);
  if (cudnn) {
    ASSERT_EQ(attn.last_backend(), Backend::kCudnn) << "cuDNN was not used: " << attn.fallback_reason();
  }
  expect_close(p, out, ref, cudnn ? "cuDNN, zeros past kv_len" : "fallback, NaN past kv_len");
}

INSTANTIATE_TEST_SUITE_P(PagedCausal, PrefillAttentionGarbage, testing::Values(Backend::kCudnn, Backend::kFallback),
                         [](const testing::TestParamInfo<Backend>& i) {
                           return std::string(i.param == Backend::kCudnn ? "Cudnn" : "Fallback");
                         });

// Split-KV: short chunks over longer caches (the later chunks of a long prompt) take the split
// path by default, whichever backend is set; forced slice counts cover a slice boundary inside a
// page and a tile, slices past a short sequence's keys (empty, merged with weight 0), more slices
// than most sequences have tiles, and NaN in the pool past kv_len (never read).
TEST(PrefillAttentionSplit, MatchesCpuReference) {
  LY_REQUIRE_GPU();
  const std::vector<Seq> seqs = {{1, 3000}, {7, 2500}, {64, 4000}, {100, 3100}, {33, 33}, {1, 700}};
  for (const auto& [head_dim, page_size] : {std::pair{128, 64}, std::pair{64, 16}}) {
    const Problem p = make_problem(2, 4, head_dim, page_size, seqs, 9000 + head_dim + page_size);
    const std::vector<double> ref = reference(p);
    for (int splits : {0, 2, 3, 7, 64}) {
      for (Backend be : {Backend::kCudnn, Backend::kFallback}) {
        PrefillAttention attn;
        attn.set_backend(be);
        attn.set_kv_splits(splits);
        const std::vector<uint16_t> out = run_gpu(attn, p);
        const std::string what = "d " + std::to_string(head_dim) + " page " + std::to_string(page_size) +
                                 ", splits " + (splits ? std::to_string(splits) : "auto") +
                                 (be == Backend::kCudnn ? ", cuDNN set" : ", fallback set");
        if (splits > 0) {
          ASSERT_EQ(attn.last_backend(), Backend::kSplitKv) << what;
          EXPECT_EQ(attn.last_kv_splits(), splits) << what;
        } else {  // auto: 2 query tiles x 8 heads x 6 sequences = 96 blocks, against this GPU's SMs
          const int want = prefill_kv_splits(p.batch, p.q_len_max, p.n_heads, p.head_dim, p.max_kv_len,
                                             device_info().sm_count, size_t(64) << 20);
          EXPECT_EQ(attn.last_kv_splits(), want) << what;
          EXPECT_EQ(attn.last_backend() == Backend::kSplitKv, want > 1) << what;
        }
        expect_close(p, out, ref, what);
      }
    }
  }
  {  // one short chunk over a long cache: 1 query tile x 8 heads takes the split by default
    const Problem p = make_problem(2, 4, 128, 64, {{16, 5000}}, 4242);
    PrefillAttention attn;
    const std::vector<uint16_t> out = run_gpu(attn, p);
    ASSERT_EQ(attn.last_backend(), Backend::kSplitKv);
    EXPECT_EQ(attn.last_kv_splits(), 9);  // min(ceil(2 x SMs / 8), 79 tiles / 8) on 66+ SMs
    expect_close(p, out, reference(p), "auto split, 16 queries over 5000 tokens");
  }
  const Problem nan = make_problem(2, 4, 128, 64, seqs, 4343, 0, Garbage::kNan);
  const std::vector<double> ref = reference(nan);
  PrefillAttention attn;
  attn.set_kv_splits(5);
  expect_close(nan, run_gpu(attn, nan), ref, "split-KV, NaN past kv_len");
  // Switched off, the same chunk runs on the backend set.
  attn.set_kv_splits(-1);
  attn.set_backend(Backend::kFallback);
  (void)run_gpu(attn, nan);
  EXPECT_EQ(attn.last_backend(), Backend::kFallback);
  EXPECT_EQ(attn.last_kv_splits(), 1);
}

// kv_contiguous (the trainer's context K/V): one sequence whose pool is its one page, read by
// cuDNN as it is, gives the paged problem's output bit for bit (the same graph shape over the
// same values: the paged run gathers exactly that page first), and the reference's on every
// backend (the fallback and split kernels read the one page through the table).
TEST(PrefillAttentionContiguous, EqualsGatheredPages) {
  LY_REQUIRE_GPU();
  for (const Seq seq : {Seq{300, 1000}, Seq{1000, 1000}, Seq{16, 1000}}) {
    const Problem paged = make_problem(2, 4, 128, 1024, {seq}, 5151 + seq.q_len);
    Problem one = paged;  // the sequence's page as the whole pool
    const size_t page_elems = size_t(one.n_kv_heads) * one.page_size * one.head_dim;
    const size_t first = size_t(paged.table[0]) * page_elems;
    one.k.assign(paged.k.begin() + ptrdiff_t(first), paged.k.begin() + ptrdiff_t(first + page_elems));
    one.v.assign(paged.v.begin() + ptrdiff_t(first), paged.v.begin() + ptrdiff_t(first + page_elems));
    one.table = {0};
    one.max_pages = one.n_pages = 1;
    const std::vector<double> ref = reference(paged);
    const std::string what = "q_len " + std::to_string(seq.q_len) + " kv_len " + std::to_string(seq.kv_len);
    PrefillAttention a, b;
    const std::vector<uint16_t> out_paged = run_gpu(a, paged), out_one = run_gpu(b, one, true);
    EXPECT_EQ(a.last_backend(), b.last_backend()) << what;
    if (a.last_backend() == Backend::kCudnn) {
      EXPECT_EQ(out_one, out_paged) << what << ": kv_contiguous against the gathered page";
    }
    expect_close(one, out_one, ref, what + ", kv_contiguous");
    PrefillAttention f;
    f.set_backend(Backend::kFallback);
    f.set_kv_splits(-1);
    expect_close(one, run_gpu(f, one, true), ref, what + ", kv_contiguous, fallback");
  }
  PrefillAttention attn;
  const Problem two = make_problem(2, 4, 128, 1024, {{10, 10}, {10, 10}}, 5252);  // max_pages 4
  EXPECT_THROW(run_gpu(attn, two, true), Error) << "kv_contiguous with a table of several pages";
}

}  // namespace
}  // namespace lychee::cuda

#else
TEST(PrefillAttentionTest, NotBuilt) { LY_CUDA_NOT_BUILT("the prefill attention kernel tests"); }
#endif  // LYCHEE_HAS_CUDA
