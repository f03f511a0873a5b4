// Prefill attention benchmark: cuDNN's fused SDPA vs our fallback kernel, both over the paged KV
// cache, on one sequence of L tokens (32 query / 8 KV heads, d = 128, page 64), as one prompt
// (q_len = kv_len = L) and in chunks (q_len = chunk, kv_len = end of the chunk); with --tails, also
// one short chunk of Q queries at the end of the L-token cache (q_len = Q, kv_len = L: a long
// prompt's later chunks, a chat's next turn) on cuDNN, the fallback and the split-KV fallback
// (PrefillAttention's choice there), with the split's difference from cuDNN.
//
//   bench_prefill_attention [--lengths 8192,16384,32768,65536,131072] [--chunk 8192] [--no-chunked]
//                           [--reps N] [--backends cudnn,fallback] [--tails 16,64,256] [--tails-only]
//                           [--json FILE] [--commit SHA]
//
// Bound: causal FLOPs = 4 * d * H * L (L + 1) / 2 (each query attends to itself and all earlier
// tokens; QK^T and PV count 2 FLOPs a multiply-add each), over the bf16 matrix rate, ~790 TFLOP/s
// on random data on the H100 (shared/design/performance.md). Inputs are random (never zeros); at
// every L the Q and output tensors (>= 64 MiB) exceed the 50 MB L2, so nothing needs rotating.
// Timing: CUDA events around each call (each chunk loop), after one untimed warm-up call that
// also builds the cuDNN graph; the median over --reps is reported.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/prefill_attention.h"

using namespace lychee::cuda;
using Backend = PrefillAttention::Backend;

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 64;
// Rows of Q and out past the sequence: cuDNN's graph addresses a power-of-two query bucket (at
// least 64 rows), which a short chunk at the end of the sequence (--tails) would overrun.
constexpr int kQPad = 64;
constexpr double kMatrixTflops = 790.0;  // measured bf16 rate, performance.md

// Uniform values in [-1, 1) from a counter hash (never exactly zero).
__global__ void fill_random(bf16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = float((x >> 40) | 1) * (1.0f / float(1 << 23)) - 1.0f;
    p[i] = __float2bfloat16(u);
  }
}

// sums[0] += sum (a - b)^2, sums[1] += sum b^2 over n elements.
__global__ void diff_norms(const bf16* a, const bf16* b, size_t n, double* sums) {
  double e = 0.0, r = 0.0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    e += (x - y) * (x - y);
    r += y * y;
  }
  for (int o = 16; o > 0; o /= 2) {
    e += __shfl_xor_sync(0xffffffffu, e, o);
    r += __shfl_xor_sync(0xffffffffu, r, o);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&sums[0], e);
    atomicAdd(&sums[1], r);
  }
}

struct Options {
  std::vector<int> lengths = {8192, 16384, 32768, 65536, 131072};
  int chunk = 8192;
  bool chunked = true;
  int reps = 0;  // 0: by length
  std::vector<Backend> backends = {Backend::kCudnn, Backend::kFallback};
  std::vector<int> tails;  // short chunks at the end of the cache
  bool tails_only = false;
  std::string json, commit = "unknown", command;
};

struct Result {
  std::string mode, backend, used, reason;
  int L = 0, chunk = 0, reps = 0, splits = 1;
  double median_ms = 0, min_ms = 0, max_ms = 0, tflops = 0, kv_gbps = 0;
};

const char* name(Backend b) {
  return b == Backend::kCudnn ? "cudnn" : b == Backend::kFallback ? "fallback" : "split-kv";
}

