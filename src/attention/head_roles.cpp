// Head-role files: lychee's JSON format (docs/head-roles.md), DuoAttention's TSV and a plain
// 0/1 matrix. Every reader is strict and names the file, the field or line/column, what it
// expected and what it found.
#include "attention/head_roles.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/mmap_file.h"

namespace lychee {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "lychee-head-roles";
constexpr int kVersion = 1;
const std::set<std::string> kTopLevelKeys = {"format", "version", "model", "roles", "gates", "provenance"};
const std::set<std::string> kModelKeys = {"name", "architecture", "n_layers", "n_heads", "n_kv_heads", "head_dim"};
const char* const kGateNames[] = {"alpha", "beta", "expected_z", "gate"};

// The gate array a name in "gates" refers to.
std::vector<float> HeadRoles::*gate_member(const std::string& name) {
  if (name == "alpha") return &HeadRoles::alpha;
  if (name == "beta") return &HeadRoles::beta;
  if (name == "expected_z") return &HeadRoles::expected_z;
  return &HeadRoles::gate;
}

// ---- JSON reading --------------------------------------------------------------------------

enum class ValueRule { kZeroOne, kPositive, kUnitInterval };

struct JsonMatrix {
  int rows = 0, cols = 0;
  std::vector<double> values;  // [rows][cols]
};

ValueRule gate_rule(const std::string& name) {
  return name == "alpha" || name == "beta" ? ValueRule::kPositive : ValueRule::kUnitInterval;
}

// A gate value against its rule. `shown` is the value as the file writes it.
void check_gate_value(double x, ValueRule rule, const std::string& src, const std::string& where,
                      const std::string& shown) {
  // Stored as f32: a value that overflows f32 is as unusable as an infinite one.
  LY_CHECK(std::isfinite(float(x)), ErrorCode::kInvalidFile, "{}: {} must be a finite number, got {}", src,
           where, shown);
  if (rule == ValueRule::kPositive)
    LY_CHECK(x > 0.0, ErrorCode::kInvalidFile, "{}: {} must be > 0, got {}", src, where, shown);
  else
    LY_CHECK(x >= 0.0 && x <= 1.0, ErrorCode::kInvalidFile, "{}: {} must be in [0, 1], got {}", src, where, shown);
}

// One element of a matrix field, checked against its rule. `where` is e.g. "roles[3][2]".
double read_matrix_value(const json& v, ValueRule rule, const std::string& src, const std::string& where) {
  if (rule == ValueRule::kZeroOne) {
    const bool ok = v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1);
    LY_CHECK(ok, ErrorCode::kInvalidFile, "{}: {} must be 0 or 1, got {}", src, where, v.dump());
    return double(v.get<int64_t>());
  }
  LY_CHECK(v.is_number(), ErrorCode::kInvalidFile, "{}: {} must be a number, got {}", src, where, v.dump());
  const double x = v.get<double>();
  check_gate_value(x, rule, src, where, v.dump());
  return x;
}

// A non-empty array of equally long, non-empty arrays of values.
JsonMatrix read_json_matrix(const json& j, const std::string& src, const std::string& field, ValueRule rule) {
  LY_CHECK(j.is_array(), ErrorCode::kInvalidFile, "{}: {} must be an array of rows, got {}", src, field,
           j.type_name());
  LY_CHECK(!j.empty(), ErrorCode::kInvalidFile, "{}: {} has no rows", src, field);
  JsonMatrix m;
  m.rows = int(j.size());
  for (int i = 0; i < m.rows; ++i) {
    const json& row = j[size_t(i)];
    LY_CHECK(row.is_array(), ErrorCode::kInvalidFile, "{}: {}[{}] must be an array, got {}", src, field, i,
             row.type_name());
    LY_CHECK(!row.empty(), ErrorCode::kInvalidFile, "{}: {}[{}] is empty", src, field, i);
    if (i == 0) m.cols = int(row.size());
    LY_CHECK(int(row.size()) == m.cols, ErrorCode::kInvalidFile, "{}: {}[{}] has {} entries but {}[0] has {}",
             src, field, i, row.size(), field, m.cols);
    for (int k = 0; k < m.cols; ++k)
      m.values.push_back(read_matrix_value(row[size_t(k)], rule, src, fmt::format("{}[{}][{}]", field, i, k)));
  }
  return m;
}

