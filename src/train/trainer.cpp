#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "train/heatmap.h"
#include "train/optim.h"

namespace lychee::train {

namespace fs = std::filesystem;

RoleDecision parse_role_decision(const std::string& name) {
  if (name == "threshold") return RoleDecision::kThreshold;
  if (name == "top-n" || name == "topn") return RoleDecision::kTopN;
  fail(ErrorCode::kInvalidArgument, "unknown role decision '{}' (expected threshold or top-n)", name);
}

namespace {

const char* decision_name(RoleDecision d) { return d == RoleDecision::kTopN ? "top-n" : "threshold"; }

// The gate noise of step s and rank r: a stream of its own, so a resumed run draws what it would
// have; rank 0's is the single-rank run's.
std::mt19937_64 step_rng(uint64_t seed, int step, int rank = 0) {
  uint64_t x = seed + 0xD1B54A32D192ED03ull * uint64_t(rank) + 0x9E3779B97F4A7C15ull * (uint64_t(step) + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return std::mt19937_64(x ^ (x >> 31));
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    LY_CHECK(f.good(), ErrorCode::kInvalidArgument, "cannot write {}", tmp.string());
    f << text;
    f.flush();
    LY_CHECK(f.good(), ErrorCode::kInvalidArgument, "writing {} failed", tmp.string());
  }
  fs::rename(tmp, path);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int t = int(std::lround(s));
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60) : fmt::format("{}m{:02}s", t / 60, t % 60);
}

int count_above_half(const std::vector<double>& ez, int n_kv) {
  int n = 0;
  for (size_t i = size_t(n_kv); i < ez.size(); ++i) n += ez[i] > 0.5;
  return n;
}

struct History {
  std::vector<int> steps;                   // [n_snapshots]
  std::vector<std::vector<double>> values;  // [n_snapshots][n_layers · n_kv_heads] E[z]
  std::vector<std::vector<double>> params;  // [n_snapshots][n_params] the gates' raw parameters
};

// Snapshots: every snapshot_every steps, the last step, and the steps the paper draws the gate
// densities at (100, 200, 500, 1000), so a run of any length has them.
bool snapshot_step(int done, int every, bool last) {
  return done % every == 0 || last || done == 100 || done == 200 || done == 500 || done == 1000;
}

constexpr const char* kCsvHeader =
    "step,loss,lambda,expected_l0,n_above_half,lr,context_tokens,target_tokens,step_ms\n";

void check_train_options(const ModelConfig& c, const TrainOptions& o) {
  const int n_gated = (c.n_layers - 1) * c.n_kv_heads;
  LY_CHECK(c.n_layers >= 2, ErrorCode::kInvalidArgument,
           "train-heads: the model has {} layer(s); gates live in layers >= 1", c.n_layers);
  LY_CHECK(o.n_retrieval >= 1 && o.n_retrieval <= n_gated, ErrorCode::kInvalidArgument,
           "train-heads: --retrieval-heads {} out of range [1, {}] (KV heads of layers 1..{})", o.n_retrieval,
           n_gated, c.n_layers - 1);
  LY_CHECK(o.steps >= 1, ErrorCode::kInvalidArgument, "train-heads: --steps must be >= 1 (got {})", o.steps);
  LY_CHECK(o.lr > 0 && std::isfinite(o.lr), ErrorCode::kInvalidArgument, "train-heads: --lr must be > 0");
  LY_CHECK(o.lambda_lr >= 0 && o.lambda_init >= 0, ErrorCode::kInvalidArgument,
           "train-heads: λ and its step size must be >= 0");
  LY_CHECK(!o.out_dir.empty(), ErrorCode::kInvalidArgument, "train-heads: no output directory");
}

// A checkpoint resumes only on the model it was written for.
nlohmann::json model_identity(const ModelConfig& c) {
  return {{"name", c.name}, {"n_layers", c.n_layers}, {"n_kv_heads", c.n_kv_heads}};
}

// Mean of the last 5% of the losses (at least one).
double tail_mean(const std::vector<double>& losses) {
  const size_t tail = std::max<size_t>(1, losses.size() / 20);
  double sum = 0.0;
  for (size_t i = losses.size() - std::min(tail, losses.size()); i < losses.size(); ++i) sum += losses[i];
  return sum / double(std::min(tail, losses.size()));
}

struct StepStats {
  double loss;  // scaled distillation loss
  double l0;    // E‖z‖₀ at the parameters the step started from
  double lr;    // after the schedule
};

using Clock = std::chrono::steady_clock;

// One call of train_head_roles. The members are built in the order the steps first need them:
// a resumed run starts from a fresh run's gates and optimisers and overwrites them.
struct Run {
  Run(const ModelConfig& c, std::span<Student* const> ranks, const TrainData& data, const TrainOptions& o,
      const TrainProgress& progress, const GradientReduce& reduce, const fs::path& out)
      : c(c), student(*ranks[0]), ranks(ranks.begin(), ranks.end()), n_ranks(int(ranks.size())), reduce(reduce),
        data(data), o(o), progress(progress), out(out),
        ckpt_path(out / "checkpoint.json"), csv_path(out / "train_log.csv"),
        gates(o.gate, c.n_layers, c.n_kv_heads, GateOptions{}), params(gates.params()),
        adam(int(params.size()), AdamWOptions{.weight_decay = o.weight_decay}),
        lagrange{o.lambda_init, o.lambda_lr},
        snapshot_every(o.snapshot_every > 0 ? o.snapshot_every : std::max(1, o.steps / 60)),
        model_id(model_identity(c)), end(o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps) {}

