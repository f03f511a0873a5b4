// Head-role files: the JSON format round-trips exactly, every malformed file fails with a
// message naming the file and the field, DuoAttention's deploy rule and the stand-ins give the
// hand-computed roles, and the CLI (heads, inspect --heads) works end to end.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/head_roles.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

using nlohmann::json;
using test::expect_error;

ModelConfig config_of(int n_layers, int n_kv_heads) { return test::tiny_config_of(n_layers, n_kv_heads); }

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = test::temp_dir("head_roles") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<uint8_t> bits(std::initializer_list<int> v) { return std::vector<uint8_t>(v.begin(), v.end()); }

// A valid document for a 3-layer, 3-KV-head model.
json valid_doc() {
  return {{"format", "lychee-head-roles"},
          {"version", 1},
          {"model", {{"name", "tiny"}, {"architecture", "llama"}, {"n_layers", 3}, {"n_heads", 6},
                     {"n_kv_heads", 3}, {"head_dim", 8}}},
          {"roles", {{1, 1, 1}, {0, 1, 0}, {0, 0, 1}}}};
}

// Writes `doc` as `name` and expects load_head_roles against a 3x3 model to fail with the
// file name and `message` in the error.
void expect_load_error(const std::string& name, const json& doc, const std::string& message) {
  const std::string path = write_file(name, doc.dump(1));
  expect_error([&] { load_head_roles(path, config_of(3, 3)); }, ErrorCode::kInvalidFile, {path + ": ", message});
}

TEST(HeadRolesJson, RoundTripsWithGatesAndProvenance) {
  const ModelConfig c = config_of(3, 3);
  HeadRoles r = make_head_roles(c);
  r.retrieval = bits({1, 1, 1, 0, 1, 0, 0, 0, 1});
  r.alpha = {0.1f, 1e-7f, 3.3333333f, 1.0f, 100.0f, 0.5f, 2.25f, 7.0f, 123456.78f};
  r.beta = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 1e30f};
  r.expected_z = {1.0f, 1.0f, 1.0f, 0.0f, 0.9999999f, 1e-30f, 0.1f, 0.2f, 0.7f};
  r.gate = {0.3f, 0.3f, 0.3f, 0.0f, 1.0f, 0.25f, 0.125f, 0.0625f, 0.5f};
  r.provenance = {{"method", "hardkuma"}, {"steps", 3000}, {"seed", 7}, {"data", {{"lengths", {1000, 10000}}}}};
  const std::string path = test::temp_dir("head_roles") + "/round_trip.json";
  save_head_roles(r, path);

  const HeadRoles back = load_head_roles(path, c);
  EXPECT_EQ(back.n_layers, 3);
  EXPECT_EQ(back.n_kv_heads, 3);
  EXPECT_EQ(back.retrieval, r.retrieval);
  EXPECT_EQ(back.alpha, r.alpha);  // bit-exact: floats are written as their shortest f32 text
  EXPECT_EQ(back.beta, r.beta);
  EXPECT_EQ(back.expected_z, r.expected_z);
  EXPECT_EQ(back.gate, r.gate);
  EXPECT_EQ(back.model, r.model);
  EXPECT_EQ(back.provenance, r.provenance);
  EXPECT_EQ(back.n_retrieval(), 5);

  const std::string path2 = test::temp_dir("head_roles") + "/round_trip2.json";
  save_head_roles(back, path2);
  EXPECT_EQ(read_text_file(path2), read_text_file(path));
  EXPECT_NE(read_text_file(path).find("    [0, 1, 0],\n"), std::string::npos) << "one row per line";
}

