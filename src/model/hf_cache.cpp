#include "model/hf_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace fs = std::filesystem;

namespace lychee {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.';
}

bool is_name(std::string_view s) {
  return !s.empty() && s != "." && s != ".." && std::all_of(s.begin(), s.end(), is_name_char);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

// The snapshot refs/main names; with no refs/main, the only snapshot. nullopt when the repository
// folder holds no snapshot.
std::optional<fs::path> snapshot_of(const fs::path& repo_dir) {
  const fs::path snapshots = repo_dir / "snapshots";
  if (std::ifstream ref(repo_dir / "refs" / "main"); ref) {
    std::string commit;
    ref >> commit;
    LY_CHECK(is_name(commit) && fs::is_directory(snapshots / commit), ErrorCode::kNotFound,
             "{}: refs/main names snapshot '{}', which is not in {} (an interrupted download? run it again)",
             repo_dir.string(), commit, snapshots.string());
    return snapshots / commit;
  }
  std::vector<std::string> found;
  if (fs::is_directory(snapshots))
    for (const fs::directory_entry& e : fs::directory_iterator(snapshots))
      if (e.is_directory()) found.push_back(e.path().filename().string());
  if (found.empty()) return std::nullopt;
  std::sort(found.begin(), found.end());
  LY_CHECK(found.size() == 1, ErrorCode::kInvalidArgument,
           "{}: no refs/main and {} snapshots ({}): give the snapshot folder itself with -m", repo_dir.string(),
           found.size(), join(found, ", "));
  return snapshots / found[0];
}

// The .gguf files of a snapshot (relative paths, sorted), projector files (mmproj) left out.
std::vector<std::string> gguf_files(const fs::path& snapshot) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(snapshot)) {
    const std::string name = lower(e.path().filename().string());
    if (name.ends_with(".gguf") && name.find("mmproj") == std::string::npos && fs::is_regular_file(e.path()))
      out.push_back(e.path().lexically_relative(snapshot).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

const std::regex kShard("-(\\d{5})-of-(\\d{5})$");

// Whether a GGUF file carries the quantisation: its name without .gguf (and without a split
// suffix -00001-of-00003) ends in -QUANT or .QUANT, or its folder is named QUANT;
// case-insensitively, as llama.cpp's -hf matches its tag. Not '_': quant names hold it (K_M is
// not Q4_K_M).
bool carries_quant(const std::string& rel, const std::string& quant) {
  const fs::path p(rel);
  std::string stem = lower(p.stem().string());
  stem = std::regex_replace(stem, kShard, "");
  const std::string q = lower(quant);
  if (lower(p.parent_path().filename().string()) == q) return true;
  if (stem.size() <= q.size() || !stem.ends_with(q)) return false;
  const char sep = stem[stem.size() - q.size() - 1];
  return sep == '-' || sep == '.';
}

std::string pick_gguf(const fs::path& snapshot, const HfModelId& id, const std::vector<std::string>& files) {
  std::vector<std::string> hits;
  for (const std::string& f : files)
    if (carries_quant(f, id.quant)) hits.push_back(f);
  LY_CHECK(!hits.empty(), ErrorCode::kInvalidArgument,
           "{}:{}: no GGUF file of {} is of quantisation '{}'; its GGUF files: {}", id.repo, id.quant,
           snapshot.string(), id.quant, files.empty() ? "none" : join(files, ", "));
  std::smatch m;
  const std::string stem = fs::path(hits[0]).stem().string();
  if (std::regex_search(stem, m, kShard) && m[2].str() != "00001")
    fail(ErrorCode::kUnsupported,
         "{}:{}: the GGUF is split in {} files ({}); lychee reads one-file GGUFs: merge them with "
         "llama-gguf-split --merge", id.repo, id.quant, std::stoi(m[2].str()), join(hits, ", "));
  LY_CHECK(hits.size() == 1, ErrorCode::kInvalidArgument,
           "{}:{}: '{}' matches several GGUF files of {}: {}; name the file with -m", id.repo, id.quant, id.quant,
           snapshot.string(), join(hits, ", "));
  return (snapshot / hits[0]).string();
}

// The model in a snapshot: a GGUF file (by quant, or the only one) or the snapshot folder.
std::string model_in_snapshot(const fs::path& snapshot, const HfModelId& id) {
  const std::vector<std::string> files = gguf_files(snapshot);
  if (!id.quant.empty()) return pick_gguf(snapshot, id, files);
  const bool safetensors =
      fs::exists(snapshot / "model.safetensors") || fs::exists(snapshot / "model.safetensors.index.json");
  if (fs::exists(snapshot / "config.json") && (safetensors || files.empty())) return snapshot.string();
  if (files.size() == 1) return (snapshot / files[0]).string();
  LY_CHECK(!files.empty(), ErrorCode::kNotFound,
           "{}: the cached snapshot {} has neither config.json nor a .gguf file (an interrupted or filtered "
           "download? run huggingface-cli download {})", id.repo, snapshot.string(), id.repo);
  fail(ErrorCode::kInvalidArgument, "{}: the repository has {} GGUF files ({}); choose one with {}:QUANT (e.g. {}:Q4_K_M)",
       id.repo, files.size(), join(files, ", "), id.repo, id.repo);
}

}  // namespace

std::optional<HfModelId> parse_hf_model_id(std::string_view text) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(slash + 1);
  std::string_view quant;
  if (const size_t colon = rest.find(':'); colon != std::string_view::npos) {
    quant = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (!is_name(quant)) return std::nullopt;
  }
  const std::string_view org = text.substr(0, slash);
  if (!is_name(org) || org.front() == '.' || !is_name(rest)) return std::nullopt;
  return HfModelId{std::string(org) + "/" + std::string(rest), std::string(quant)};
}