void check_top_level(const json& doc, const std::string& src) {
  LY_CHECK(doc.is_object(), ErrorCode::kInvalidFile, "{}: the top level must be a JSON object, got {}", src,
           doc.type_name());
  for (const auto& [key, value] : doc.items())
    LY_CHECK(kTopLevelKeys.count(key) != 0, ErrorCode::kInvalidFile,
             "{}: unknown top-level key '{}' (allowed: format, version, model, roles, gates, provenance)", src, key);
  for (const char* key : {"format", "version", "model", "roles"})
    LY_CHECK(doc.contains(key), ErrorCode::kInvalidFile, "{}: missing field '{}'", src, key);
  const json& f = doc["format"];
  LY_CHECK(f.is_string() && f.get<std::string>() == kFormat, ErrorCode::kInvalidFile,
           "{}: format is {}, expected \"{}\"", src, f.dump(), kFormat);
  const json& v = doc["version"];
  LY_CHECK(v.is_number_integer() && v.get<int64_t>() == kVersion, ErrorCode::kInvalidFile,
           "{}: version is {}, expected {} (the only version this build reads)", src, v.dump(), kVersion);
  if (doc.contains("provenance"))
    LY_CHECK(doc["provenance"].is_object(), ErrorCode::kInvalidFile, "{}: provenance must be an object, got {}",
             src, doc["provenance"].type_name());
}

void check_model_block(const json& m, const std::string& src) {
  LY_CHECK(m.is_object(), ErrorCode::kInvalidFile, "{}: model must be an object, got {}", src, m.type_name());
  for (const auto& [key, value] : m.items())
    LY_CHECK(kModelKeys.count(key) != 0, ErrorCode::kInvalidFile,
             "{}: unknown key model.{} (allowed: name, architecture, n_layers, n_heads, n_kv_heads, head_dim)",
             src, key);
  for (const std::string& key : kModelKeys) {
    LY_CHECK(m.contains(key), ErrorCode::kInvalidFile, "{}: missing field model.{}", src, key);
    const json& v = m[key];
    if (key == "name" || key == "architecture")
      LY_CHECK(v.is_string(), ErrorCode::kInvalidFile, "{}: model.{} must be a string, got {}", src, key, v.dump());
    else
      LY_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (1 << 20),
               ErrorCode::kInvalidFile, "{}: model.{} must be a positive integer, got {}", src, key, v.dump());
  }
}

void read_gates(const json& g, const std::string& src, HeadRoles& r) {
  LY_CHECK(g.is_object(), ErrorCode::kInvalidFile, "{}: gates must be an object, got {}", src, g.type_name());
  for (const auto& [key, value] : g.items()) {
    const bool known = std::find(std::begin(kGateNames), std::end(kGateNames), key) != std::end(kGateNames);
    LY_CHECK(known, ErrorCode::kInvalidFile, "{}: unknown key gates.{} (allowed: alpha, beta, expected_z, gate)",
             src, key);
    const std::string field = "gates." + key;
    const JsonMatrix m = read_json_matrix(value, src, field, gate_rule(key));
    LY_CHECK(m.rows == r.n_layers, ErrorCode::kInvalidFile, "{}: {} has {} rows but roles has {}", src, field,
             m.rows, r.n_layers);
    LY_CHECK(m.cols == r.n_kv_heads, ErrorCode::kInvalidFile, "{}: {} rows have {} entries but roles rows have {}",
             src, field, m.cols, r.n_kv_heads);
    (r.*gate_member(key)).assign(m.values.begin(), m.values.end());
  }
}

