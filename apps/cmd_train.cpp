// lychee train-heads: learn LycheeDecode's head roles (HardKuma gates under a Lagrangian budget,
// distilled from full attention) and write a head-role file.
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "app.h"
#include "train/train_heads.h"

namespace lychee::app {

namespace {

using TrainArgs = train::TrainHeadsConfig;

void run(const TrainArgs& a) {
  const train::TrainHeadsRun run =
      train::train_heads(a, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
  const train::TrainResult& r = run.result;
  const ModelConfig& c = run.config;
  if (!r.finished) {  // --stop-after: no role file yet
    fmt::print("trained {} steps in {:.1f} s ({:.1f} ms/step), stopped; continue with --resume -o {} "
               "(checkpoint.json)\n",
               r.steps_run, r.seconds, 1e3 * r.seconds / std::max(1, r.steps_run), run.out_dir);
    return;
  }
  fmt::print("{}\n", format_head_role_map(r.roles));
  fmt::print("trained {} steps in {:.1f} s ({:.1f} ms/step); final loss {:.4g}, λ {:.3g}, E‖z‖₀ {:.2f}\n",
             r.steps_run, r.seconds, 1e3 * r.seconds / std::max(1, r.steps_run), r.final_loss, r.lambda,
             r.expected_l0);
  fmt::print("retrieval heads: {} chosen of target {} (+{} in layer 0)\n", r.roles.n_retrieval() - c.n_kv_heads,
             run.n_target, c.n_kv_heads);
  fmt::print("wrote {0}/roles.json, {0}/train_log.csv, {0}/heatmap.svg, {0}/summary.json, {0}/checkpoint.json\n",
             run.out_dir);
  fmt::print("use it: lychee generate --policy lychee --heads {}/roles.json ...\n", run.out_dir);
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train-heads", "Learn LycheeDecode head roles (HardKuma gates, distilled from full attention)");
  cmd->add_option("-m,--model", args->model, "Hugging Face model directory or GGUF file")
      ->default_str("SmolLM2-135M-Instruct, from the models cache");
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
  cmd->add_option("--stop-after", args->stop_after, "Checkpoint and stop after this step (continue with --resume)")
      ->check(positive_int());
  cmd->add_flag("!--no-tf32", args->tf32, "CUDA: exact fp32 matrix products instead of TF32 tensor cores");
  cmd->add_option("--prefill", args->prefill,
                  "CUDA: the context prefill in tf32 or bf16 (bf16 products, cuDNN attention); auto: bf16 from 1B "
                  "parameters")
      ->check(CLI::IsMember({"auto", "tf32", "bf16"}));
  cmd->add_option("--teacher-attention", args->teacher_attention,
                  "CUDA: the teacher's attention in tf32 (as the student's dense rows) or bf16 (cuDNN; faster at "
                  "long samples, all gates 1 then differ from the teacher by bf16's rounding)")
      ->check(CLI::IsMember({"tf32", "bf16"}));
  cmd->add_option("--data-parallel", args->data_parallel,
                  "Samples per step, one per rank (GPU); the mean of their gradients")
      ->check(positive_int());
  cmd->add_option("--gpus", args->gpus, "CUDA: rank r's device, comma-separated (default 0,1,...; a repeat shares a GPU)");
  cmd->callback([args] { run(*args); });
}

}  // namespace lychee::app