TEST(HeadRolesJson, RoundTripsWithoutGatesOrProvenance) {
  const ModelConfig c = config_of(2, 2);
  const HeadRoles r = head_roles_from_layers(c, {});
  HeadRoles bare = r;
  bare.provenance = nullptr;
  const std::string path = test::temp_dir("head_roles") + "/bare.json";
  save_head_roles(bare, path);
  const json doc = test::read_json(path);
  EXPECT_FALSE(doc.contains("gates"));
  EXPECT_FALSE(doc.contains("provenance"));
  const HeadRoles back = load_head_roles(path, c);
  EXPECT_EQ(back.retrieval, bits({1, 1, 0, 0}));
  EXPECT_TRUE(back.alpha.empty() && back.beta.empty() && back.expected_z.empty() && back.gate.empty());
  EXPECT_TRUE(back.provenance.is_null());
}

TEST(HeadRolesJson, SaveRefusesWhatLoadWouldReject) {
  const ModelConfig c = config_of(2, 2);
  const std::string path = test::temp_dir("head_roles") + "/refused.json";
  HeadRoles r = head_roles_from_layers(c, {1});
  r.alpha = {1.0f, 0.0f, 1.0f, 1.0f};
  expect_error([&] { save_head_roles(r, path); }, ErrorCode::kInvalidArgument,
               {"cannot write " + path, "gates.alpha[0][1] must be > 0, got 0"});
  r.alpha.clear();
  r.gate = {0.5f, NAN, 0.5f, 0.5f};
  expect_error([&] { save_head_roles(r, path); }, ErrorCode::kInvalidArgument, {"gates.gate[0][1] must be a finite"});
  r.gate = {0.5f, 0.5f};
  expect_error([&] { save_head_roles(r, path); }, ErrorCode::kInvalidArgument, {"gates.gate holds 2 values, expected 4"});
  r.gate.clear();
  r.retrieval[3] = 2;
  expect_error([&] { save_head_roles(r, path); }, ErrorCode::kInvalidArgument, {"roles[1][1] must be 0 or 1, got 2"});
  r.retrieval[3] = 1;
  r.model.erase("head_dim");
  expect_error([&] { save_head_roles(r, path); }, ErrorCode::kInvalidArgument, {"missing field model.head_dim"});
  r.model = make_head_roles(config_of(3, 2)).model;
  expect_error([&] { save_head_roles(r, path); }, ErrorCode::kInvalidArgument,
               {"model block says 3 x 2 but the roles are 2 x 2"});
}

TEST(HeadRolesJson, ADifferentModelNameWithTheSameShapeLoads) {
  json doc = valid_doc();
  doc["model"]["name"] = "HuggingFaceTB/SmolLM2-135M-Instruct";
  doc["model"]["architecture"] = "mistral";
  const HeadRoles r = load_head_roles(write_file("other_name.json", doc.dump()), config_of(3, 3));
  EXPECT_EQ(r.model["name"], "HuggingFaceTB/SmolLM2-135M-Instruct");
  EXPECT_EQ(r.retrieval, bits({1, 1, 1, 0, 1, 0, 0, 0, 1}));
}

TEST(HeadRolesJson, FileErrorsNameTheFileAndTheField) {
  const std::string garbage = write_file("garbage.json", "{ \"roles\": [[1, 1,");
  expect_error([&] { load_head_roles(garbage, config_of(3, 3)); }, ErrorCode::kInvalidFile,
               {garbage + ": not valid JSON"});
  json d = valid_doc();
  d.erase("roles");
  expect_load_error("no_roles.json", d, "missing field 'roles'");
  d = valid_doc();
  d["format"] = "duo-attention";
  expect_load_error("format.json", d, "format is \"duo-attention\", expected \"lychee-head-roles\"");
  d = valid_doc();
  d["version"] = 2;
  expect_load_error("version.json", d, "version is 2, expected 1");
  d = valid_doc();
  d["role"] = 1;
  expect_load_error("unknown.json", d, "unknown top-level key 'role'");
  expect_load_error("array.json", json::array({1, 2}), "the top level must be a JSON object, got array");
  d = valid_doc();
  d["roles"][1][2] = 2;
  expect_load_error("entry.json", d, "roles[1][2] must be 0 or 1, got 2");
  d = valid_doc();
  d["roles"][2][0] = true;
  expect_load_error("bool.json", d, "roles[2][0] must be 0 or 1, got true");
  d = valid_doc();
  d["roles"][1] = {0, 1};
  expect_load_error("ragged.json", d, "roles[1] has 2 entries but roles[0] has 3");
  d = valid_doc();
  d["roles"] = json::array();
  expect_load_error("no_rows.json", d, "roles has no rows");
  d = valid_doc();
  d["model"]["n_kv_heads"] = 8;
  expect_load_error("kv.json", d, "model.n_kv_heads is 8 but the model has 3 KV heads");
  d = valid_doc();
  d["model"]["head_dim"] = 64;
  expect_load_error("head_dim.json", d, "model.head_dim is 64 but the model has head_dim 8");
  d = valid_doc();
  d["model"].erase("n_heads");
  expect_load_error("no_n_heads.json", d, "missing field model.n_heads");
  d = valid_doc();
  d["model"]["n_layers"] = "3";
  expect_load_error("n_layers_str.json", d, "model.n_layers must be a positive integer, got \"3\"");
  d = valid_doc();
  d["roles"][0][1] = 0;
  expect_load_error("layer0.json", d,
                    "layer 0 must be all retrieval heads (LycheeDecode selects in layer 0), head 1 is sparse");
  d = valid_doc();
  d["provenance"] = "trained";
  expect_load_error("provenance.json", d, "provenance must be an object, got string");
}

