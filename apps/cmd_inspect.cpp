// lychee inspect: what a checkpoint holds (config, weights, tokenizer), and optionally whether a
// head-role file fits it.
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app.h"
#include "cmd_heads.h"
#include "model/checkpoint.h"
#include "model/hf_cache.h"
#include "model/tokenizer.h"

namespace lychee::app {

namespace {

struct InspectArgs {
  std::string model;
  std::string heads;  // --heads: a head-role file to check against the model
  bool weights = false;
};

void run_inspect(const InspectArgs& a) {
  const std::string path = a.model.empty() ? default_model_path() : resolve_model_path(a.model);
  const Checkpoint ck = Checkpoint::open(path);
  const ModelConfig& c = ck.config();
  std::printf("path           %s (%s)\n", path.c_str(), ck.format() == CheckpointFormat::kGguf ? "GGUF" : "Hugging Face");
  std::printf("name           %s\n", c.name.c_str());
  std::printf("architecture   %s (%s)\n", arch_name(c.arch), c.arch_label.c_str());
  std::printf("layers         %d\n", c.n_layers);
  std::printf("hidden         %d, MLP %d\n", c.d_model, c.d_ff);
  std::printf("heads          %d query, %d key/value (group %d), head dim %d\n", c.n_heads,
              c.n_kv_heads, c.group_size(), c.head_dim);
  std::printf("vocab          %d%s\n", c.vocab_size, c.tie_embeddings ? " (tied embeddings)" : "");
  std::printf("context        %d, RoPE theta %g%s\n", c.max_context, double(c.rope_theta),
              c.rope_scaling.type == RopeScaling::Type::kLlama3 ? " (llama3 scaling)" : "");
  std::printf("parameters     %.2f M (%.1f MiB in the file)\n", double(c.n_params()) / 1e6,
              double(ck.file_weight_bytes()) / (1 << 20));
  const Tokenizer tok = ck.format() == CheckpointFormat::kGguf ? Tokenizer::from_gguf(*ck.gguf())
                                                                : Tokenizer::from_hf_dir(ck.path());
  std::printf("tokenizer      %d tokens, BOS %d, EOS %d, add BOS %s\n", tok.vocab_size(), tok.bos_id(),
              tok.eos_id(), tok.add_bos_default() ? "yes" : "no");
  if (!a.heads.empty()) {
    const HeadRoles roles = load_head_roles_for(a.heads, c);
    std::printf("head roles     %s\n\n%s", a.heads.c_str(), describe_head_roles(roles).c_str());
  }
  if (!a.weights) return;
  std::printf("\n%-44s %-6s %s\n", "weight", "dtype", "shape");
  for (const WeightSpec& spec : weight_table())
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer)
      if (const RawWeight* w = ck.weight(spec.id, layer))
        std::printf("%-44s %-6s [%s]\n", w->name.c_str(), std::string(dtype_name(w->dtype)).c_str(),
                    fmt::format("{}", fmt::join(w->shape, ", ")).c_str());
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show what a checkpoint holds");
  cmd->add_option("-m,--model", args->model, "Hugging Face model directory or GGUF file")
      ->default_str("SmolLM2-135M-Instruct, from the models cache");
  cmd->add_flag("--weights", args->weights, "List every weight with its dtype and shape");
  cmd->add_option("--heads", args->heads, "Check a head-role file against the model and print its map");
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace lychee::app
