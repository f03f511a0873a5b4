// Models named as on the Hugging Face Hub ("org/name", or "org/name:Q4_K_M" for one GGUF file of
// the repository, like llama.cpp's -hf), found in the local Hugging Face cache that
// huggingface_hub (huggingface-cli download, snapshot_download, transformers) fills. Nothing is
// downloaded: a model not in the cache is an error that says where it looked and what to run.
//
// The cache: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub (huggingface_hub's order). A repository is
// <cache>/models--org--name/{refs/main, snapshots/<commit>/...}; refs/main names the snapshot.
// See docs/chat-templates.md.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lychee {

struct HfModelId {
  std::string repo;   // "org/name"
  std::string quant;  // "Q4_K_M" (as typed; matched case-insensitively), "" for none
};

// "org/name" or "org/name:QUANT" (names of letters, digits, '-', '_', '.'); nullopt otherwise
// (an absolute or ./ path, no slash, two slashes, ...).
std::optional<HfModelId> parse_hf_model_id(std::string_view text);

// The cache folders to search, in order (see above), from the environment.
std::vector<std::string> hf_cache_dirs();

// The local path of a cached model: the snapshot folder (config.json + safetensors, sharded or
// not) or, with a quant or a repository of GGUF files only, the .gguf file. Throws
// Error(kNotFound) naming every place looked at and the huggingface-cli command that fetches it,
// Error(kInvalidArgument) when the quant matches no file or several, or several GGUF files leave
// the choice open (the error lists them).
std::string resolve_hf_model(const HfModelId& id, const std::vector<std::string>& cache_dirs);

// -m's meaning: a path that exists is itself; else an HF id resolved in the cache (above); else
// the text unchanged (opening it reports the missing file).
std::string resolve_model_path(const std::string& text);

}  // namespace lychee