// The document's content with every field checked on its own; nothing compared to a model yet.
HeadRoles parse_head_roles(const std::string& path) {
  json doc;
  try {
    doc = json::parse(read_text_file(path));
  } catch (const json::parse_error& e) {
    fail(ErrorCode::kInvalidFile, "{}: not valid JSON ({})", path, e.what());
  }
  check_top_level(doc, path);
  check_model_block(doc["model"], path);
  const JsonMatrix m = read_json_matrix(doc["roles"], path, "roles", ValueRule::kZeroOne);
  HeadRoles r;
  r.n_layers = m.rows;
  r.n_kv_heads = m.cols;
  for (double v : m.values) r.retrieval.push_back(uint8_t(v));
  if (doc.contains("gates")) read_gates(doc["gates"], path, r);
  r.model = doc["model"];
  if (doc.contains("provenance")) r.provenance = doc["provenance"];
  return r;
}

void check_shape(const HeadRoles& r, const ModelConfig& c, const std::string& src) {
  LY_CHECK(r.n_layers == c.n_layers, ErrorCode::kInvalidFile, "{}: roles has {} rows but the model has {} layers",
           src, r.n_layers, c.n_layers);
  LY_CHECK(r.n_kv_heads == c.n_kv_heads, ErrorCode::kInvalidFile,
           "{}: roles rows have {} entries but the model has {} KV heads", src, r.n_kv_heads, c.n_kv_heads);
  const size_t n = size_t(r.n_layers) * size_t(r.n_kv_heads);
  LY_CHECK(r.retrieval.size() == n, ErrorCode::kInvalidFile, "{}: roles holds {} values, expected {} x {} = {}",
           src, r.retrieval.size(), r.n_layers, r.n_kv_heads, n);
  for (const char* name : kGateNames) {
    const std::vector<float>& g = r.*gate_member(name);
    LY_CHECK(g.empty() || g.size() == n, ErrorCode::kInvalidFile, "{}: gates.{} holds {} values, expected {}", src,
             name, g.size(), n);
  }
}

void check_layer0(const HeadRoles& r, const std::string& src) {
  for (int h = 0; h < r.n_kv_heads; ++h)
    LY_CHECK(r.is_retrieval(0, h), ErrorCode::kInvalidFile,
             "{}: layer 0 must be all retrieval heads (LycheeDecode selects in layer 0), head {} is sparse", src, h);
}

// The model block against the checkpoint's config. Name and architecture are informative only:
// GGUF and Hugging Face name the same model differently.
void check_model_against(const json& m, const ModelConfig& c, const std::string& src) {
  const std::pair<const char*, std::string> expected[] = {
      {"n_layers", fmt::format("{} layers", c.n_layers)},
      {"n_heads", fmt::format("{} query heads", c.n_heads)},
      {"n_kv_heads", fmt::format("{} KV heads", c.n_kv_heads)},
      {"head_dim", fmt::format("head_dim {}", c.head_dim)}};
  const int actual[] = {c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim};
  for (int i = 0; i < 4; ++i) {
    const int64_t v = m[expected[i].first].get<int64_t>();
    LY_CHECK(v == actual[i], ErrorCode::kInvalidFile, "{}: model.{} is {} but the model has {}", src,
             expected[i].first, v, expected[i].second);
  }
}

// ---- JSON writing --------------------------------------------------------------------------

// One row per line; floats as the shortest text that reads back to the same f32.
template <typename T>
std::string matrix_json(const std::vector<T>& v, int n_layers, int n_kv_heads, const std::string& indent) {
  std::string out = "[\n";
  for (int l = 0; l < n_layers; ++l) {
    out += indent + "  [";
    for (int h = 0; h < n_kv_heads; ++h) {
      const T x = v[size_t(l) * size_t(n_kv_heads) + size_t(h)];
      if (h > 0) out += ", ";
      if constexpr (std::is_floating_point_v<T>) out += fmt::format("{}", x);
      else out += fmt::format("{}", int(x));
    }
    out += l + 1 < n_layers ? "],\n" : "]\n";
  }
  return out + indent + "]";
}

