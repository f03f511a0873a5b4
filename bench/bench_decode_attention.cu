// Decode attention benchmark: batch x context x sparse-head share sweep at Llama-3-8B's attention
// shape (32 query / 8 KV heads, d = 128, page 64), random bf16 data in a shuffled page order,
// against a device-to-device copy measured in the same run. Share s/8: the last s KV heads are
// sparse heads reading --sparse-frac of their pages (a random ascending set that ends with the
// last page, through unit lists as LycheeDecode's selections are), the others are retrieval heads
// reading every page and emitting their page scores (the fused scoring), all in one launch;
// share 0 is plain dense attention. Prints a table (time, GB/s of the K+V bytes actually
// touched, % of copy bandwidth, speedup over dense) and writes JSON with --json FILE.
// --no-scores: the retrieval heads of mixed shares emit no page scores (what a per-head decode
// without fused scoring, e.g. FlashInfer's, does), to time the scoring's share of a mixed launch.
// --kv-cache-dtype fp8: FP8 pages (e4m3 codes and one f32 scale per token and KV head,
// core/kv_dtype.h); the bytes counted are the codes and scales the call reads (d + 4 per token
// and head for K and for V, against 2 d with bf16).
//
//   bench_decode_attention [--json FILE] [--batches 1,2,4,8] [--contexts 16384,32768,65536,131072]
//                          [--shares 0,4,5,6,7,8] [--sparse-frac 0.1] [--reps 100] [--warmup 20] [--tag TEXT]
//                          [--no-scores] [--kv-cache-dtype bf16|fp8]
//
// Timing: CUDA events around each call (both kernels), after warm-up; the median of --reps calls
// (at least 50); each call also timed as a CUDA-graph replay (the production path). Input sets
// (page tables, q) are rotated so that at least 400 MB of KV is touched per rotation: the H100's
// 50 MB L2 cannot serve repeats.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_env.h"
#include "cuda/common/common.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/kernels/kernels.h"
#include "cuda/common/device_buffer.h"

namespace {

using namespace lychee::cuda;

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 64;
constexpr double kRotateBytes = 400e6;

// Uniform values in [-amp, amp) from a hash of the index: random, never all zeros, fast to make.
__global__ void fill_random(bf16* x, size_t n, uint64_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(amp * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f));
  }
}

void randomize(DeviceBuffer<bf16>& b, uint64_t seed, float amp) {
  fill_random<<<1024, 256>>>(b.data(), b.size(), seed, amp);
  LY_CUDA_CHECK_LAUNCH();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

struct Options {
  std::string json, tag;
  std::vector<int> batches = {1, 2, 4, 8}, contexts = {16384, 32768, 65536, 131072};
  std::vector<int> shares = {0, 4, 5, 6, 7, 8};
  double sparse_frac = 0.1;
  int reps = 100, warmup = 20;
  bool scores = true;  // retrieval heads of mixed shares emit their page scores (fused scoring)
  bool fp8 = false;    // --kv-cache-dtype fp8
};

struct Row {
  int batch, context, share, n_sets, n_items, n_slots;
  double kv_bytes, us, us_graph, us_min;  // kv_bytes: K + V bytes the call touches
};

// Times `call(set)` rotating over the sets: events around each call, median in microseconds.
template <typename F>
std::pair<double, double> time_calls(int n_sets, int warmup, int reps, F&& call) {
  for (int i = 0; i < warmup; ++i) call(i % n_sets);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) LY_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    LY_CUDA_CHECK(cudaEventRecord(ev[2 * i]));
    call(i % n_sets);
    LY_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    LY_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us.push_back(ms * 1e3);
  }
  for (auto& e : ev) LY_CUDA_CHECK(cudaEventDestroy(e));
  return {median(us), *std::min_element(us.begin(), us.end())};
}

