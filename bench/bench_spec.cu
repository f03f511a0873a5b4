// Self-speculative decoding's step times on the GPU (issue 39; docs/speculative.md): for each
// batch and context, a Full decode step, a LycheeDecode decode step (the draft's) and the
// verification of γ + 1 rows per sequence, two ways: the verification step (GpuRunner::verify:
// one decode step over batch x (γ + 1) rows, captured; the KV read once where group x (γ + 1) <=
// 16, once per 16 / group positions past it: the 8B's group of 4 reads it twice at γ = 4..7,
// three times at γ = 8), and the prefill pass (GpuRunner::prefill with all_logits, one pass per
// sequence; what GpuSession::verify runs where the step does not fit: γ >= 16, FP8 KV).
// Both copy every row's logits to the host as the session does; verify_step_ms is the step with
// only its last row copied (the device time plus one copy). On a model of --shape with random
// weights (decode time does not depend on the values).
//   bench_spec [--shape llama3-8b] [--contexts 32768,65536,131072] [--batches 1,4,8] [--gammas 2,4,6,8]
//              [--budget 4096] [--block-size 16] [--retrieval 32] [--steps 16] [--drafts lychee,quest,tidal]
//              [--json FILE]
// --drafts: the draft policies whose decode steps are timed (default lychee; quest: pages of 16,
// tidal: its default selection layers; each at --budget, with bench_e2e's dense layers); the JSON's
// draft_ms is the first's, draft_ms_by every one's.
// It measures times only: tokens per second need an acceptance rate, which the bench-spec stage of
// scripts/gpu/run_all.sh measures on the default model with real weights and combines with these
// times (tokens/s = batch x E[tokens per cycle] / (γ T_draft + T_verify)). A draft step is the
// batch's LycheeDecode step (drafts of every sequence batched), the verification step the
// batch's too; verify_ms is the verification step where it fits (verify_step_fits), else the
// prefill pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/policies.h"
#include "bench_env.h"
#include "core/json_io.h"
#include "cuda/common/common.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/runner/gpu_runner.h"

namespace {

using namespace lychee;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string shape = "llama3-8b";
  std::string contexts = "32768,65536,131072", batches = "1,4,8", gammas = "2,4,6,8";
  std::vector<std::string> drafts = {"lychee"};
  int budget = 4096, block_size = 16, n_retrieval = 32, steps = 16;
  std::string json_path;
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  for (long long x : bench::parse_numbers(s)) v.push_back(int(x));
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--shape") o.shape = next();
    else if (a == "--contexts") o.contexts = next();
    else if (a == "--batches") o.batches = next();
    else if (a == "--gammas") o.gammas = next();
    else if (a == "--budget") o.budget = std::stoi(next());
    else if (a == "--block-size") o.block_size = std::stoi(next());
    else if (a == "--retrieval") o.n_retrieval = std::stoi(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--json") o.json_path = next();
    else if (a == "--drafts") {
      o.drafts = bench::parse_names(next());
      if (o.drafts.empty()) throw std::invalid_argument("--drafts: expected lychee, quest or tidal (a list)");
      for (const std::string& d : o.drafts)
        if (d != "lychee" && d != "quest" && d != "tidal")
          throw std::invalid_argument("--drafts: lychee, quest or tidal, got '" + d + "'");
    }
    else throw std::invalid_argument("unknown argument " + a);
  }
  for (int g : parse_list(o.gammas))
    if (g < 1 || g + 1 > cuda::kMaxVerifyRows)
      throw std::invalid_argument("--gammas: 1.." + std::to_string(cuda::kMaxVerifyRows - 1) + ", got " + std::to_string(g));
  return o;
}