TEST(HeadRolesJson, ShapeErrorsAgainstTheModel) {
  // A consistent file for a 28-layer model loaded for a 30-layer one.
  const ModelConfig c28 = config_of(28, 3);
  const std::string path = test::temp_dir("head_roles") + "/roles28.json";
  save_head_roles(head_roles_from_layers(c28, {5}), path);
  expect_error([&] { load_head_roles(path, config_of(30, 3)); }, ErrorCode::kInvalidFile,
               {path + ": roles has 28 rows but the model has 30 layers"});
  expect_error([&] { load_head_roles(path, config_of(28, 4)); }, ErrorCode::kInvalidFile,
               {path + ": roles rows have 3 entries but the model has 4 KV heads"});
}

TEST(HeadRolesJson, GateErrors) {
  json d = valid_doc();
  d["gates"] = {{"alpha", {{1, -1, 1}, {1, 1, 1}, {1, 1, 1}}}};
  expect_load_error("alpha.json", d, "gates.alpha[0][1] must be > 0, got -1");
  d["gates"] = {{"beta", {{1, 1, 1}, {1, 0, 1}, {1, 1, 1}}}};
  expect_load_error("beta.json", d, "gates.beta[1][1] must be > 0, got 0");
  d["gates"] = {{"expected_z", {{1, 1, 1}, {1, 1, 1.5}, {1, 1, 1}}}};
  expect_load_error("ez.json", d, "gates.expected_z[1][2] must be in [0, 1], got 1.5");
  d["gates"] = {{"gate", {{1, 1, 1}, {1, 1, 1}}}};
  expect_load_error("gate_rows.json", d, "gates.gate has 2 rows but roles has 3");
  d["gates"] = {{"gate", {{1, 1}, {1, 1}, {1, 1}}}};
  expect_load_error("gate_cols.json", d, "gates.gate rows have 2 entries but roles rows have 3");
  d["gates"] = {{"gate", {{1, 1, "x"}, {1, 1, 1}, {1, 1, 1}}}};
  expect_load_error("gate_str.json", d, "gates.gate[0][2] must be a number, got \"x\"");
  d["gates"] = {{"alpha", {{1, 1, 1e300}, {1, 1, 1}, {1, 1, 1}}}};
  expect_load_error("alpha_big.json", d, "gates.alpha[0][2] must be a finite number");
  d["gates"] = {{"z", {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}}};
  expect_load_error("gate_name.json", d, "unknown key gates.z");
}