std::string indented_json(const json& j) {
  std::string s = j.dump(2);
  std::string out;
  for (char ch : s) out += ch == '\n' ? std::string("\n  ") : std::string(1, ch);
  return out;
}

// ---- text matrices (DuoAttention TSV, plain 0/1) ------------------------------------------

struct TextRow {
  int line = 0;                     // 1-based line number in the file
  std::vector<std::string> fields;  // the values as written
};

// Splits `text` into rows of fields. Separators: whitespace, plus ',' when `commas`. With
// `comments`, '#' starts a comment and blank lines are skipped anywhere; without, blank lines
// are allowed only at the end of the file (a blank line inside would shift every later layer).
std::vector<TextRow> split_rows(const std::string& text, bool commas, bool comments, const std::string& src) {
  std::vector<TextRow> rows;
  int line_no = 0, first_blank = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (comments && line.find('#') != std::string::npos) line.resize(line.find('#'));
    TextRow row{line_no, {}};
    std::string cur;
    for (char ch : line + " ") {
      const bool sep = ch == ' ' || ch == '\t' || ch == '\r' || (commas && ch == ',');
      if (!sep) cur += ch;
      else if (!cur.empty()) row.fields.push_back(std::move(cur)), cur.clear();
    }
    if (row.fields.empty()) {
      if (first_blank == 0) first_blank = line_no;
      continue;
    }
    LY_CHECK(comments || first_blank == 0, ErrorCode::kInvalidFile, "{}: line {} is empty", src, first_blank);
    rows.push_back(std::move(row));
  }
  return rows;
}

void check_text_shape(const std::vector<TextRow>& rows, const ModelConfig& c, const std::string& src) {
  LY_CHECK(int(rows.size()) == c.n_layers, ErrorCode::kInvalidFile,
           "{}: has {} rows but the model has {} layers", src, rows.size(), c.n_layers);
  for (const TextRow& row : rows)
    LY_CHECK(int(row.fields.size()) == c.n_kv_heads, ErrorCode::kInvalidFile,
             "{}: line {} has {} values but the model has {} KV heads", src, row.line, row.fields.size(),
             c.n_kv_heads);
}

double parse_unit_value(const std::string& s, const std::string& src, int line, int col) {
  double x = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  LY_CHECK(ec == std::errc() && end == s.data() + s.size(), ErrorCode::kInvalidFile,
           "{}: line {} column {}: '{}' is not a number", src, line, col, s);
  LY_CHECK(!std::isnan(x), ErrorCode::kInvalidFile, "{}: line {} column {}: value is NaN", src, line, col);
  LY_CHECK(x >= 0.0 && x <= 1.0, ErrorCode::kInvalidFile, "{}: line {} column {}: {} is outside [0, 1]", src,
           line, col, s);
  return x;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  LY_CHECK(out.good(), ErrorCode::kNotFound, "{}: cannot open for writing", path);
  out << text;
  out.close();
  LY_CHECK(out.good(), ErrorCode::kInvalidFile, "{}: write failed", path);
}