// Milliseconds per decode step of the batch under `spec`, steps pipelined as generate runs them.
double step_ms(cuda::GpuRunner& r, std::vector<cuda::GpuSeq*>& seqs, const DecodeSpec& spec, int steps, int ctx) {
  const int batch = int(seqs.size());
  r.set_policy(spec);
  std::vector<int32_t> tokens(static_cast<size_t>(batch), 1000), out(static_cast<size_t>(batch));
  r.decode(seqs, tokens);
  r.greedy(batch, out);
  auto run = [&](int n) {
    cuda::Ticket last = r.greedy_async(batch);
    for (int i = 0; i < n; ++i) {
      r.decode(seqs, {});
      const cuda::Ticket next = r.greedy_async(batch);
      r.wait_tokens(last, out);
      last = next;
    }
    r.wait_tokens(last, out);
  };
  run(3);  // warm-up (captures the graph)
  const auto t0 = Clock::now();
  run(steps);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
  for (cuda::GpuSeq* s : seqs) r.truncate(*s, ctx);
  return ms;
}

// Milliseconds of one verification step of γ + 1 rows per sequence for the whole batch (median of
// reps, the first two, which capture its graph, not counted): every row's logits copied to the
// host (all_rows), or only the last one's.
double verify_step_ms(cuda::GpuRunner& r, std::vector<cuda::GpuSeq*>& seqs, int gamma, int reps, int ctx,
                      bool all_rows) {
  const int vocab = r.config().vocab_size, batch = int(seqs.size()), rows = batch * (gamma + 1);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) tokens[size_t(i)] = 1000 + i % (gamma + 1);
  std::vector<float> row(static_cast<size_t>(vocab));
  std::vector<double> times;
  for (int rep = 0; rep < reps + 2; ++rep) {
    const auto t0 = Clock::now();
    r.verify(seqs, tokens, gamma + 1);
    for (int i = all_rows ? 0 : rows - 1; i < rows; ++i) r.copy_logits(i, row);
    if (rep > 1) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    for (cuda::GpuSeq* s : seqs) r.truncate(*s, ctx);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Milliseconds of one prefill-pass verification of γ + 1 rows for every sequence of the batch
// (median of reps).
double verify_prefill_ms(cuda::GpuRunner& r, std::vector<cuda::GpuSeq*>& seqs, int gamma, int reps, int ctx) {
  const int vocab = r.config().vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(gamma + 1));
  for (int i = 0; i <= gamma; ++i) tokens[size_t(i)] = 1000 + i;
  std::vector<float> row(static_cast<size_t>(vocab));
  std::vector<double> times;
  for (int rep = 0; rep < reps + 1; ++rep) {
    const auto t0 = Clock::now();
    for (cuda::GpuSeq* s : seqs) {
      r.prefill(*s, tokens, /*all_logits=*/true);
      for (int i = 0; i <= gamma; ++i) r.copy_logits(i, row);
      r.truncate(*s, ctx);
    }
    if (rep > 0) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  const ModelConfig c = model_shape(opt.shape);
  const std::vector<int> contexts = parse_list(opt.contexts), batches = parse_list(opt.batches),
                         gammas = parse_list(opt.gammas);
  cuda::RunnerOptions ro;
  ro.max_batch = *std::max_element(batches.begin(), batches.end());
  ro.max_context = *std::max_element(contexts.begin(), contexts.end()) + 64;
  cuda::GpuRunner r(cuda::random_weights(c, 1234), ro);
  r.fill_kv_random(99);
  const DecodeSpec full = full_spec(c);
  std::vector<DecodeSpec> drafts;
  for (const std::string& d : opt.drafts)
    drafts.push_back(bench::bench_policy(d, c, opt.budget, opt.n_retrieval, opt.block_size));
  const auto& dev = cuda::device_info();
  std::printf("%s, %d SMs; %s random weights; LycheeDecode budget %d, block %d, %d retrieval KV heads\n", dev.name,
              dev.sm_count, c.name.c_str(), opt.budget, opt.block_size, opt.n_retrieval);
  std::printf("%6s %8s %10s %10s %6s %12s %12s %12s\n", "batch", "context", "full ms", (opt.drafts[0] + " ms").c_str(), "gamma",
              "step ms", "step+rows ms", "prefill ms");
  nlohmann::json rows = nlohmann::json::array();
  for (const int batch : batches)
    for (const int ctx : contexts) {
      std::vector<cuda::GpuSeq> seqs(static_cast<size_t>(batch));
      std::vector<cuda::GpuSeq*> ptrs;
      try {
        for (auto& s : seqs) {
          r.assume_filled(s, ctx);
          ptrs.push_back(&s);
        }
      } catch (const std::exception& e) {
        for (auto& s : seqs) r.release(s);
        std::printf("%6d %8d skipped: %s\n", batch, ctx, e.what());
        rows.push_back({{"batch", batch}, {"context", ctx}, {"skipped", e.what()}});
        continue;
      }
      const double t_full = step_ms(r, ptrs, full, opt.steps, ctx);
      nlohmann::json draft_by = nlohmann::json::object();
      for (size_t d = 0; d < drafts.size(); ++d) {
        draft_by[opt.drafts[d]] = step_ms(r, ptrs, drafts[d], opt.steps, ctx);
        if (d > 0) std::printf("%6d %8d %10s %s draft step %.3f ms\n", batch, ctx, "", opt.drafts[d].c_str(),
                               draft_by[opt.drafts[d]].get<double>());
      }
      const double t_draft = draft_by[opt.drafts[0]].get<double>();
      nlohmann::json verify = nlohmann::json::object(), step = nlohmann::json::object(),
                     step_rows = nlohmann::json::object(), prefill = nlohmann::json::object();
      for (const int g : gammas) {
        const std::string key = std::to_string(g);
        const double t_prefill = verify_prefill_ms(r, ptrs, g, 5, ctx);
        prefill[key] = t_prefill;
        if (r.verify_step_fits(batch, g + 1)) {
          const double t_step = verify_step_ms(r, ptrs, g, 5, ctx, false);
          const double t_rows = verify_step_ms(r, ptrs, g, 5, ctx, true);
          step[key] = t_step;
          step_rows[key] = t_rows;
          verify[key] = t_rows;
          std::printf("%6d %8d %10.3f %10.3f %6d %12.3f %12.3f %12.3f\n", batch, ctx, t_full, t_draft, g, t_step,
                      t_rows, t_prefill);
        } else {
          verify[key] = t_prefill;
          std::printf("%6d %8d %10.3f %10.3f %6d %12s %12s %12.3f\n", batch, ctx, t_full, t_draft, g, "-", "-",
                      t_prefill);
        }
      }
      rows.push_back({{"batch", batch}, {"context", ctx}, {"full_ms", t_full}, {"draft_ms", t_draft},
                      {"draft_ms_by", draft_by}, {"draft", opt.drafts[0]},
                      {"verify_ms", verify}, {"verify_step_ms", step}, {"verify_step_rows_ms", step_rows},
                      {"verify_prefill_ms", prefill}});
      for (auto& s : seqs) r.release(s);
    }
  if (!opt.json_path.empty()) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    const nlohmann::json j = {{"gpu", dev.name}, {"model", c.name}, {"budget", opt.budget},
                              {"block_size", opt.block_size}, {"retrieval_kv_heads", opt.n_retrieval},
                              {"verify", "verify_ms: the verification step (GpuRunner::verify, batch x (gamma + 1) "
                                         "rows, every row copied to the host) where it fits (verify_step_rows_ms; "
                                         "verify_step_ms: only the last row copied), else verify_prefill_ms (per "
                                         "sequence: GpuRunner::prefill all_logits, rows copied to the host)"},
                              {"positions_per_item", cuda::decode_positions_per_item(c.group_size(), 16)},
                              {"command", command},
                              {"commit", std::getenv("LYCHEE_COMMIT") ? std::getenv("LYCHEE_COMMIT") : "unknown"},
                              {"rows", rows}};
    write_json_file(opt.json_path, j);
  }
  return 0;
} catch (const std::invalid_argument& e) {
  std::fprintf(stderr, "bench_spec: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_spec: error: %s\n", e.what());
  return 1;
}