TEST(HeadRolesJson, UncheckedLoadChecksOnlyInternalConsistency) {
  json d = valid_doc();
  d["roles"][0][0] = 0;  // layer 0 is checked against a model, not here
  const HeadRoles r = load_head_roles_unchecked(write_file("unchecked.json", d.dump()));
  EXPECT_EQ(r.n_layers, 3);
  EXPECT_EQ(r.n_retrieval(), 4);
  d["model"]["n_layers"] = 4;
  const std::string bad = write_file("unchecked_bad.json", d.dump());
  expect_error([&] { load_head_roles_unchecked(bad); }, ErrorCode::kInvalidFile,
               {bad + ": model.n_layers is 4 but roles has 3 rows"});
}

TEST(HeadRoles, ValidateChecksShapeAndLayerZero) {
  const ModelConfig c = config_of(3, 2);
  HeadRoles r = head_roles_from_layers(c, {2});
  EXPECT_NO_THROW(r.validate(c, "mem"));
  expect_error([&] { r.validate(config_of(4, 2), "mem"); }, ErrorCode::kInvalidFile,
               {"mem: roles has 3 rows but the model has 4 layers"});
  r.retrieval[1] = 0;
  expect_error([&] { r.validate(c, "mem"); }, ErrorCode::kInvalidFile, {"mem: layer 0", "head 1 is sparse"});
}

// ---- DuoAttention TSV --------------------------------------------------------------------

const char* const kDuoTsv = "0.9\t0.1  \n0.5\t0.5\n0.7\t0.2\n\n";  // trailing blanks and an empty last line

