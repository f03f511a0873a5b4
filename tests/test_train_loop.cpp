// The head-role training loop on the CPU student: a synthetic model where one head is known to
// carry the output ends with exactly that head as its retrieval head; a resumed run equals an
// uninterrupted one; the files it writes load and validate; bad options fail clearly (and
// --prefill auto resolves by the model's size); the
// train-heads command runs end to end on a tiny checkpoint; and data parallelism: ranks on
// threads of their own equal one student serving them in turn (what two GPUs must equal one GPU
// summing both ranks' gradients), two ranks of duplicated samples equal one rank (the mean), and
// the reducer is the one summing point.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>

#include "attention/head_roles.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "test_util.h"
#include "tiny_checkpoint.h"
#include "train/cpu_student.h"
#include "train/train_heads.h"
#include "train/trainer.h"

namespace lychee {
namespace {

namespace fs = std::filesystem;

// Random contexts and targets over the model's vocabulary, a pure function of the index.
class RandomTokens final : public train::TrainData {
 public:
  RandomTokens(int vocab, int min_ctx, int max_ctx, int n_targets)
      : vocab_(vocab), min_ctx_(min_ctx), max_ctx_(max_ctx), n_targets_(n_targets) {}
  size_t size() const override { return 0; }
  train::TrainSample sample(uint64_t index) const override {
    std::mt19937_64 rng(index * 7919 + 17);
    train::TrainSample s;
    const int n = min_ctx_ + int(rng() % uint64_t(max_ctx_ - min_ctx_ + 1));
    for (int i = 0; i < n; ++i) s.context.push_back(int32_t(rng() % uint64_t(vocab_)));
    for (int i = 0; i < n_targets_; ++i) s.targets.push_back(int32_t(rng() % uint64_t(vocab_)));
    s.index = index;
    return s;
  }
  int max_target_tokens() const override { return n_targets_; }
  std::string describe() const override { return "random tokens"; }