  void resume();
  void load_checkpoint();
  void save_checkpoint(int next_step, double seconds) const;
  void train();
  StepStats optimise(int step, std::span<const TrainSample> samples, double loss_scale);
  void for_each_rank(const std::function<void(int rank)>& pass) const;
  void log_step(int step, const StepStats& s, const TrainSample& sample, double step_ms,
                const std::vector<double>& ez, double window_mean_loss);
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  TrainResult finish(const nlohmann::json& provenance);
  nlohmann::json role_provenance(const nlohmann::json& provenance, double total_seconds) const;
  void write_heatmap(const TrainResult& r, const std::vector<uint8_t>& roles) const;
  void write_gate_history(const std::vector<uint8_t>& roles) const;
  nlohmann::json summary(const TrainResult& r, double total_seconds) const;

  const ModelConfig& c;
  Student& student;                 // rank 0's (its options are every rank's)
  const std::vector<Student*> ranks;
  const int n_ranks;
  const GradientReduce& reduce;
  const TrainData& data;
  const TrainOptions& o;
  const TrainProgress& progress;
  const fs::path out, ckpt_path, csv_path;
  GateSet gates;
  std::span<double> params;  // the gates' own storage
  AdamW adam;
  Lagrangian lagrange;
  History history;
  std::vector<double> losses;  // every step's loss (for the summary)
  int start = 0;
  double resumed_seconds = 0.0;  // wall time of the runs this one resumes
  const int snapshot_every;
  const nlohmann::json model_id;
  const int end;  // one past the last step this run takes
  std::ofstream csv;
  std::vector<std::vector<float>> z, dz;  // [n_ranks][n_layers · n_kv_heads] gate samples and dloss/dz
  std::vector<std::vector<double>> grad;  // [n_ranks][n_params]; rank 0's holds the step's gradient
  std::vector<GateSet> rank_gates;        // [n_ranks − 1] ranks 1.. sample from copies of `gates`
  Clock::time_point t0;
  double run_seconds = 0.0;  // wall time of this run's steps
};

void Run::resume() {
  LY_CHECK(fs::exists(ckpt_path), ErrorCode::kNotFound, "train-heads --resume: no checkpoint at {}",
           ckpt_path.string());
  load_checkpoint();
  // Keep the CSV rows of the steps the checkpoint covers.
  std::string kept = kCsvHeader, line;
  std::ifstream f(csv_path);
  std::getline(f, line);
  while (std::getline(f, line)) {
    const int step = std::atoi(line.c_str());
    if (!line.empty() && step < start) kept += line + "\n";
  }
  write_text_atomic(csv_path, kept);
  if (progress) progress(fmt::format("resuming from step {} of {} ({})", start, o.steps, ckpt_path.string()));
}

void Run::load_checkpoint() {
  nlohmann::json j;
  try {
    std::ifstream f(ckpt_path);
    j = nlohmann::json::parse(f);
    LY_CHECK(j.at("format") == "lychee-train-checkpoint", ErrorCode::kInvalidFile, "{}: not a training checkpoint",
             ckpt_path.string());
    LY_CHECK(j.at("model") == model_id, ErrorCode::kInvalidArgument,
             "{}: written for model {}, resumed with {}", ckpt_path.string(), j.at("model").dump(), model_id.dump());
    LY_CHECK(j.at("gate") == gate_kind_name(o.gate) && j.at("n_retrieval") == o.n_retrieval &&
                 j.at("steps") == o.steps && j.at("seed") == o.seed,
             ErrorCode::kInvalidArgument,
             "{}: gate {}, retrieval heads {}, steps {}, seed {} differ from this run's {}, {}, {}, {}",
             ckpt_path.string(), j.at("gate").dump(), j.at("n_retrieval").dump(), j.at("steps").dump(),
             j.at("seed").dump(), gate_kind_name(o.gate), o.n_retrieval, o.steps, o.seed);
    // Checkpoints from before data parallelism ran one sample per step.
    LY_CHECK(j.value("ranks", 1) == n_ranks, ErrorCode::kInvalidArgument,
             "{}: written with {} sample(s) per step (data-parallel ranks), resumed with {}", ckpt_path.string(),
             j.value("ranks", 1), n_ranks);
    const auto p = j.at("params").get<std::vector<double>>();
    LY_CHECK(p.size() == params.size(), ErrorCode::kInvalidFile, "{}: {} gate parameters, expected {}",
             ckpt_path.string(), p.size(), params.size());
    std::copy(p.begin(), p.end(), params.begin());
    adam.load_json(j.at("adam"));
    lagrange.lambda = j.at("lambda").get<double>();
    start = j.at("step").get<int>();
    history.steps = j.at("history_steps").get<std::vector<int>>();
    history.values = j.at("history_values").get<std::vector<std::vector<double>>>();
    // Checkpoints written before the parameters were kept have none: the history restarts here.
    if (j.contains("history_params"))
      history.params = j.at("history_params").get<std::vector<std::vector<double>>>();
    losses = j.at("losses").get<std::vector<double>>();
    resumed_seconds = j.at("seconds").get<double>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidFile, "{}: malformed checkpoint: {}", ckpt_path.string(), e.what());
  }
  LY_CHECK(start >= 0 && start <= o.steps && losses.size() == size_t(start), ErrorCode::kInvalidFile,
           "{}: inconsistent step {} ({} losses)", ckpt_path.string(), start, losses.size());
}