// What a writer is given must be what the readers accept, so a saved file always loads. The
// readers' checks run here, reported as the caller's mistake.
void check_savable(const HeadRoles& r, const std::string& path) {
  try {
    const size_t n = size_t(r.n_layers) * size_t(r.n_kv_heads);
    LY_CHECK(r.n_layers > 0 && r.n_kv_heads > 0 && r.retrieval.size() == n, ErrorCode::kInvalidFile,
             "roles hold {} values for {} layers x {} KV heads", r.retrieval.size(), r.n_layers, r.n_kv_heads);
    for (size_t i = 0; i < n; ++i)
      LY_CHECK(r.retrieval[i] <= 1, ErrorCode::kInvalidFile, "roles[{}][{}] must be 0 or 1, got {}",
               i / r.n_kv_heads, i % r.n_kv_heads, int(r.retrieval[i]));
    for (const char* name : kGateNames) {
      const std::vector<float>& g = r.*gate_member(name);
      LY_CHECK(g.empty() || g.size() == n, ErrorCode::kInvalidFile, "gates.{} holds {} values, expected {}", name,
               g.size(), n);
      for (size_t i = 0; i < g.size(); ++i)
        check_gate_value(g[i], gate_rule(name), "roles",
                         fmt::format("gates.{}[{}][{}]", name, i / r.n_kv_heads, i % r.n_kv_heads),
                         fmt::format("{}", g[i]));
    }
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, "cannot write {}: {}", path, e.what());
  }
}

}  // namespace

// ---- HeadRoles -----------------------------------------------------------------------------

int HeadRoles::n_retrieval() const {
  return int(std::count_if(retrieval.begin(), retrieval.end(), [](uint8_t v) { return v != 0; }));
}

void HeadRoles::validate(const ModelConfig& c, const std::string& source) const {
  check_shape(*this, c, source);
  check_layer0(*this, source);
}

HeadRoles make_head_roles(const ModelConfig& c) {
  HeadRoles r;
  r.n_layers = c.n_layers;
  r.n_kv_heads = c.n_kv_heads;
  r.retrieval.assign(size_t(c.n_layers) * size_t(c.n_kv_heads), 0);
  r.model = {{"name", c.name},          {"architecture", arch_name(c.arch)}, {"n_layers", c.n_layers},
             {"n_heads", c.n_heads},    {"n_kv_heads", c.n_kv_heads},        {"head_dim", c.head_dim}};
  return r;
}

HeadRoles head_roles_from_layers(const ModelConfig& c, const std::vector<int>& layers) {
  std::set<int> chosen = {0};
  for (int l : layers) {
    LY_CHECK(l >= 0 && l < c.n_layers, ErrorCode::kInvalidArgument,
             "retrieval layer {} is out of range: the model has layers 0..{}", l, c.n_layers - 1);
    chosen.insert(l);
  }
  HeadRoles r = make_head_roles(c);
  for (int l : chosen)
    std::fill_n(r.retrieval.begin() + ptrdiff_t(l) * c.n_kv_heads, c.n_kv_heads, uint8_t(1));
  r.provenance = {{"method", "layers"}, {"layers", std::vector<int>(chosen.begin(), chosen.end())}};
  return r;
}

HeadRoles default_head_roles(const ModelConfig& c) {
  const int last = std::max(0, c.n_layers - 1);
  const int tidal = int(std::lround(13.0 * c.n_layers / 32.0));
  std::vector<int> layers;
  for (int l : {0, 1, 2, tidal}) layers.push_back(std::min(l, last));
  HeadRoles r = head_roles_from_layers(c, layers);
  r.provenance["method"] = "default";
  r.provenance["rule"] = "TidalDecode-matched stand-in: every KV head of layers 0, 1, 2 and round(13/32 * n_layers)";
  return r;
}

HeadRoles seeded_head_roles(const ModelConfig& c, int n_retrieval, uint32_t seed) {
  const int n = c.n_layers * c.n_kv_heads;
  LY_CHECK(n_retrieval >= c.n_kv_heads && n_retrieval <= n, ErrorCode::kInvalidArgument,
           "{} retrieval heads: need from {} (layer 0) to {} (every head)", n_retrieval, c.n_kv_heads, n);
  HeadRoles r = make_head_roles(c);
  std::fill_n(r.retrieval.begin(), c.n_kv_heads, uint8_t(1));
  std::vector<int> rest(size_t(n - c.n_kv_heads));
  std::iota(rest.begin(), rest.end(), c.n_kv_heads);
  std::mt19937 rng(seed);
  std::shuffle(rest.begin(), rest.end(), rng);
  for (int i = 0; i < n_retrieval - c.n_kv_heads; ++i) r.retrieval[size_t(rest[size_t(i)])] = 1;
  r.provenance = {{"method", "seeded"}, {"seed", seed}, {"n_retrieval", n_retrieval},
                  {"rule", "layer 0 and a draw from layers 1.. (std::shuffle, std::mt19937(seed))"}};
  return r;
}