 private:
  int vocab_, min_ctx_, max_ctx_, n_targets_;
};

// A 3-layer Llama with random weights in which only the query heads of (layer 2, KV head 1)
// write to the residual stream at full strength, those of (layer 1, KV head 0) at 5%, and every
// other head not at all (their O-projection columns are zero).
std::string write_synthetic_model(const std::string& dir) {
  const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                              {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 3},
                              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 64},
                              {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                              {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << cfg.dump(1);  // parsed here; write_hf_f32 writes it again
  const ModelConfig c = config_from_hf_json(dir + "/config.json");
  std::mt19937 rng(1234);
  test::write_hf_f32(dir, cfg, c, [&](const std::string& name, int layer, std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> w(static_cast<size_t>(n));
    if (shape.size() == 1) {
      std::fill(w.begin(), w.end(), 1.0f);  // norms
    } else {
      std::normal_distribution<float> nd(0.0f, 2.0f / std::sqrt(float(shape[1])));
      for (float& x : w) x = nd(rng);
    }
    if (name.find("o_proj") != std::string::npos) {  // [d, q_dim]: zero the columns of silent heads
      const int hd = c.head_dim, group = c.group_size();
      for (int q = 0; q < c.n_heads; ++q) {
        const int kvh = q / group;
        const float keep = (layer == 2 && kvh == 1) ? 1.0f : (layer == 1 && kvh == 0) ? 0.05f : 0.0f;
        for (int row = 0; row < c.d_model; ++row)
          for (int j = 0; j < hd; ++j) w[size_t(row) * c.q_dim() + size_t(q * hd + j)] *= keep;
      }
    }
    return w;
  });
  return dir;
}

// A fresh, empty directory for one test's outputs.
std::string fresh_dir(const std::string& name) {
  const std::string dir = test::temp_dir(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Loaded {
  Checkpoint ck;
  HostWeights w;
};

Loaded load(const std::string& dir) {
  Checkpoint ck = Checkpoint::open(dir);
  HostWeights w = HostWeights::load(ck);
  return {std::move(ck), std::move(w)};
}

train::TrainOptions base_options(const std::string& out) {
  train::TrainOptions o;
  o.n_retrieval = 1;
  o.steps = 40;
  o.lr = 0.05;
  o.lambda_lr = 1e-3;
  o.log_every = 5;
  o.checkpoint_every = 10;
  o.out_dir = out;
  o.progress = false;
  return o;
}

TEST(TrainLoop, SyntheticModelFindsTheHeadThatCarriesTheOutput) {
  const std::string base = fresh_dir("train_synth");
  const auto m = load(write_synthetic_model(base + "/model"));
  const ModelConfig& c = m.ck.config();
  train::StudentOptions so;
  so.keep_ratio = 0.2;
  train::CpuStudent<float> student(c, m.w, so, 256);
  RandomTokens data(c.vocab_size, 60, 120, 8);
  for (train::GateKind kind : {train::GateKind::kHardKuma, train::GateKind::kHardConcrete, train::GateKind::kDirect}) {
    SCOPED_TRACE(train::gate_kind_name(kind));
    train::TrainOptions o = base_options(base + "/" + train::gate_kind_name(kind));
    o.gate = kind;
    o.steps = 300;
    o.decision = train::RoleDecision::kThreshold;
    const train::TrainResult r = train::train_head_roles(c, student, data, o, {});
    // Layer 0 forced; of the four gated heads only (2, 1) is retrieval.
    EXPECT_EQ(r.roles.retrieval, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1}));
    EXPECT_GT(r.expected_z[5], 0.5);
    // The silent heads' gates receive no distillation gradient and close.
    EXPECT_LT(r.expected_z[3], 0.2);
    EXPECT_LT(r.expected_z[4], 0.2);
    // The weak head loses to the strong one.
    EXPECT_LT(r.expected_z[2], r.expected_z[5]);
    EXPECT_NEAR(r.expected_l0, 1.0, 0.6);
  }
}

// d loss / d(gate parameters) through the student pass and the gate's reparameterisation, against
// central finite differences of the whole chain (fp64) on a golden tiny model, for the HardKuma
// and HardConcrete gates at noise values that keep every gate inside (0, 1).
TEST(TrainLoop, LossGradientWrtGateParametersMatchesFiniteDifferences) {
  for (const char* name : {"llama_tied_f32", "qwen3_tied_bf16"}) {
    SCOPED_TRACE(name);
    const auto m = load(test::golden_dir() + "/models/" + name);
    const ModelConfig& c = m.ck.config();
    train::StudentOptions so;
    so.keep_ratio = 0.3;
    train::CpuStudent<double> student(c, m.w, so, 128);
    RandomTokens data(c.vocab_size, 40, 40, 6);
    const train::TrainSample sample = data.sample(3);
    student.set_context(sample.context);
    student.teacher(sample.targets);
    const size_t n_heads = size_t(c.n_layers * c.n_kv_heads);
    for (train::GateKind kind : {train::GateKind::kHardKuma, train::GateKind::kHardConcrete}) {
      SCOPED_TRACE(train::gate_kind_name(kind));
      train::GateSet gates(kind, c.n_layers, c.n_kv_heads);
      std::vector<double> u(size_t(gates.n_gates()));
      for (size_t i = 0; i < u.size(); ++i) u[i] = 0.3 + 0.4 * double(i) / double(u.size());
      // Move the parameters off their symmetric start so every derivative is exercised.
      for (size_t i = 0; i < gates.params().size(); ++i) gates.params()[i] = 0.1 * std::sin(double(i) + 1.0);
      auto loss_at = [&](std::vector<double>* dz) {
        std::vector<double> z(n_heads), g(n_heads);
        gates.sample_with_u(u, z);
        for (size_t i = size_t(c.n_kv_heads); i < n_heads; ++i) {
          EXPECT_GT(z[i], 0.0);
          EXPECT_LT(z[i], 1.0);
        }
        const double loss = student.student_real(z, g);
        if (dz) *dz = g;
        return loss;
      };
      std::vector<double> dz;
      loss_at(&dz);
      std::vector<float> dz_f(dz.begin(), dz.end());
      std::vector<double> grad(gates.params().size(), 0.0);
      std::vector<double> z_draw(n_heads);
      gates.sample_with_u(u, std::span<double>(z_draw));  // the draw backward() differentiates
      gates.backward(dz_f, grad);
      double max_grad = 0.0;
      for (double g : grad) max_grad = std::max(max_grad, std::abs(g));
      ASSERT_GT(max_grad, 0.0);
      for (size_t i = 0; i < grad.size(); ++i) {
        const double keep = gates.params()[i], eps = 1e-5;
        gates.params()[i] = keep + eps;
        const double up = loss_at(nullptr);
        gates.params()[i] = keep - eps;
        const double down = loss_at(nullptr);
        gates.params()[i] = keep;
        const double fd = (up - down) / (2 * eps);
        EXPECT_NEAR(grad[i], fd, 1e-5 * max_grad + 1e-6 * std::abs(fd)) << "parameter " << i;
      }
    }
  }
}

std::vector<std::string> csv_rows_without_time(const std::string& path) {
  std::vector<std::string> rows;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) rows.push_back(line.substr(0, line.rfind(',')));  // drop step_ms
  return rows;
}

TEST(TrainLoop, ResumedRunEqualsUninterruptedRun) {
  const std::string base = fresh_dir("train_resume");
  const auto m = load(write_synthetic_model(base + "/model"));
  const ModelConfig& c = m.ck.config();
  train::CpuStudent<float> student(c, m.w, {}, 256);
  RandomTokens data(c.vocab_size, 30, 60, 5);
  const train::TrainResult a = train::train_head_roles(c, student, data, base_options(base + "/full"), {});
  ASSERT_TRUE(a.finished);

  train::TrainOptions split = base_options(base + "/split");
  split.stop_after = 17;  // not a checkpoint multiple: the stop writes its own
  const train::TrainResult b1 = train::train_head_roles(c, student, data, split, {});
  EXPECT_FALSE(b1.finished);
  EXPECT_EQ(b1.steps_run, 17);
  EXPECT_FALSE(fs::exists(base + "/split/roles.json"));
  split.stop_after = 0;
  split.resume = true;
  const train::TrainResult b2 = train::train_head_roles(c, student, data, split, {});
  ASSERT_TRUE(b2.finished);
  EXPECT_EQ(b2.steps_run, 23);

  const nlohmann::json ca = test::read_json(base + "/full/checkpoint.json");
  const nlohmann::json cb = test::read_json(base + "/split/checkpoint.json");
  EXPECT_EQ(ca["params"], cb["params"]);
  EXPECT_EQ(ca["lambda"], cb["lambda"]);
  EXPECT_EQ(ca["losses"], cb["losses"]);
  EXPECT_EQ(a.expected_z, b2.expected_z);
  EXPECT_EQ(a.roles.retrieval, b2.roles.retrieval);
  EXPECT_EQ(csv_rows_without_time(base + "/full/train_log.csv"), csv_rows_without_time(base + "/split/train_log.csv"));
}

TEST(TrainLoop, WritesLoadableRoleFileLogAndHeatmap) {
  const std::string base = fresh_dir("train_files");
  const auto m = load(write_synthetic_model(base + "/model"));
  const ModelConfig& c = m.ck.config();
  train::CpuStudent<float> student(c, m.w, {}, 256);
  RandomTokens data(c.vocab_size, 30, 60, 5);
  train::TrainOptions o = base_options(base + "/out");
  o.steps = 12;
  o.decision = train::RoleDecision::kTopN;
  const train::TrainResult r = train::train_head_roles(c, student, data, o, {{"note", "test"}});
  const HeadRoles roles = load_head_roles(base + "/out/roles.json", c);
  EXPECT_EQ(roles.retrieval, r.roles.retrieval);
  EXPECT_EQ(roles.n_retrieval(), c.n_kv_heads + 1);  // top-n: exactly N plus layer 0
  ASSERT_EQ(roles.alpha.size(), size_t(c.n_layers * c.n_kv_heads));
  ASSERT_EQ(roles.expected_z.size(), size_t(c.n_layers * c.n_kv_heads));
  EXPECT_EQ(roles.provenance["note"], "test");
  EXPECT_EQ(roles.provenance["gate"], "hardkuma");
  EXPECT_EQ(roles.provenance["steps"], 12);
  // CSV: a header and a row per log point (steps 0, 5, 10, 11).
  EXPECT_EQ(csv_rows_without_time(base + "/out/train_log.csv").size(), 5u);
  std::ifstream svg(base + "/out/heatmap.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  const nlohmann::json summary = test::read_json(base + "/out/summary.json");
  EXPECT_EQ(summary["steps"], 12);
  EXPECT_EQ(summary["n_retrieval_chosen"], 1);
  // gate_history.json: a snapshot at step 0 and every snapshot_every steps, each with E[z] per head
  // and the raw parameters (HardKuma: log alpha and log beta per gate); the last equals the roles'.
  const nlohmann::json h = test::read_json(base + "/out/gate_history.json");
  EXPECT_EQ(h["gate"], "hardkuma");
  const auto steps = h["steps"].get<std::vector<int>>();
  ASSERT_GE(steps.size(), 2u);
  EXPECT_EQ(steps.front(), 0);
  EXPECT_EQ(steps.back(), 12);
  ASSERT_EQ(h["params"].size(), steps.size());
  ASSERT_EQ(h["expected_z"].size(), steps.size());
  const size_t n_gates = size_t((c.n_layers - 1) * c.n_kv_heads);
  EXPECT_EQ(h["params"][0].size(), 2 * n_gates);
  EXPECT_EQ(h["params"][0][0].get<double>(), 0.0) << "Kuma(1, 1) at the start: log alpha = 0";
  const auto last = h["params"].back().get<std::vector<double>>();
  for (size_t g = 0; g < n_gates; ++g)  // the role file keeps alpha as f32
    EXPECT_EQ(float(std::exp(last[g])), float(roles.alpha[g + size_t(c.n_kv_heads)])) << "gate " << g;
  EXPECT_EQ(h["expected_z"].back().get<std::vector<double>>(), r.expected_z);
}

TEST(TrainLoop, BadOptionsFailClearly) {
  const std::string base = fresh_dir("train_bad");
  const auto m = load(write_synthetic_model(base + "/model"));
  const ModelConfig& c = m.ck.config();
  train::CpuStudent<float> student(c, m.w, {}, 256);
  RandomTokens data(c.vocab_size, 30, 60, 5);
  auto expect_error = [&](train::TrainOptions o, const std::string& needle) {
    try {
      train::train_head_roles(c, student, data, o, {});
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  train::TrainOptions o = base_options(base + "/a");
  o.n_retrieval = 5;  // 2 gated layers x 2 KV heads = 4
  expect_error(o, "--retrieval-heads 5 out of range [1, 4]");
  o = base_options(base + "/b");
  o.resume = true;
  expect_error(o, "no checkpoint");
  o = base_options(base + "/c");
  o.steps = 3;
  train::train_head_roles(c, student, data, o, {});
  o.resume = true;
  o.gate = train::GateKind::kDirect;
  expect_error(o, "differ from this run's");
  std::ofstream(base + "/c/checkpoint.json") << "{\"format\": ";
  expect_error(o, "malformed checkpoint");
  EXPECT_THROW(train::parse_role_decision("best"), Error);
}

// --prefill auto (train/train_heads.h): bf16 (products and cuDNN attention) for the 8B shapes,
// tf32 for the default model and under --no-tf32; tf32 and bf16 pass through; bf16 with
// --no-tf32 and unknown values fail naming the option.
TEST(TrainLoop, PrefillAutoIsBf16FromOneBillionParameters) {
  const ModelConfig big = model_shape("llama3-8b"), small = model_shape("smollm2-135m");
  ASSERT_GE(big.n_params(), train::kBf16PrefillParams);
  ASSERT_LT(small.n_params(), train::kBf16PrefillParams);
  EXPECT_EQ(train::resolve_prefill("auto", big, true), "bf16");
  EXPECT_EQ(train::resolve_prefill("auto", small, true), "tf32");
  EXPECT_EQ(train::resolve_prefill("auto", big, false), "tf32");
  EXPECT_EQ(train::resolve_prefill("tf32", big, true), "tf32");
  EXPECT_EQ(train::resolve_prefill("bf16", small, true), "bf16");
  test::expect_error([&] { train::resolve_prefill("bf16", big, false); }, ErrorCode::kInvalidArgument, "--no-tf32");
  test::expect_error([&] { train::resolve_prefill("fp16", big, true); }, ErrorCode::kInvalidArgument,
                     "expected auto, tf32 or bf16");
}

// --teacher-attention (train/train_heads.h): tf32 anywhere, bf16 only with TF32 on and on the GPU;
// other values fail naming the option, and the CLI refuses bf16 on the CPU before any work.
TEST(TrainLoop, TeacherAttentionBf16NeedsTf32AndTheGpu) {
  EXPECT_NO_THROW(train::check_teacher_attention("tf32", true, "cpu"));
  EXPECT_NO_THROW(train::check_teacher_attention("tf32", false, "cuda"));
  EXPECT_NO_THROW(train::check_teacher_attention("bf16", true, "cuda"));
  test::expect_error([&] { train::check_teacher_attention("bf16", false, "cuda"); }, ErrorCode::kInvalidArgument,
                     "--teacher-attention bf16", "--no-tf32");
  test::expect_error([&] { train::check_teacher_attention("bf16", true, "cpu"); }, ErrorCode::kInvalidArgument,
                     "--teacher-attention bf16", "--device cuda");
  test::expect_error([&] { train::check_teacher_attention("fp8", true, "cuda"); }, ErrorCode::kInvalidArgument,
                     "--teacher-attention 'fp8'", "expected tf32 or bf16");
  const std::string model = test::golden_dir() + "/models/llama_tied_f32";
  const auto r = test::run_cli("train-heads -m " + model + " --device cpu --steps 2 --teacher-attention bf16 -o " +
                               fresh_dir("train_teacher_bf16") + "/out");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--teacher-attention bf16"), std::string::npos) << r.output;
}

TEST(TrainLoop, CliTrainsHeadsOnATinyCheckpoint) {
  const std::string base = fresh_dir("train_cli");
  const std::string model = test::golden_dir() + "/models/llama_tied_f32";
  const auto r = test::run_cli("train-heads -m " + model + " --device cpu --steps 6 --retrieval-heads 2"
                               " --passkeys 1 --passkey-words 3 --min-len 190 --max-len 256 --haystack synthetic"
                               " --log-every 2 -o " + base + "/out");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step 6/6"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(base + "/out/roles.json"));
  const auto gen = test::run_cli("generate -m " + model + " --device cpu --policy lychee --heads " + base +
                                 "/out/roles.json -p hello -n 4");
  EXPECT_EQ(gen.status, 0) << gen.output;
  const auto bad = test::run_cli("train-heads -m " + model + " --device cpu --retrieval-heads 99 -o " + base + "/bad");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("out of range"), std::string::npos) << bad.output;
}

// ---- data parallelism ----

// The base samples twice each: sample i is base sample i / 2 (ranks 0 and 1 of a step agree).
class Duplicated final : public train::TrainData {
 public:
  explicit Duplicated(const train::TrainData& base) : base_(base) {}
  size_t size() const override { return 0; }
  train::TrainSample sample(uint64_t index) const override { return base_.sample(index / 2); }
  int max_target_tokens() const override { return base_.max_target_tokens(); }
  std::string describe() const override { return "duplicated " + base_.describe(); }

 private:
  const train::TrainData& base_;
};

struct RunState {
  nlohmann::json checkpoint;
  std::vector<double> expected_z;
  std::vector<uint8_t> roles;
};

RunState run_ranks(const ModelConfig& c, std::span<train::Student* const> ranks, const train::TrainData& data,
                   train::TrainOptions o, const train::GradientReduce& reduce = {}) {
  const train::TrainResult r = train::train_head_roles(c, ranks, data, o, {}, {}, reduce);
  EXPECT_TRUE(r.finished);
  return {test::read_json(o.out_dir + "/checkpoint.json"), r.expected_z, r.roles.retrieval};
}

void expect_same_run(const RunState& a, const RunState& b) {
  EXPECT_EQ(a.checkpoint["params"], b.checkpoint["params"]);
  EXPECT_EQ(a.checkpoint["lambda"], b.checkpoint["lambda"]);
  EXPECT_EQ(a.checkpoint["losses"], b.checkpoint["losses"]);
  EXPECT_EQ(a.checkpoint["adam"], b.checkpoint["adam"]);
  EXPECT_EQ(a.expected_z, b.expected_z);
  EXPECT_EQ(a.roles, b.roles);
}

TEST(TrainDataParallel, RanksOnThreadsEqualOneStudentInTurn) {
  const std::string base = fresh_dir("train_dp_threads");
  const auto m = load(write_synthetic_model(base + "/model"));
  const ModelConfig& c = m.ck.config();
  train::CpuStudent<float> s0(c, m.w, {}, 256), s1(c, m.w, {}, 256);
  RandomTokens data(c.vocab_size, 30, 60, 5);
  train::TrainOptions o = base_options(base + "/turn");
  o.steps = 16;
  train::Student* const turn[] = {&s0, &s0};
  const RunState a = run_ranks(c, turn, data, o);
  o.out_dir = base + "/threads";
  train::Student* const threads[] = {&s0, &s1};
  int calls = 0, differ = 0;
  const RunState b = run_ranks(c, threads, data, o, [&](std::span<std::vector<double>> g) {
    ++calls;
    ASSERT_EQ(g.size(), 2u);
    differ += g[0] != g[1];  // different samples and gate noise: else the equality proves little
    train::host_gradient_sum(g);
    EXPECT_EQ(g[0], g[1]);
  });
  EXPECT_EQ(calls, o.steps) << "one reduction per step";
  EXPECT_EQ(differ, o.steps);
  expect_same_run(a, b);
  EXPECT_EQ(a.checkpoint["ranks"], 2);
}

TEST(TrainDataParallel, TwoRanksOfDuplicatedSamplesEqualOneRank) {
  // The direct gate draws no noise, so with each sample given to both ranks their gradients are
  // equal and their mean is the one-rank gradient exactly: the trajectory is the one-rank run's.
  const std::string base = fresh_dir("train_dp_mean");
  const auto m = load(write_synthetic_model(base + "/model"));
  const ModelConfig& c = m.ck.config();
  train::CpuStudent<float> student(c, m.w, {}, 256);
  RandomTokens data(c.vocab_size, 30, 60, 5);
  const Duplicated twice(data);
  train::TrainOptions o = base_options(base + "/one");
  o.gate = train::GateKind::kDirect;
  o.steps = 16;
  train::Student* const one[] = {&student};
  const RunState a = run_ranks(c, one, data, o);
  o.out_dir = base + "/two";
  train::Student* const two[] = {&student, &student};
  const RunState b = run_ranks(c, two, twice, o);
  expect_same_run(a, b);
  // A checkpoint of two ranks does not resume with one.
  o.resume = true;
  try {
    train::train_head_roles(c, one, twice, o, {});
    ADD_FAILURE() << "resumed a 2-rank checkpoint with 1 rank";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 sample(s) per step"), std::string::npos) << e.what();
  }
}

TEST(TrainDataParallel, CliDataParallelOnTheCpu) {
  const std::string base = fresh_dir("train_dp_cli");
  const std::string model = test::golden_dir() + "/models/llama_tied_f32";
  const std::string common = "train-heads -m " + model + " --device cpu --steps 4 --retrieval-heads 2 --passkeys 1"
                             " --passkey-words 3 --min-len 190 --max-len 256 --haystack synthetic --log-every 2";
  const auto r = test::run_cli(common + " --data-parallel 2 -o " + base + "/out");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("x 2 samples (data parallel)"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_json(base + "/out/summary.json")["samples_per_step"], 2);
  const auto bad = test::run_cli(common + " --gpus 0,1 -o " + base + "/bad");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--gpus needs --device cuda"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace lychee