void Run::save_checkpoint(int next_step, double seconds) const {
  nlohmann::json j = {{"format", "lychee-train-checkpoint"}, {"version", 1}, {"model", model_id},
                      {"gate", gate_kind_name(o.gate)}, {"n_retrieval", o.n_retrieval}, {"steps", o.steps},
                      {"seed", o.seed}, {"ranks", n_ranks}, {"step", next_step},
                      {"params", std::vector<double>(params.begin(), params.end())},
                      {"adam", adam.to_json()}, {"lambda", lagrange.lambda},
                      {"history_steps", history.steps}, {"history_values", history.values},
                      {"history_params", history.params}, {"losses", losses}, {"seconds", seconds}};
  write_text_atomic(ckpt_path, j.dump());
}

void Run::train() {
  csv.open(csv_path, std::ios::app);
  const size_t n_heads = size_t(c.n_layers) * size_t(c.n_kv_heads);
  z.assign(size_t(n_ranks), std::vector<float>(n_heads));
  dz.assign(size_t(n_ranks), std::vector<float>(n_heads));
  grad.assign(size_t(n_ranks), std::vector<double>(params.size()));
  if (start == 0 && history.steps.empty()) {
    history.steps.push_back(0);
    history.values.push_back(gates.expected_z());
    history.params.emplace_back(params.begin(), params.end());
  }

  const double loss_scale = student.options().loss == DistillLoss::kLogits ? 1.0 / c.vocab_size : 1.0;
  t0 = Clock::now();
  double window_loss = 0.0;
  int window_n = 0;
  // The samples of step s + 1 are generated on a second thread while step s runs (TrainData::sample
  // is pure and thread-safe; finite datasets wrap, reshuffled each epoch). Rank r of step s takes
  // sample s · n_ranks + r.
  auto fetch = [this](int step) {
    return std::async(std::launch::async, [this, step] {
      std::vector<TrainSample> v;
      for (int r = 0; r < n_ranks; ++r) v.push_back(data.sample(uint64_t(step) * uint64_t(n_ranks) + uint64_t(r)));
      return v;
    });
  };
  using Samples = std::vector<TrainSample>;
  std::future<Samples> next = start < end ? fetch(start) : std::future<Samples>{};
  for (int step = start; step < end; ++step) {
    const auto ts = Clock::now();
    const Samples samples = next.get();
    if (step + 1 < end) next = fetch(step + 1);
    const TrainSample& sample = samples[0];  // the log's sizes are rank 0's
    const StepStats s = optimise(step, samples, loss_scale);
    losses.push_back(s.loss);
    window_loss += s.loss;
    ++window_n;

    const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - ts).count();
    const bool last = step + 1 == o.steps;
    const bool snapshot = snapshot_step(step + 1, snapshot_every, last), log_line = step % o.log_every == 0 || last;
    // E[z] is a quadrature per gate: computed once for the snapshot and the log line of a step.
    const std::vector<double> ez = snapshot || log_line ? gates.expected_z() : std::vector<double>{};
    if (snapshot) {
      history.steps.push_back(step + 1);
      history.values.push_back(ez);
      history.params.emplace_back(params.begin(), params.end());
    }
    if (log_line) {
      log_step(step, s, sample, step_ms, ez, window_loss / window_n);
      window_loss = 0.0;
      window_n = 0;
    }
    if ((step + 1) % o.checkpoint_every == 0 || last || step + 1 == end)
      save_checkpoint(step + 1, resumed_seconds + elapsed());
  }
  csv.close();
  run_seconds = elapsed();
}