Row bench_one(int batch, int context, int share, const Options& opt) {
  const int pages_per_seq = context / kPageSize;
  const size_t page_elems = size_t(kKvHeads) * kPageSize * kHeadDim;
  const int n_dense = kKvHeads - share;
  const int sparse_pages = std::max(1, int(std::ceil(opt.sparse_frac * pages_per_seq)));
  // K + V of one (page, KV head): bf16, or FP8 codes and scales
  const double token_head_bytes = opt.fp8 ? double(kHeadDim + sizeof(float)) : double(kHeadDim * sizeof(bf16));
  const double bytes_per_page = 2.0 * kPageSize * token_head_bytes;
  const double kv_bytes = bytes_per_page * batch * (double(n_dense) * pages_per_seq + double(share) * sparse_pages);
  const double pool_bytes = 2.0 * batch * double(context) * kKvHeads * token_head_bytes;
  const int n_sets = std::clamp(int(std::ceil(kRotateBytes / std::max(kv_bytes, 1.0))), 1,
                                std::max(1, int(2 * kRotateBytes / pool_bytes)));
  const size_t set_pages = size_t(batch) * pages_per_seq;

  const size_t pool_elems = set_pages * n_sets * page_elems;
  DeviceBuffer<bf16> k(opt.fp8 ? 0 : pool_elems), v(k.size());
  DeviceBuffer<uint8_t> k8(opt.fp8 ? pool_elems : 0), v8(k8.size());
  DeviceBuffer<float> ks(opt.fp8 ? pool_elems / kHeadDim : 0), vs(ks.size());
  DeviceBuffer<bf16> q(size_t(n_sets) * batch * kHeads * kHeadDim), out(size_t(batch) * kHeads * kHeadDim);
  if (opt.fp8) {  // values ~ N(0, 1) as FP8 pages hold them: codes of std 64, scale 1/64
    fill_normal_e4m3(k8.data(), k8.size(), 11, 64.0f, nullptr);
    fill_normal_e4m3(v8.data(), v8.size(), 12, 64.0f, nullptr);
    fill_const_f32(ks.data(), ks.size(), 1.0f / 64.0f, nullptr);
    fill_const_f32(vs.data(), vs.size(), 1.0f / 64.0f, nullptr);
  } else {
    randomize(k, 11, 1.0f);
    randomize(v, 12, 1.0f);
  }
  randomize(q, 13, 1.0f);

  // Set s owns pages [s * set_pages, (s + 1) * set_pages) of the pool, in shuffled order.
  std::mt19937 rng(uint32_t(batch * 131 + context + share));
  std::vector<int32_t> ids(set_pages * n_sets);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  DeviceBuffer<int32_t> table(ids.size());
  LY_CUDA_CHECK(cudaMemcpy(table.data(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  // Sparse heads' selections: sparse_pages logical pages, ascending, the last page included.
  std::vector<int32_t> lists(size_t(batch) * kKvHeads * sparse_pages), counts(size_t(batch) * kKvHeads, sparse_pages);
  std::vector<int32_t> all(size_t(pages_per_seq - 1));
  for (size_t r = 0; r < counts.size(); ++r) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + (sparse_pages - 1));
    std::copy_n(all.begin(), sparse_pages - 1, lists.begin() + r * sparse_pages);
    lists[r * sparse_pages + sparse_pages - 1] = pages_per_seq - 1;
  }
  DeviceBuffer<int32_t> d_lists(lists.size()), d_counts(counts.size());
  DeviceBuffer<float> scores(size_t(batch) * kKvHeads * (context / 16 + 1));
  LY_CUDA_CHECK(cudaMemcpy(d_lists.data(), lists.data(), lists.size() * 4, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(d_counts.data(), counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));

  const std::vector<int32_t> lens(size_t(batch), context);
  std::vector<DecodeHeadWork> heads = dense_decode_heads(lens, kKvHeads, kHeads / kKvHeads, kPageSize, pages_per_seq);
  for (DecodeHeadWork& h : heads) {
    const int row = h.seq * kKvHeads + h.kv_head;
    if (h.kv_head < n_dense) {
      if (share > 0 && opt.scores) h.score = ScoreKind::kGroupChunk16;  // retrieval heads score their pages
      continue;
    }
    h.kind = ListKind::kUnits;
    h.list = row * sparse_pages;
    h.count = row;
    h.n_entries = sparse_pages;
  }
  const int sm_count = device_info().sm_count, ctas = decode_attention_ctas_per_sm(kHeadDim, kPageSize);
  // LYCHEE_DECODE_WAVES (lab switch): plan this many waves of CTAs instead of one.
  const char* waves_env = std::getenv("LYCHEE_DECODE_WAVES");
  const int waves = waves_env != nullptr ? std::max(1, std::atoi(waves_env)) : 1;
  const DecodePlan plan =
      plan_decode(heads, batch, kHeads, kKvHeads, sm_count, ctas * waves, 2 * kPageSize, 4 * sm_count * ctas);
  const int n_items = int(plan.items.size());
  DeviceBuffer<int32_t> d_lens(lens.size()), d_n_items(1), d_mb(plan.merge_begin.size()), d_mc(plan.merge_count.size());
  DeviceBuffer<DecodeWorkItem> d_items(plan.items.size());
  LY_CUDA_CHECK(cudaMemcpy(d_lens.data(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(d_n_items.data(), &n_items, 4, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(d_mb.data(), plan.merge_begin.data(), plan.merge_begin.size() * 4, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(d_mc.data(), plan.merge_count.data(), plan.merge_count.size() * 4, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(d_items.data(), plan.items.data(), plan.items.size() * sizeof(DecodeWorkItem),
                           cudaMemcpyHostToDevice));
  DeviceBuffer<float> partial_o(size_t(n_items) * (kHeads / kKvHeads) * kHeadDim), partial_lse(size_t(n_items) * (kHeads / kKvHeads));

  std::vector<DecodeAttentionArgs> args(static_cast<size_t>(n_sets));
  for (int s = 0; s < n_sets; ++s) {
    DecodeAttentionArgs& a = args[s];
    a.q = q.data() + size_t(s) * batch * kHeads * kHeadDim;
    if (opt.fp8) {
      a.k8_pool = k8.data(), a.v8_pool = v8.data(), a.k_scale = ks.data(), a.v_scale = vs.data();
    } else {
      a.k_pool = k.data(), a.v_pool = v.data();
    }
    a.block_table = table.data() + size_t(s) * set_pages;
    a.max_pages = pages_per_seq;
    a.unit_lists = d_lists.data();
    a.list_counts = d_counts.data();
    a.seq_lens = d_lens.data();
    a.items = d_items.data();
    a.n_items = d_n_items.data();
    a.merge_begin = d_mb.data();
    a.merge_count = d_mc.data();
    a.partial_o = partial_o.data();
    a.partial_lse = partial_lse.data();
    a.out = out.data();
    a.scores = scores.data();
    a.score_stride = context / 16 + 1;
    a.batch = batch;
    a.n_heads = kHeads;
    a.n_kv_heads = kKvHeads;
    a.head_dim = kHeadDim;
    a.page_size = kPageSize;
    a.max_items = n_items;
    a.scale = 1.0f / std::sqrt(float(kHeadDim));
  }

  // Eager launches.
  const auto [us, us_min] = time_calls(n_sets, opt.warmup, opt.reps, [&](int s) { decode_attention(args[s], nullptr); });

  // Sanity: every output finite.
  std::vector<bf16> host(out.size());
  LY_CUDA_CHECK(cudaMemcpy(host.data(), out.data(), out.bytes(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < host.size(); ++i)
    if (!std::isfinite(__bfloat162float(host[i]))) {
      std::fprintf(stderr, "non-finite output at %zu (batch %d, context %d)\n", i, batch, context);
      std::exit(1);
    }

  // Graph replays, one graph per input set.
  cudaStream_t stream;
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> execs(static_cast<size_t>(n_sets));
  for (int s = 0; s < n_sets; ++s) {
    cudaGraph_t g;
    LY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    decode_attention(args[s], stream);
    LY_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    LY_CUDA_CHECK(cudaGraphInstantiate(&execs[s], g, 0));
    LY_CUDA_CHECK(cudaGraphDestroy(g));
  }
  const auto [us_graph, unused] = time_calls(n_sets, opt.warmup, opt.reps, [&](int s) {
    LY_CUDA_CHECK(cudaGraphLaunch(execs[s], nullptr));
  });
  (void)unused;
  for (auto e : execs) LY_CUDA_CHECK(cudaGraphExecDestroy(e));
  LY_CUDA_CHECK(cudaStreamDestroy(stream));
  return {batch, context, share, n_sets, n_items, plan.n_slots, kv_bytes, us, us_graph, us_min};
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n' || c == '\t') c = ' ';
    o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--json") opt.json = next, ++i;
    else if (a == "--tag") opt.tag = next, ++i;
    else if (a == "--batches") opt.batches = parse_list(next), ++i;
    else if (a == "--contexts") opt.contexts = parse_list(next), ++i;
    else if (a == "--shares") opt.shares = parse_list(next), ++i;
    else if (a == "--sparse-frac") opt.sparse_frac = std::atof(next), ++i;
    else if (a == "--no-scores") opt.scores = false;
    else if (a == "--kv-cache-dtype" && (std::string(next) == "bf16" || std::string(next) == "fp8"))
      opt.fp8 = std::string(next) == "fp8", ++i;
    else if (a == "--reps") opt.reps = std::max(50, std::atoi(next)), ++i;
    else if (a == "--warmup") opt.warmup = std::max(1, std::atoi(next)), ++i;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    if (!cuda_available()) {
      std::fprintf(stderr, "no CUDA device\n");
      return 1;
    }
    const DeviceInfo& dev = device_info();
    const double copy_bw = device_copy_bandwidth_gbps() * 1e9;
    std::printf("%s, %d SMs, %s\n", dev.name, dev.sm_count, lychee::bench::driver_string().c_str());
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_bw / 1e9);
    std::printf("decode attention: %d q / %d kv heads, d %d, page %d, %s KV; %d CTAs/SM\n", kHeads, kKvHeads, kHeadDim,
                kPageSize, opt.fp8 ? "fp8" : "bf16", decode_attention_ctas_per_sm(kHeadDim, kPageSize));
    std::vector<Row> rows;
    for (int b : opt.batches)
      for (int c : opt.contexts)
        for (int sh : opt.shares) {
          rows.push_back(bench_one(b, c, sh, opt));
          const Row& r = rows.back();
          std::printf("  batch %d context %6d sparse %d/8: %8.1f us (graph %8.1f us), %zu items\n", b, c, sh, r.us,
                      r.us_graph, size_t(r.n_items));
          std::fflush(stdout);
        }
    // The dense row (share 0) of the same batch and context, for the speedup column.
    auto dense_us = [&](const Row& r) {
      for (const Row& d : rows)
        if (d.batch == r.batch && d.context == r.context && d.share == 0) return d.us_graph;
      return 0.0;
    };

    std::printf("\n| batch | context | sparse | touched MB | items | µs | GB/s | %% copy | graph µs | GB/s | %% copy | vs dense |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      const double d = dense_us(r);
      std::printf("| %d | %dK | %d/8 | %.0f | %d | %.1f | %.0f | %.1f | %.1f | %.0f | %.1f | %s |\n", r.batch,
                  r.context / 1024, r.share, r.kv_bytes / 1e6, r.n_items, r.us, r.kv_bytes / r.us / 1e3,
                  100.0 * r.kv_bytes / (r.us * 1e-6) / copy_bw, r.us_graph, r.kv_bytes / r.us_graph / 1e3,
                  100.0 * r.kv_bytes / (r.us_graph * 1e-6) / copy_bw,
                  d > 0 ? (std::to_string(d / r.us_graph).substr(0, 5) + "x").c_str() : "-");
    }

    if (!opt.json.empty()) {
      FILE* f = std::fopen(opt.json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "cannot write %s\n", opt.json.c_str());
        return 1;
      }
      char date[64];
      const std::time_t now = std::time(nullptr);
      std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
      std::fprintf(f, "{\n  \"benchmark\": \"decode_attention\",\n  \"gpu\": \"%s\",\n  \"sm_count\": %d,\n",
                   json_escape(dev.name).c_str(), dev.sm_count);
      std::fprintf(f, "  \"driver\": \"%s\",\n  \"date\": \"%s\",\n  \"command\": \"%s\",\n  \"tag\": \"%s\",\n",
                   json_escape(lychee::bench::driver_string()).c_str(), date, json_escape(command).c_str(), json_escape(opt.tag).c_str());
      std::fprintf(f, "  \"copy_bandwidth_gbs\": %.1f,\n", copy_bw / 1e9);
      std::fprintf(f, "  \"shape\": {\"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"page_size\": %d, "
                      "\"dtype\": \"%s\"},\n  \"sparse_frac\": %.3f,\n  \"reps\": %d,\n  \"rows\": [\n",
                   kHeads, kKvHeads, kHeadDim, kPageSize, opt.fp8 ? "fp8" : "bf16", opt.sparse_frac, opt.reps);
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "    {\"batch\": %d, \"context\": %d, \"sparse_share\": %d, \"kv_bytes\": %.0f, \"input_sets\": %d, \"items\": %d, "
                     "\"slots\": %d, \"us_median\": %.2f, \"us_min\": %.2f, \"us_graph_median\": %.2f, "
                     "\"gbs\": %.1f, \"gbs_graph\": %.1f, \"pct_copy\": %.2f, \"pct_copy_graph\": %.2f}%s\n",
                     r.batch, r.context, r.share, r.kv_bytes, r.n_sets, r.n_items, r.n_slots, r.us, r.us_min, r.us_graph,
                     r.kv_bytes / r.us / 1e3, r.kv_bytes / r.us_graph / 1e3,
                     100.0 * r.kv_bytes / (r.us * 1e-6) / copy_bw, 100.0 * r.kv_bytes / (r.us_graph * 1e-6) / copy_bw,
                     i + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
      std::printf("\nwrote %s\n", opt.json.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
