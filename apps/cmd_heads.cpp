// lychee heads: head-role files. show prints the map; import converts DuoAttention's TSV or a
// plain 0/1 matrix; export writes those formats back; default writes the layer stand-in.
#include "cmd_heads.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "app.h"
#include "core/error.h"
#include "core/log.h"
#include "model/checkpoint.h"

namespace lychee::app {

namespace {

struct HeadsArgs {
  std::string file;          // show / export: the JSON role file
  std::string model;         // -m: "" = the default model (show: "" = no model check)
  std::string duo, matrix;   // import: source; export: destination
  std::string out;           // import / default: -o
  double sparsity = 0.5;     // import --duo: fraction of heads that become sparse
  std::vector<int> layers;   // default --layers
};

ModelConfig model_config(const std::string& model) {
  return Checkpoint::open(model.empty() ? default_model_path() : model).config();
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
}

}  // namespace lychee::app