// Ranks sharing a student run in turn on one thread; distinct students run in parallel. Every
// pass finishes before the first failure is rethrown.
void Run::for_each_rank(const std::function<void(int rank)>& pass) const {
  std::vector<std::vector<int>> groups;  // ranks per distinct student, in rank order
  for (int r = 0; r < n_ranks; ++r) {
    size_t g = 0;
    while (g < groups.size() && ranks[size_t(groups[g][0])] != ranks[size_t(r)]) ++g;
    if (g == groups.size()) groups.emplace_back();
    groups[g].push_back(r);
  }
  if (groups.size() == 1) {
    for (int r : groups[0]) pass(r);
    return;
  }
  std::vector<std::future<void>> running;
  for (const std::vector<int>& g : groups)
    running.push_back(std::async(std::launch::async, [&pass, &g] {
      for (int r : g) pass(r);
    }));
  std::exception_ptr first;
  for (std::future<void>& f : running) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// Per rank: its sample's context and teacher, gate noise from the rank's own stream, the
// distillation loss and its gradient; then the gradients summed over the ranks, AdamW on the gate
// parameters with their mean and one ascent step on λ.
StepStats Run::optimise(int step, std::span<const TrainSample> samples, double loss_scale) {
  for (int r = 1; r < n_ranks; ++r) {  // this step's parameters
    if (rank_gates.size() < size_t(r)) rank_gates.push_back(gates);
    rank_gates[size_t(r) - 1] = gates;
  }
  std::vector<double> raw_loss(static_cast<size_t>(n_ranks));
  for_each_rank([&](int r) {
    Student& st = *ranks[size_t(r)];
    st.set_context(samples[size_t(r)].context);
    st.teacher(samples[size_t(r)].targets);
    GateSet& g = r == 0 ? gates : rank_gates[size_t(r) - 1];
    std::mt19937_64 rng = step_rng(o.seed, step, r);
    g.sample(rng, z[size_t(r)]);
    // The logits loss is taken per logit (the squared L2 distance over the vocabulary size), so
    // that λ and its step size do not depend on the vocabulary; the hidden loss is already a mean.
    raw_loss[size_t(r)] = st.student(z[size_t(r)], dz[size_t(r)]);
    for (float& x : dz[size_t(r)]) x = float(double(x) * loss_scale);
    std::fill(grad[size_t(r)].begin(), grad[size_t(r)].end(), 0.0);
    g.backward(dz[size_t(r)], grad[size_t(r)]);
  });
  double loss = 0.0;
  for (int r = 0; r < n_ranks; ++r) {
    const double rank_loss = raw_loss[size_t(r)] * loss_scale;
    LY_CHECK(std::isfinite(rank_loss), ErrorCode::kInternal, "train-heads: loss is {} at step {} (sample {})", rank_loss, step,
             uint64_t(step) * uint64_t(n_ranks) + uint64_t(r));
    loss += rank_loss;
  }
  std::vector<double>& g0 = grad[0];
  if (n_ranks > 1) {
    loss /= n_ranks;
    if (reduce) {
      reduce(grad);
    } else {
      host_gradient_sum(grad);
    }
    for (double& x : g0) x /= n_ranks;
  }
  const double l0 = gates.penalty();
  gates.penalty_grad(lagrange.lambda, g0);
  const double lr = o.lr * lr_factor(step, o.steps);
  adam.step(params, g0, lr);
  gates.project();
  lagrange.update(l0 - double(o.n_retrieval));
  return {loss, l0, lr};
}

void Run::log_step(int step, const StepStats& s, const TrainSample& sample, double step_ms,
                   const std::vector<double>& ez, double window_mean_loss) {
  const int above = count_above_half(ez, c.n_kv_heads);
  csv << fmt::format("{},{:.6g},{:.6g},{:.4f},{},{:.6g},{},{},{:.2f}\n", step, s.loss, lagrange.lambda, s.l0, above,
                     s.lr, sample.context.size(), sample.targets.size(), step_ms);
  csv.flush();
  if (!progress) return;
  const int done = step + 1;
  const double rate = double(done - start) / std::max(elapsed(), 1e-9);
  const int bar = 24, filled = int(double(bar) * done / o.steps);
  progress(fmt::format("[{}{}] step {}/{} | loss {:.4g} | λ {:.3g} | E‖z‖₀ {:.1f} (target {}) | E[z]>0.5: {} | "
                       "{:.2f} steps/s | ETA {}",
                       std::string(size_t(filled), '#'), std::string(size_t(bar - filled), '.'), done, o.steps,
                       window_mean_loss, lagrange.lambda, s.l0, o.n_retrieval, above, rate,
                       format_duration(double(o.steps - done) / std::max(rate, 1e-9))));
}

// A stopped run returns its gate state only; a finished one also writes roles.json, heatmap.svg,
// gate_history.json and summary.json.
TrainResult Run::finish(const nlohmann::json& provenance) {
  TrainResult r;
  r.seconds = run_seconds;
  r.steps_run = std::max(0, end - start);
  const GateReport gr = gates.report();
  r.expected_z = gr.expected_z;
  r.lambda = lagrange.lambda;
  r.expected_l0 = gates.penalty();
  if (end < o.steps) {
    r.finished = false;
    if (progress) progress(fmt::format("stopped after step {} of {}: resume with --resume", end, o.steps));
    return r;
  }
  r.final_loss = tail_mean(losses);

  std::vector<uint8_t> roles = o.decision == RoleDecision::kTopN
                                   ? roles_top_n(r.expected_z, c.n_layers, c.n_kv_heads, o.n_retrieval)
                                   : roles_threshold(r.expected_z, c.n_layers, c.n_kv_heads, 0.5);
  r.roles = make_head_roles(c);
  r.roles.retrieval = roles;
  r.roles.expected_z.assign(r.expected_z.begin(), r.expected_z.end());
  if (!gr.alpha.empty()) {
    r.roles.alpha.assign(gr.alpha.begin(), gr.alpha.end());
    r.roles.beta.assign(gr.beta.begin(), gr.beta.end());
  }
  if (!gr.gate.empty()) r.roles.gate.assign(gr.gate.begin(), gr.gate.end());
  const double total_seconds = resumed_seconds + r.seconds;
  r.roles.provenance = role_provenance(provenance, total_seconds);
  save_head_roles(r.roles, (out / "roles.json").string());
  write_heatmap(r, roles);
  write_gate_history(roles);
  r.summary = summary(r, total_seconds);
  write_text_atomic(out / "summary.json", r.summary.dump(2) + "\n");
  return r;
}

nlohmann::json Run::role_provenance(const nlohmann::json& provenance, double total_seconds) const {
  nlohmann::json p = provenance;
  p["method"] = fmt::format("lychee train-heads ({})", gate_kind_name(o.gate));
  p["gate"] = gate_kind_name(o.gate);
  p["steps"] = o.steps;
  p["n_retrieval_target"] = o.n_retrieval;
  p["decision"] = decision_name(o.decision);
  p["expected_z"] = gates.expected_z_method();
  p["seed"] = o.seed;
  if (n_ranks > 1) p["samples_per_step"] = n_ranks;
  p["lr"] = o.lr;
  p["lambda_lr"] = o.lambda_lr;
  p["keep_ratio"] = student.options().keep_ratio;
  p["propagate"] = student.options().propagate_only_retrieval ? "retrieval" : "all";
  p["loss"] = student.options().loss == DistillLoss::kHidden ? "hidden" : "logits";
  p["data"] = data.describe();
  p["wall_seconds"] = total_seconds;
  return p;
}

void Run::write_heatmap(const TrainResult& r, const std::vector<uint8_t>& roles) const {
  HeatmapData hm;
  hm.title = fmt::format("{}: {} gates, {} steps, target {} retrieval heads ({} chosen)", c.name,
                         gate_kind_name(o.gate), o.steps, o.n_retrieval, r.roles.n_retrieval() - c.n_kv_heads);
  hm.n_layers = c.n_layers;
  hm.n_kv_heads = c.n_kv_heads;
  hm.steps = history.steps;
  hm.snapshots = history.values;
  hm.final_value = r.expected_z;
  hm.roles = roles;
  write_text_atomic(out / "heatmap.svg", head_role_heatmap_svg(hm));
}

// gate_history.json: E[z] and the raw gate parameters of every head at every snapshot, for the
// specialisation-dynamics figure (scripts/plot_gate_dynamics.py). Parameter layout per gate kind
// as GateSet::params() (gates.h): hardkuma [log alpha of every gate, then log beta]; hardconcrete
// [log a]; direct [g]; gate g is (layer g / n_kv_heads + 1, KV head g % n_kv_heads).
void Run::write_gate_history(const std::vector<uint8_t>& roles) const {
  const GateOptions go;
  const nlohmann::json j = {{"model", c.name}, {"gate", gate_kind_name(o.gate)}, {"n_layers", c.n_layers},
                            {"n_kv_heads", c.n_kv_heads}, {"stretch", {go.stretch_low, go.stretch_high}},
                            {"temperature", go.temperature}, {"steps", history.steps},
                            {"expected_z", history.values}, {"params", history.params},
                            {"roles", roles}};
  write_text_atomic(out / "gate_history.json", j.dump() + "\n");
}

nlohmann::json Run::summary(const TrainResult& r, double total_seconds) const {
  return {{"model", c.name}, {"gate", gate_kind_name(o.gate)}, {"steps", o.steps}, {"samples_per_step", n_ranks},
          {"steps_this_run", r.steps_run}, {"wall_seconds", total_seconds},
          {"seconds_per_step", r.steps_run > 0 ? r.seconds / r.steps_run : 0.0},
          {"final_loss", r.final_loss}, {"lambda", r.lambda}, {"expected_l0", r.expected_l0},
          {"n_retrieval_target", o.n_retrieval}, {"n_retrieval_chosen", r.roles.n_retrieval() - c.n_kv_heads},
          {"n_retrieval_with_layer0", r.roles.n_retrieval()}, {"decision", decision_name(o.decision)},
          {"data", data.describe()}, {"provenance", r.roles.provenance}};
}

}  // namespace