HeadRoles load_head_roles_unchecked(const std::string& path) {
  HeadRoles r = parse_head_roles(path);
  const int64_t nl = r.model["n_layers"].get<int64_t>(), nh = r.model["n_kv_heads"].get<int64_t>();
  LY_CHECK(nl == r.n_layers, ErrorCode::kInvalidFile, "{}: model.n_layers is {} but roles has {} rows", path, nl,
           r.n_layers);
  LY_CHECK(nh == r.n_kv_heads, ErrorCode::kInvalidFile, "{}: model.n_kv_heads is {} but roles rows have {} entries",
           path, nh, r.n_kv_heads);
  return r;
}

HeadRoles load_head_roles(const std::string& path, const ModelConfig& c) {
  HeadRoles r = parse_head_roles(path);
  check_shape(r, c, path);
  check_model_against(r.model, c, path);
  check_layer0(r, path);
  return r;
}

void save_head_roles(const HeadRoles& r, const std::string& path) {
  check_savable(r, path);
  try {
    check_model_block(r.model, "roles");
    LY_CHECK(r.model["n_layers"] == r.n_layers && r.model["n_kv_heads"] == r.n_kv_heads, ErrorCode::kInvalidFile,
             "model block says {} x {} but the roles are {} x {}", r.model["n_layers"].dump(),
             r.model["n_kv_heads"].dump(), r.n_layers, r.n_kv_heads);
    LY_CHECK(r.provenance.is_null() || r.provenance.is_object(), ErrorCode::kInvalidFile,
             "provenance must be an object, got {}", r.provenance.type_name());
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, "cannot write {}: {}", path, e.what());
  }
  std::string out = fmt::format("{{\n  \"format\": \"{}\",\n  \"version\": {},\n", kFormat, kVersion);
  out += "  \"model\": " + indented_json(r.model) + ",\n";
  out += "  \"roles\": " + matrix_json(r.retrieval, r.n_layers, r.n_kv_heads, "  ");
  std::vector<std::string> gates;
  for (const char* name : kGateNames)
    if (const std::vector<float>& g = r.*gate_member(name); !g.empty())
      gates.push_back(fmt::format("    \"{}\": {}", name, matrix_json(g, r.n_layers, r.n_kv_heads, "    ")));
  if (!gates.empty()) out += ",\n  \"gates\": {\n" + fmt::format("{}", fmt::join(gates, ",\n")) + "\n  }";
  if (!r.provenance.is_null()) out += ",\n  \"provenance\": " + indented_json(r.provenance);
  write_text_file(path, out + "\n}\n");
}

// ---- DuoAttention TSV ----------------------------------------------------------------------

HeadRoles import_duo_tsv(const std::string& path, const ModelConfig& c, double sparsity) {
  LY_CHECK(sparsity >= 0.0 && sparsity <= 1.0, ErrorCode::kInvalidArgument, "sparsity must be in [0, 1], got {}",
           sparsity);
  const std::vector<TextRow> rows = split_rows(read_text_file(path), false, false, path);
  check_text_shape(rows, c, path);
  HeadRoles r = make_head_roles(c);
  for (const TextRow& row : rows)
    for (size_t k = 0; k < row.fields.size(); ++k)
      r.gate.push_back(float(parse_unit_value(row.fields[k], path, row.line, int(k) + 1)));
  // DuoAttention's deploy rule: the (1 - sparsity) fraction with the largest gates are retrieval.
  // Ties go to the lower (layer, head) index: stable sort over indices in ascending order.
  const size_t n = r.gate.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.gate[a] > r.gate[b]; });
  const size_t n_top = size_t(std::lround((1.0 - sparsity) * double(n)));
  for (size_t i = 0; i < std::min(n_top, n); ++i) r.retrieval[order[i]] = 1;
  std::fill_n(r.retrieval.begin(), c.n_kv_heads, uint8_t(1));  // LycheeDecode selects in layer 0
  r.provenance = {{"method", "duoattention"}, {"source", path}, {"sparsity", sparsity},
                  {"rule", "top round((1 - sparsity) * n_layers * n_kv_heads) gates, ties to the lower index; "
                           "layer 0 forced to retrieval"}};
  return r;
}