std::vector<std::string> hf_cache_dirs() {
  std::vector<std::string> dirs;
  const auto add = [&](const std::string& d) {
    if (!d.empty() && std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  };
  add(env("HF_HUB_CACHE"));
  add(env("HUGGINGFACE_HUB_CACHE"));  // huggingface_hub's older name
  if (!env("HF_HOME").empty()) add((fs::path(env("HF_HOME")) / "hub").string());
  if (!env("XDG_CACHE_HOME").empty()) add((fs::path(env("XDG_CACHE_HOME")) / "huggingface" / "hub").string());
  if (!env("HOME").empty()) add((fs::path(env("HOME")) / ".cache" / "huggingface" / "hub").string());
  return dirs;
}

std::string resolve_hf_model(const HfModelId& id, const std::vector<std::string>& cache_dirs) {
  const size_t slash = id.repo.find('/');
  const std::string folder = "models--" + id.repo.substr(0, slash) + "--" + id.repo.substr(slash + 1);
  std::vector<std::string> looked;
  for (const std::string& dir : cache_dirs) {
    const fs::path repo_dir = fs::path(dir) / folder;
    looked.push_back(repo_dir.string());
    if (!fs::is_directory(repo_dir)) continue;
    if (const std::optional<fs::path> snapshot = snapshot_of(repo_dir)) return model_in_snapshot(*snapshot, id);
  }
  const std::string include = id.quant.empty() ? "" : fmt::format(" --include \"*{}*.gguf\"", id.quant);
  fail(ErrorCode::kNotFound,
       "model '{}{}{}': no such file or directory, and not in the Hugging Face cache (looked in {}); "
       "fetch it with: huggingface-cli download {}{} (HF_HUB_CACHE or HF_HOME choose the cache)",
       id.repo, id.quant.empty() ? "" : ":", id.quant, looked.empty() ? "no cache folder: HOME is unset" : join(looked, ", "),
       id.repo, include);
}

std::string resolve_model_path(const std::string& text) {
  if (text.empty() || fs::exists(text)) return text;
  const std::optional<HfModelId> id = parse_hf_model_id(text);
  return id ? resolve_hf_model(*id, hf_cache_dirs()) : text;
}

}  // namespace lychee