void host_gradient_sum(std::span<std::vector<double>> grads) {
  if (grads.empty()) return;
  std::vector<double>& sum = grads[0];
  for (size_t r = 1; r < grads.size(); ++r) {
    LY_CHECK(grads[r].size() == sum.size(), ErrorCode::kInvalidArgument,
             "host_gradient_sum: rank {} has {} values, rank 0 {}", r, grads[r].size(), sum.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += grads[r][i];
  }
  for (size_t r = 1; r < grads.size(); ++r) grads[r] = sum;
}

TrainResult train_head_roles(const ModelConfig& c, Student& student, const TrainData& data,
                             const TrainOptions& o, const nlohmann::json& provenance,
                             const TrainProgress& progress) {
  Student* const one[] = {&student};
  return train_head_roles(c, one, data, o, provenance, progress);
}

TrainResult train_head_roles(const ModelConfig& c, std::span<Student* const> ranks, const TrainData& data,
                             const TrainOptions& o, const nlohmann::json& provenance,
                             const TrainProgress& progress, const GradientReduce& reduce) {
  check_train_options(c, o);
  LY_CHECK(!ranks.empty(), ErrorCode::kInvalidArgument, "train-heads: no student (data-parallel ranks)");
  for (size_t r = 0; r < ranks.size(); ++r)
    LY_CHECK(ranks[r] != nullptr, ErrorCode::kInvalidArgument, "train-heads: rank {} has no student", r);
  const fs::path out(o.out_dir);
  fs::create_directories(out);
  Run run(c, ranks, data, o, progress, reduce, out);
  if (o.resume) {
    run.resume();
  } else {
    write_text_atomic(run.csv_path, kCsvHeader);
  }
  run.train();
  return run.finish(provenance);
}

}  // namespace lychee::train