TEST(HeadRolesDuo, RanksGatesAndForcesLayerZero) {
  const ModelConfig c = config_of(3, 2);
  const std::string path = write_file("duo.tsv", kDuoTsv);
  // sparsity 0.5: round(0.5 * 6) = 3 retrieval: 0.9 (0,0), 0.7 (2,0), then the tie at 0.5 goes to
  // (1,0) before (1,1). Layer 0 forced adds (0,1).
  HeadRoles r = import_duo_tsv(path, c, 0.5);
  EXPECT_EQ(r.retrieval, bits({1, 1, 1, 0, 1, 0}));
  EXPECT_EQ(r.gate, (std::vector<float>{0.9f, 0.1f, 0.5f, 0.5f, 0.7f, 0.2f}));
  EXPECT_EQ(r.provenance["source"], path);
  EXPECT_EQ(r.provenance["sparsity"], 0.5);
  EXPECT_EQ(r.provenance["method"], "duoattention");
  // 1 - 2/3 of 6 = 2 retrieval: (0,0), (2,0); then layer 0.
  EXPECT_EQ(import_duo_tsv(path, c, 2.0 / 3.0).retrieval, bits({1, 1, 0, 0, 1, 0}));
  EXPECT_EQ(import_duo_tsv(path, c, 0.0).retrieval, bits({1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(import_duo_tsv(path, c, 1.0).retrieval, bits({1, 1, 0, 0, 0, 0}));
  // 0.75 * 6 = 4.5 rounds to 5: (0,0), (2,0), (1,0), (1,1), (2,1).
  EXPECT_EQ(import_duo_tsv(path, c, 0.25).retrieval, bits({1, 1, 1, 1, 1, 1}));
  r.validate(c, path);
}

TEST(HeadRolesDuo, TiesGoToTheLowerIndex) {
  const ModelConfig c = config_of(3, 2);
  const std::string path = write_file("duo_ties.tsv", "0.3\t0.3\n0.3\t0.3\n0.3\t0.3\n");
  EXPECT_EQ(import_duo_tsv(path, c, 0.5).retrieval, bits({1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(import_duo_tsv(path, c, 1.0 / 3.0).retrieval, bits({1, 1, 1, 1, 0, 0}));  // 4 of 6
  // Heads ranked in layer 0 still count against the budget: 2 of 6 -> only layer 0.
  EXPECT_EQ(import_duo_tsv(path, c, 2.0 / 3.0).retrieval, bits({1, 1, 0, 0, 0, 0}));
}

TEST(HeadRolesDuo, MalformedFilesNameTheLineAndColumn) {
  const ModelConfig c = config_of(3, 2);
  const auto check = [&](const std::string& name, const std::string& text, const std::string& message) {
    const std::string path = write_file(name, text);
    expect_error([&] { import_duo_tsv(path, c, 0.5); }, ErrorCode::kInvalidFile, {path + ": " + message});
  };
  check("rows.tsv", "1\t1\n1\t1\n", "has 2 rows but the model has 3 layers");
  check("cols.tsv", "1\t1\n1\t1\t1\n1\t1\n", "line 2 has 3 values but the model has 2 KV heads");
  check("nan_text.tsv", "1\t1\nabc\t1\n1\t1\n", "line 2 column 1: 'abc' is not a number");
  check("partial.tsv", "1\t1\n0.5x\t1\n1\t1\n", "line 2 column 1: '0.5x' is not a number");
  check("range.tsv", "1\t1\n1\t1\n1\t1.5\n", "line 3 column 2: 1.5 is outside [0, 1]");
  check("negative.tsv", "1\t-0.1\n1\t1\n1\t1\n", "line 1 column 2: -0.1 is outside [0, 1]");
  check("nan.tsv", "1\tnan\n1\t1\n1\t1\n", "line 1 column 2: value is NaN");
  check("blank.tsv", "1\t1\n\n1\t1\n1\t1\n", "line 2 is empty");
  const std::string ok = write_file("ok.tsv", kDuoTsv);
  expect_error([&] { import_duo_tsv(ok, c, 1.5); }, ErrorCode::kInvalidArgument, {"sparsity must be in [0, 1], got 1.5"});
  expect_error([&] { import_duo_tsv(ok, c, -0.1); }, ErrorCode::kInvalidArgument, {"sparsity"});
}

TEST(HeadRolesDuo, ExportWritesGatesElseRoles) {
  const ModelConfig c = config_of(3, 2);
  const HeadRoles r = import_duo_tsv(write_file("duo_src.tsv", kDuoTsv), c, 0.5);
  const std::string out = test::temp_dir("head_roles") + "/duo_out.tsv";
  export_duo_tsv(r, out);
  EXPECT_EQ(read_text_file(out), "0.9\t0.1\n0.5\t0.5\n0.7\t0.2\n");
  EXPECT_EQ(import_duo_tsv(out, c, 0.5).gate, r.gate);
  HeadRoles no_gates = r;
  no_gates.gate.clear();
  export_duo_tsv(no_gates, out);
  EXPECT_EQ(read_text_file(out), "1\t1\n1\t0\n1\t0\n");
}

// ---- plain matrix ------------------------------------------------------------------------

TEST(HeadRolesMatrix, ImportsCommentsAndSeparatorsAndRoundTrips) {
  const ModelConfig c = config_of(3, 3);
  const std::string path =
      write_file("m.txt", "# roles for tiny\n1 1 1   # layer 0\n\n0,1,0\n0\t0 , 1\n");
  const HeadRoles r = import_role_matrix(path, c);
  EXPECT_EQ(r.retrieval, bits({1, 1, 1, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(r.provenance["source"], path);
  const std::string out = test::temp_dir("head_roles") + "/m_out.txt";
  export_role_matrix(r, out);
  EXPECT_NE(read_text_file(out).find("1 1 1\n0 1 0\n0 0 1\n"), std::string::npos) << read_text_file(out);
  EXPECT_EQ(import_role_matrix(out, c).retrieval, r.retrieval);
}

TEST(HeadRolesMatrix, StrictErrors) {
  const ModelConfig c = config_of(3, 3);
  const auto check = [&](const std::string& name, const std::string& text, const std::string& message) {
    const std::string path = write_file(name, text);
    expect_error([&] { import_role_matrix(path, c); }, ErrorCode::kInvalidFile, {path + ": " + message});
  };
  check("m_value.txt", "1 1 1\n# c\n0 2 0\n0 0 1\n", "line 3 column 2: expected 0 or 1, got '2'");
  check("m_float.txt", "1 1 1\n0 1.0 0\n0 0 1\n", "line 2 column 2: expected 0 or 1, got '1.0'");
  check("m_rows.txt", "1 1 1\n0 1 0\n", "has 2 rows but the model has 3 layers");
  check("m_cols.txt", "1 1 1\n0 1\n0 0 1\n", "line 2 has 2 values but the model has 3 KV heads");
  check("m_layer0.txt", "1 0 1\n0 1 0\n0 0 1\n",
        "layer 0 must be all retrieval heads (LycheeDecode selects in layer 0), head 1 is sparse");
}

// ---- stand-ins and the map ---------------------------------------------------------------

std::vector<int> retrieval_layers(const HeadRoles& r) {
  std::vector<int> layers;
  for (int l = 0; l < r.n_layers; ++l) {
    bool all = true, any = false;
    for (int h = 0; h < r.n_kv_heads; ++h) {
      all = all && r.is_retrieval(l, h);
      any = any || r.is_retrieval(l, h);
    }
    EXPECT_EQ(all, any) << "layer " << l << " is mixed";
    if (all) layers.push_back(l);
  }
  return layers;
}

TEST(HeadRolesStandIn, MakeAndFromLayers) {
  const ModelConfig c = config_of(5, 2);
  const HeadRoles empty = make_head_roles(c);
  EXPECT_EQ(empty.retrieval, std::vector<uint8_t>(10, 0));
  EXPECT_EQ(empty.model, json({{"name", "tiny"}, {"architecture", "llama"}, {"n_layers", 5}, {"n_heads", 4},
                               {"n_kv_heads", 2}, {"head_dim", 8}}));
  EXPECT_EQ(retrieval_layers(head_roles_from_layers(c, {3, 3})), (std::vector<int>{0, 3}));
  EXPECT_EQ(retrieval_layers(head_roles_from_layers(c, {})), (std::vector<int>{0}));
  expect_error([&] { head_roles_from_layers(c, {5}); }, ErrorCode::kInvalidArgument, {"layer 5", "0..4"});
  expect_error([&] { head_roles_from_layers(c, {-1}); }, ErrorCode::kInvalidArgument, {"layer -1"});
}

TEST(HeadRolesStandIn, DefaultIsTidalMatched) {
  EXPECT_EQ(retrieval_layers(default_head_roles(config_of(32, 2))), (std::vector<int>{0, 1, 2, 13}));
  EXPECT_EQ(retrieval_layers(default_head_roles(config_of(30, 2))), (std::vector<int>{0, 1, 2, 12}));
  EXPECT_EQ(retrieval_layers(default_head_roles(config_of(36, 2))), (std::vector<int>{0, 1, 2, 15}));
  EXPECT_EQ(retrieval_layers(default_head_roles(config_of(4, 2))), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(retrieval_layers(default_head_roles(config_of(2, 2))), (std::vector<int>{0, 1}));
  EXPECT_EQ(retrieval_layers(default_head_roles(config_of(1, 2))), (std::vector<int>{0}));
  EXPECT_EQ(default_head_roles(config_of(32, 8)).n_retrieval(), 32);  // the paper's budget for Llama-3-8B
}

TEST(HeadRolesMap, HandMadeCase) {
  HeadRoles r = make_head_roles(config_of(3, 2));
  r.retrieval = bits({1, 1, 0, 1, 0, 0});
  EXPECT_EQ(format_head_role_map(r),
            "head | 0 1\n"
            "L 0  | R R\n"
            "L 1  | . R\n"
            "L 2  | . .\n"
            "3 of 6 KV heads are retrieval (50.0%)\n");
  const std::string wide = format_head_role_map(head_roles_from_layers(config_of(12, 11), {10}));
  EXPECT_EQ(wide.substr(0, wide.find('\n')), "head |  0  1  2  3  4  5  6  7  8  9 10");
  EXPECT_NE(wide.find("\nL 10 |  R  R  R  R  R  R  R  R  R  R  R\nL 11 |  .  ."), std::string::npos) << wide;
  EXPECT_NE(wide.find("22 of 132 KV heads are retrieval (16.7%)"), std::string::npos) << wide;
}

TEST(HeadRolesDoc, TheExampleInTheSpecLoadsAndMapsAsShown) {
  const std::string doc = read_text_file(std::string(LYCHEE_SOURCE_DIR) + "/docs/head-roles.md");
  const size_t begin = doc.find("```json\n") + 8, end = doc.find("```", begin);
  ASSERT_NE(end, std::string::npos);
  ModelConfig c = config_of(4, 3);
  c.n_heads = 9;
  c.head_dim = 64;
  const HeadRoles r = load_head_roles(write_file("doc_example.json", doc.substr(begin, end - begin)), c);
  EXPECT_EQ(r.expected_z.size(), 12u);
  const std::string map = format_head_role_map(r);
  EXPECT_NE(doc.find(map), std::string::npos) << map;
}

// ---- the CLI -----------------------------------------------------------------------------

using test::RunResult;
using test::run_cli;

void expect_cli_error(const RunResult& r, const std::string& message) {
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("lychee: error: " + message), std::string::npos) << r.output;
}

TEST(HeadRolesCli, DefaultShowInspect) {
  const std::string model = test::golden_dir() + "/models/llama_tied_f32";  // 2 layers, 2 KV heads
  const std::string dir = test::temp_dir("heads_cli");
  RunResult r = run_cli("heads default -m " + model + " -o " + dir + "/roles.json --layers 0");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_cli("heads show " + dir + "/roles.json");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("L 0  | R R\nL 1  | . .\n2 of 4 KV heads are retrieval (50.0%)"), std::string::npos)
      << r.output;
  r = run_cli("heads show " + dir + "/roles.json -m " + model);
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_cli("inspect -m " + model + " --heads " + dir + "/roles.json");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("2 of 4 KV heads are retrieval"), std::string::npos) << r.output;

  r = run_cli("heads default -m " + model + " -o " + dir + "/default.json");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("4 of 4 KV heads are retrieval"), std::string::npos) << r.output;
}

TEST(HeadRolesCli, ImportExport) {
  const std::string model = test::golden_dir() + "/models/llama_tied_f32";
  const std::string dir = test::temp_dir("heads_cli");
  const std::string tsv = write_file("cli_duo.tsv", "0.2\t0.1\n0.8\t0.3\n");
  RunResult r = run_cli("heads import --duo " + tsv + " --sparsity 0.75 -m " + model + " -o " + dir + "/duo.json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(load_head_roles_unchecked(dir + "/duo.json").retrieval, bits({1, 1, 1, 0}));
  r = run_cli("heads export " + dir + "/duo.json --matrix " + dir + "/duo.txt");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_cli("heads import --matrix " + dir + "/duo.txt -m " + model + " -o " + dir + "/m.json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(load_head_roles_unchecked(dir + "/m.json").retrieval, bits({1, 1, 1, 0}));
  r = run_cli("heads export " + dir + "/duo.json --duo " + dir + "/back.tsv");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_text_file(dir + "/back.tsv"), "0.2\t0.1\n0.8\t0.3\n");
}

TEST(HeadRolesCli, BadFilesExitOneWithTheMessage) {
  const std::string model = test::golden_dir() + "/models/llama_tied_f32";
  json d = valid_doc();
  d["roles"][1][0] = 2;
  const std::string bad = write_file("cli_bad.json", d.dump());
  expect_cli_error(run_cli("heads show " + bad), bad + ": roles[1][0] must be 0 or 1, got 2");
  const std::string shape = write_file("cli_shape.json", valid_doc().dump());
  expect_cli_error(run_cli("inspect -m " + model + " --heads " + shape),
                   shape + ": roles has 3 rows but the model has 2 layers");
  expect_cli_error(run_cli("heads show " + shape + " -m " + model), shape + ": roles has 3 rows");
  expect_cli_error(run_cli("heads default -m " + model + " -o " + test::temp_dir("heads_cli") + "/x.json --layers 0,7"),
                   "retrieval layer 7 is out of range");
}

}  // namespace
}  // namespace lychee