// One sequence's buffers: Q and out for all L tokens, pools of exactly L / page_size pages in a
// shuffled order, and per-chunk length arrays.
struct Sequence {
  int L;
  DeviceBuffer<bf16> q, out, ref, k, v;
  DeviceBuffer<int32_t> table, q_lens, kv_lens;  // kv_lens[c] = end of chunk c (or L)
  Sequence(int L_, int chunk)
      : L(L_), q(size_t(L_ + kQPad) * kHeads * kHeadDim), out(q.size()), ref(q.size()),
        k(size_t(L_) * kKvHeads * kHeadDim), v(k.size()), table(L_ / kPageSize), q_lens(2), kv_lens(L_ / chunk + 1) {
    fill_random<<<1024, 256>>>(q.data(), q.size(), 1);
    fill_random<<<1024, 256>>>(k.data(), k.size(), 2);
    fill_random<<<1024, 256>>>(v.data(), v.size(), 3);
    LY_CUDA_CHECK_LAUNCH();
    std::vector<int32_t> ids(L_ / kPageSize);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    const int32_t lens[2] = {L_, chunk};
    std::vector<int32_t> ends;
    for (int e = chunk; e <= L_; e += chunk) ends.push_back(e);
    ends.push_back(L_);
    LY_CUDA_CHECK(cudaMemcpy(table.data(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    LY_CUDA_CHECK(cudaMemcpy(q_lens.data(), lens, sizeof lens, cudaMemcpyHostToDevice));
    LY_CUDA_CHECK(cudaMemcpy(kv_lens.data(), ends.data(), ends.size() * 4, cudaMemcpyHostToDevice));
  }
  // The whole prompt (chunk == 0) or chunk c of size `chunk`.
  PrefillAttentionArgs args(int chunk, int c, bf16* o) const {
    PrefillAttentionArgs a;
    const bool whole = chunk == 0;
    const size_t row0 = whole ? 0 : size_t(c) * chunk;
    a.q = q.data() + row0 * kHeads * kHeadDim;
    a.out = o + row0 * kHeads * kHeadDim;
    a.k_pool = k.data();
    a.v_pool = v.data();
    a.page_table = table.data();
    a.q_lens = q_lens.data() + (whole ? 0 : 1);
    a.kv_lens = whole ? q_lens.data() : kv_lens.data() + c;
    a.batch = 1;
    a.q_len_max = whole ? L : chunk;
    a.max_kv_len = whole ? L : (c + 1) * chunk;
    a.n_heads = kHeads;
    a.n_kv_heads = kKvHeads;
    a.head_dim = kHeadDim;
    a.page_size = kPageSize;
    a.n_pages = L / kPageSize;
    a.max_pages = L / kPageSize;
    a.scale = 1.0f / sqrtf(float(kHeadDim));
    return a;
  }
};

// The last `tail` queries of the sequence over its whole cache (tail_lens holds {tail, L}).
PrefillAttentionArgs tail_args(const Sequence& s, int tail, const int32_t* tail_lens, bf16* o) {
  PrefillAttentionArgs a = s.args(0, 0, o);
  const size_t row0 = size_t(s.L - tail);
  a.q = s.q.data() + row0 * kHeads * kHeadDim;
  a.out = o + row0 * kHeads * kHeadDim;
  a.q_lens = tail_lens;
  a.kv_lens = tail_lens + 1;
  a.q_len_max = tail;
  a.max_kv_len = s.L;
  return a;
}

// Runs the prompt (chunk == 0) or all its chunks once on `attn`.
void run_once(PrefillAttention& attn, const Sequence& s, int chunk, bf16* o) {
  if (chunk == 0) return attn.run(s.args(0, 0, o), nullptr);
  for (int c = 0; c < s.L / chunk; ++c) attn.run(s.args(chunk, c, o), nullptr);
}

// Median of `reps` timed calls of run() after a warm-up call (graph builds, workspace growth).
template <typename Run>
std::vector<double> time_calls(int reps, Run&& run) {
  run();
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  LY_CUDA_CHECK(cudaEventCreate(&start));
  LY_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    LY_CUDA_CHECK(cudaEventRecord(start));
    run();
    LY_CUDA_CHECK(cudaEventRecord(stop));
    LY_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    LY_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  LY_CUDA_CHECK(cudaEventDestroy(start));
  LY_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms;
}

// What ran and the median / min / max of sorted timings `ms`.
Result result_of(const PrefillAttention& attn, const std::vector<double>& ms) {
  Result r;
  r.used = name(attn.last_backend());
  r.reason = attn.fallback_reason();
  r.splits = attn.last_kv_splits();
  r.median_ms = ms[ms.size() / 2];
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  return r;
}

// A short chunk at the end of the cache: `how` is cudnn or fallback (no split) or split-kv (the
// engine's default: cuDNN unless prefill_kv_splits splits the chunk).
Result time_tail(const std::string& how, const Sequence& s, int tail, const int32_t* tail_lens, int reps, bf16* o) {
  PrefillAttention attn;
  attn.set_backend(how == "fallback" ? Backend::kFallback : Backend::kCudnn);
  attn.set_kv_splits(how == "split-kv" ? 0 : -1);
  const PrefillAttentionArgs a = tail_args(s, tail, tail_lens, o);
  const std::vector<double> ms = time_calls(reps, [&] { attn.run(a, nullptr); });
  Result r = result_of(attn, ms);
  r.mode = "tail";
  r.backend = how;
  r.L = s.L;
  r.chunk = tail;
  r.reps = reps;
  r.tflops = 4.0 * kHeadDim * kHeads * double(tail) * (double(s.L) - (tail - 1) / 2.0) / (r.median_ms * 1e-3) / 1e12;
  r.kv_gbps = double(s.L) * kKvHeads * kHeadDim * 2 * 2 / (r.median_ms * 1e-3) / 1e9;
  return r;
}

Result time_it(Backend backend, const Sequence& s, int chunk, int reps, bf16* o) {
  PrefillAttention attn;
  attn.set_backend(backend);
  attn.set_kv_splits(-1);  // the whole prompt and its big chunks: the backend as set
  const std::vector<double> ms = time_calls(reps, [&] { run_once(attn, s, chunk, o); });
  Result r = result_of(attn, ms);
  r.mode = chunk == 0 ? "prompt" : "chunked";
  r.backend = name(backend);
  r.L = s.L;
  r.chunk = chunk;
  r.reps = reps;
  const double flops = 4.0 * kHeadDim * kHeads * double(s.L) * (double(s.L) + 1) / 2;
  r.tflops = flops / (r.median_ms * 1e-3) / 1e12;
  return r;
}

// ||a - b|| / ||b|| over the whole output.
double rel_diff(const bf16* a, const bf16* b, size_t n) {
  DeviceBuffer<double> sums(2);
  LY_CUDA_CHECK(cudaMemset(sums.data(), 0, sums.bytes()));
  diff_norms<<<1024, 256>>>(a, b, n, sums.data());
  LY_CUDA_CHECK_LAUNCH();
  double h[2];
  LY_CUDA_CHECK(cudaMemcpy(h, sums.data(), sizeof h, cudaMemcpyDeviceToHost));
  return std::sqrt(h[0] / h[1]);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.command += (i ? " " : "") + std::string(argv[i]);
  auto ints = [](const char* s) {
    std::vector<int> v;
    for (const char* p = s; *p;) {
      v.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_prefill_attention: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--lengths") o.lengths = ints(next());
    else if (a == "--chunk") o.chunk = std::atoi(next());
    else if (a == "--no-chunked") o.chunked = false;
    else if (a == "--reps") o.reps = std::atoi(next());
    else if (a == "--tails") o.tails = ints(next());
    else if (a == "--tails-only") o.tails_only = true;
    else if (a == "--json") o.json = next();
    else if (a == "--commit") o.commit = next();
    else if (a == "--backends") {
      const std::string v = next();
      o.backends.clear();
      if (v.find("cudnn") != std::string::npos) o.backends.push_back(Backend::kCudnn);
      if (v.find("fallback") != std::string::npos) o.backends.push_back(Backend::kFallback);
    } else {
      std::fprintf(stderr, "usage: bench_prefill_attention [--lengths a,b,..] [--chunk N] [--no-chunked] "
                           "[--reps N] [--backends cudnn,fallback] [--tails 16,64,256] [--tails-only] [--json FILE] "
                           "[--commit SHA]\n");
      std::exit(2);
    }
  }
  for (int L : o.lengths)
    if (L <= 0 || L % kPageSize != 0 || (o.chunked && L % o.chunk != 0)) {
      std::fprintf(stderr, "bench_prefill_attention: length %d must be a multiple of %d and of the chunk %d\n", L,
                   kPageSize, o.chunk);
      std::exit(2);
    }
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  const DeviceInfo& dev = device_info();
  int driver = 0, runtime = 0;
  LY_CUDA_CHECK(cudaDriverGetVersion(&driver));
  LY_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("GPU %s (sm_%d%d), driver %d, runtime %d, cuDNN %d\n", dev.name, dev.cc_major, dev.cc_minor, driver,
              runtime, PrefillAttention::cudnn_version());
  std::printf("heads %d/%d, d %d, page %d; bound: %.0f TFLOP/s bf16\n\n", kHeads, kKvHeads, kHeadDim, kPageSize,
              kMatrixTflops);

  std::vector<Result> results;
  std::vector<std::pair<int, double>> diffs;  // per L: cuDNN vs fallback on the whole prompt
  for (int L : opt.lengths) {
    Sequence s(L, opt.chunked ? opt.chunk : L);
    const int reps = opt.reps > 0 ? opt.reps : (L <= 16384 ? 20 : L <= 32768 ? 10 : 5);
    for (int chunk : {0, opt.chunked ? opt.chunk : -1}) {
      if (chunk < 0 || (chunk == L) || opt.tails_only) continue;
      for (Backend b : opt.backends) {
        bf16* o = b == Backend::kCudnn ? s.out.data() : s.ref.data();
        results.push_back(time_it(b, s, chunk, reps, o));
        const Result& r = results.back();
        std::printf("%-8s L %6d  %-8s (ran %-8s) median %9.3f ms  [%9.3f, %9.3f]  %6.1f TFLOP/s  %5.1f%% of bound%s%s\n",
                    r.mode.c_str(), L, r.backend.c_str(), r.used.c_str(), r.median_ms, r.min_ms, r.max_ms, r.tflops,
                    100 * r.tflops / kMatrixTflops, r.reason.empty() ? "" : "  fallback: ", r.reason.c_str());
      }
    }
    if (opt.backends.size() == 2 && !opt.tails_only) {
      // Both ran the whole prompt last on chunked=false, or the chunks (which cover the same rows).
      diffs.emplace_back(L, rel_diff(s.out.data(), s.ref.data(), size_t(L) * kHeads * kHeadDim));
      std::printf("L %6d: ||cudnn - fallback|| / ||fallback|| = %.2e\n\n", L, diffs.back().second);
    }
    for (int tail : opt.tails) {
      if (tail > L) continue;
      DeviceBuffer<int32_t> tail_lens(2);
      const int32_t lens[2] = {tail, L};
      LY_CUDA_CHECK(cudaMemcpy(tail_lens.data(), lens, sizeof lens, cudaMemcpyHostToDevice));
      const int treps = std::max(reps, 10);
      for (const char* how : {"cudnn", "fallback", "split-kv"}) {
        bf16* o = std::string(how) == "split-kv" ? s.ref.data() : s.out.data();
        results.push_back(time_tail(how, s, tail, tail_lens.data(), treps, o));
        const Result& r = results.back();
        std::printf("tail %4d L %6d  %-8s (ran %-8s, %2d splits) median %8.3f ms  %6.1f TFLOP/s  KV %6.0f GB/s%s%s\n",
                    tail, L, r.backend.c_str(), r.used.c_str(), r.splits, r.median_ms, r.tflops, r.kv_gbps,
                    r.reason.empty() ? "" : "  fallback: ", r.reason.c_str());
      }
      const size_t row0 = size_t(L - tail) * kHeads * kHeadDim, n = size_t(tail) * kHeads * kHeadDim;
      const double d = rel_diff(s.ref.data() + row0, s.out.data() + row0, n);  // split-kv vs the last plain run
      std::printf("tail %4d L %6d: ||split-kv - fallback|| / ||fallback|| = %.2e\n", tail, L, d);
      if (!(d < 1e-2)) {
        std::fprintf(stderr, "bench_prefill_attention: split-KV differs from the fallback by %.2e\n", d);
        return 1;
      }
    }
  }

  std::printf("\n%-8s %7s %12s %12s %9s\n", "mode", "L", "cudnn ms", "fallback ms", "ratio");
  for (const Result& a : results)
    for (const Result& b : results)
      if (a.backend == "cudnn" && b.backend == "fallback" && a.mode == b.mode && a.L == b.L &&
          (a.mode != "tail" || a.chunk == b.chunk))
        std::printf("%-8s %7d %12.3f %12.3f %8.2fx\n", a.mode.c_str(), a.L, a.median_ms, b.median_ms,
                    b.median_ms / a.median_ms);
  for (const Result& a : results)  // tails: cuDNN against the split-KV choice
    for (const Result& b : results)
      if (a.mode == "tail" && b.mode == "tail" && a.backend == "cudnn" && b.backend == "split-kv" && a.L == b.L &&
          a.chunk == b.chunk)
        std::printf("tail %4d over %7d: cuDNN %.3f ms, split-kv (ran %s, %d splits) %.3f ms: %.2fx\n", a.chunk, a.L,
                    a.median_ms, b.used.c_str(), b.splits, b.median_ms, a.median_ms / b.median_ms);

  if (!opt.json.empty()) {
    FILE* f = std::fopen(opt.json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "bench_prefill_attention: cannot write %s\n", opt.json.c_str());
      return 1;
    }
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::fprintf(f, "{\n  \"bench\": \"prefill_attention\",\n  \"gpu\": \"%s\",\n  \"cc\": \"%d.%d\",\n",
                 json_escape(dev.name).c_str(), dev.cc_major, dev.cc_minor);
    std::fprintf(f, "  \"driver\": %d,\n  \"cuda_runtime\": %d,\n  \"cudnn\": %d,\n  \"commit\": \"%s\",\n", driver,
                 runtime, PrefillAttention::cudnn_version(), json_escape(opt.commit).c_str());
    std::fprintf(f, "  \"command\": \"%s\",\n", json_escape(opt.command).c_str());
    std::fprintf(f, "  \"date\": \"%s\",\n  \"n_heads\": %d,\n  \"n_kv_heads\": %d,\n  \"head_dim\": %d,\n", date,
                 kHeads, kKvHeads, kHeadDim);
    std::fprintf(f, "  \"page_size\": %d,\n  \"bound_tflops\": %.1f,\n  \"results\": [\n", kPageSize, kMatrixTflops);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"mode\": \"%s\", \"L\": %d, \"chunk\": %d, \"backend\": \"%s\", \"ran\": \"%s\", "
                   "\"reps\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, \"tflops\": %.2f, "
                   "\"kv_splits\": %d, \"kv_gbps\": %.1f, \"fallback_reason\": \"%s\"}%s\n",
                   r.mode.c_str(), r.L, r.chunk, r.backend.c_str(), r.used.c_str(), r.reps, r.median_ms, r.min_ms,
                   r.max_ms, r.tflops, r.splits, r.kv_gbps, json_escape(r.reason).c_str(),
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ],\n  \"rel_diff_cudnn_vs_fallback\": {");
    for (size_t i = 0; i < diffs.size(); ++i)
      std::fprintf(f, "%s\"%d\": %.3e", i ? ", " : "", diffs[i].first, diffs[i].second);
    std::fprintf(f, "}\n}\n");
    std::fclose(f);
    std::printf("\nwrote %s\n", opt.json.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_prefill_attention: error: %s\n", e.what());
  return 1;
}
