// Head roles for LycheeDecode and DuoAttention: one role per (layer, KV head), retrieval (reads
// every token, and for Lychee selects the critical set) or sparse/streaming. Stored as a
// documented JSON file (docs/head-roles.md) with the model's identity and shape, the role
// matrix, optional gate parameters and how the file was made.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace lychee {

struct HeadRoles {
  int n_layers = 0;
  int n_kv_heads = 0;
  std::vector<uint8_t> retrieval;  // [n_layers][n_kv_heads], 1 = retrieval head

  // Optional gate parameters ([n_layers][n_kv_heads] each, or empty): HardKuma alpha/beta, the
  // expected gate value E[z] the roles were thresholded from, or DuoAttention's alpha.
  std::vector<float> alpha, beta, expected_z, gate;

  nlohmann::json model;       // identity: name, architecture, n_layers, n_heads, n_kv_heads, head_dim
  nlohmann::json provenance;  // how it was made: method, tool, data, steps, date, ...

  bool is_retrieval(int layer, int kv_head) const {
    return retrieval[size_t(layer) * size_t(n_kv_heads) + size_t(kv_head)] != 0;
  }
  int n_retrieval() const;
  // Throws Error(kInvalidFile) naming `source` if the matrix does not fit the model (shape) or
  // layer 0 is not all retrieval (LycheeDecode requires it).
  void validate(const ModelConfig& c, const std::string& source) const;
};

// An empty role matrix of the model's shape with the model's identity filled in.
HeadRoles make_head_roles(const ModelConfig& c);
// The stand-in used when no file is given: every KV head of the listed layers is a retrieval
// head, the rest sparse (layer 0 is always added).
HeadRoles head_roles_from_layers(const ModelConfig& c, const std::vector<int>& layers);
// TidalDecode-matched stand-in: layers 0, 1, 2 and round(13/32 * n_layers) (the paper gives
// LycheeDecode as many retrieval heads as TidalDecode has full-attention heads).
HeadRoles default_head_roles(const ModelConfig& c);
// A seeded random matrix (bench_e2e's): every head of layer 0 plus n_retrieval - n_kv_heads
// heads drawn from layers 1.. (their flat indices shuffled by std::shuffle with
// std::mt19937(seed), the first ones taken), n_retrieval retrieval heads in all.
HeadRoles seeded_head_roles(const ModelConfig& c, int n_retrieval, uint32_t seed);

// lychee's JSON head-role file (see docs/head-roles.md). load validates against the model.
HeadRoles load_head_roles(const std::string& path, const ModelConfig& c);
void save_head_roles(const HeadRoles& roles, const std::string& path);
// The same file checked only for internal consistency (format, field types, equal row lengths,
// model.n_layers/n_kv_heads agreeing with the roles), for tools that have no model at hand.
// Layer 0 is not checked: validate() against a model does that.
HeadRoles load_head_roles_unchecked(const std::string& path);

// DuoAttention's full_attention_heads.tsv: n_layers lines of n_kv_heads gate values in [0, 1].
// Heads are ranked by gate value and the top (1 - sparsity) fraction become retrieval heads
// (DuoAttention's deploy rule); layer 0 is then forced to all retrieval. Gate values are kept.
HeadRoles import_duo_tsv(const std::string& path, const ModelConfig& c, double sparsity);
void export_duo_tsv(const HeadRoles& roles, const std::string& path);
// A plain role matrix: n_layers lines of n_kv_heads 0/1 values (whitespace or comma separated).
HeadRoles import_role_matrix(const std::string& path, const ModelConfig& c);
void export_role_matrix(const HeadRoles& roles, const std::string& path);

// A text map of the roles for terminals: one row per layer, 'R' retrieval and '.' sparse.
std::string format_head_role_map(const HeadRoles& roles);

}  // namespace lychee