void export_duo_tsv(const HeadRoles& r, const std::string& path) {
  check_savable(r, path);
  std::string out;
  for (int l = 0; l < r.n_layers; ++l) {
    for (int h = 0; h < r.n_kv_heads; ++h) {
      const size_t i = size_t(l) * size_t(r.n_kv_heads) + size_t(h);
      if (h > 0) out += "\t";
      out += r.gate.empty() ? fmt::format("{}", int(r.retrieval[i])) : fmt::format("{}", r.gate[i]);
    }
    out += "\n";
  }
  write_text_file(path, out);
}

// ---- plain 0/1 matrix ----------------------------------------------------------------------

HeadRoles import_role_matrix(const std::string& path, const ModelConfig& c) {
  const std::vector<TextRow> rows = split_rows(read_text_file(path), true, true, path);
  check_text_shape(rows, c, path);
  HeadRoles r = make_head_roles(c);
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const std::string& s = rows[size_t(l)].fields[size_t(h)];
      LY_CHECK(s == "0" || s == "1", ErrorCode::kInvalidFile, "{}: line {} column {}: expected 0 or 1, got '{}'",
               path, rows[size_t(l)].line, h + 1, s);
      r.retrieval[size_t(l) * size_t(c.n_kv_heads) + size_t(h)] = s == "1";
    }
  // Not forced: a sparse head in layer 0 is the user's mistake, so say so.
  check_layer0(r, path);
  r.provenance = {{"method", "matrix"}, {"source", path}};
  return r;
}

void export_role_matrix(const HeadRoles& r, const std::string& path) {
  check_savable(r, path);
  std::string out = fmt::format("# lychee head roles: {} layers x {} KV heads, 1 = retrieval, 0 = sparse\n",
                                r.n_layers, r.n_kv_heads);
  for (int l = 0; l < r.n_layers; ++l) {
    for (int h = 0; h < r.n_kv_heads; ++h) out += fmt::format("{}{}", h > 0 ? " " : "", int(r.is_retrieval(l, h)));
    out += "\n";
  }
  write_text_file(path, out);
}

// ---- terminal map --------------------------------------------------------------------------

std::string format_head_role_map(const HeadRoles& r) {
  const int cell = int(std::to_string(std::max(0, r.n_kv_heads - 1)).size());
  const int label = std::max(4, 2 + int(std::to_string(std::max(0, r.n_layers - 1)).size()));
  std::string out = fmt::format("{:>{}} |", "head", label);
  for (int h = 0; h < r.n_kv_heads; ++h) out += fmt::format(" {:>{}}", h, cell);
  out += "\n";
  for (int l = 0; l < r.n_layers; ++l) {
    out += fmt::format("{:<{}} |", fmt::format("L {}", l), label);
    for (int h = 0; h < r.n_kv_heads; ++h) out += fmt::format(" {:>{}}", r.is_retrieval(l, h) ? "R" : ".", cell);
    out += "\n";
  }
  const int n = r.n_layers * r.n_kv_heads;
  const double pct = n > 0 ? 100.0 * r.n_retrieval() / n : 0.0;
  return out + fmt::format("{} of {} KV heads are retrieval ({:.1f}%)\n", r.n_retrieval(), n, pct);
}

}  // namespace lychee
