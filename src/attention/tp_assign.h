// Tensor parallelism by KV heads: which GPU owns each (layer, KV head), its query heads with it,
// chosen so that the retrieval (dense) heads of every layer are spread evenly over the GPUs.
// Pure host code; the runner shards weights and the KV pool by this map.
//
// Why balance: a decode step's attention time per layer is set by its slowest GPU, and a
// retrieval head reads every cached token where a sparse head reads the selected budget, so the
// straggler is the GPU holding the most retrieval heads of the layer. The cost of an assignment
// is therefore sum over layers of max over GPUs of the layer's retrieval heads on that GPU (the
// dense heads the slowest GPU reads per step); no assignment beats sum_l ceil(r_l / N).
//
// Why a KV-head index should stay on one GPU: a LycheeDecode sparse head of KV index h reads the
// set written by the last retrieval head of index h in an earlier layer. If index h is owned by
// the same GPU in every layer, sets never leave the GPU that wrote them; otherwise a set must be
// sent. Three rules (docs/scaling.md compares them on the trained roles and the 8B shape):
//   kContiguous   GPU g owns KV heads [g*k, (g+1)*k) in every layer (k = n_kv_heads / N;
//                 Megatron's split, roles ignored): the baseline.
//   kPermutation  one partition of the KV-head indices into N groups of k, the same in every
//                 layer, minimising the cost: selection stays on its GPU. The default.
//   kPerLayer     each layer split on its own: the cost is sum_l ceil(r_l / N) exactly, but heads
//                 moved off their index's GPU need selection sets sent (counted by tp_balance).
#pragma once

#include <cstdint>
#include <vector>

#include "attention/decode_spec.h"
#include "attention/head_roles.h"
#include "model/config.h"

namespace lychee {

enum class TpRule : uint8_t { kContiguous, kPermutation, kPerLayer };

const char* tp_rule_name(TpRule r);  // "contiguous", "permutation", "per-layer"

struct TpAssignment {
  TpRule rule = TpRule::kContiguous;
  int n_gpus = 1, n_layers = 0, n_kv_heads = 0;
  std::vector<int> gpu;  // [n_layers][n_kv_heads]: the GPU owning KV head h of layer l
  // The rule's objective is proven minimal (kPermutation: the exhaustive search finished within
  // its node limit; the others: always, by construction).
  bool optimal = true;

  int heads_per_gpu() const { return n_kv_heads / n_gpus; }
  int gpu_of(int layer, int kv_head) const { return gpu[size_t(layer) * size_t(n_kv_heads) + size_t(kv_head)]; }
  // [heads_per_gpu] the KV heads GPU g owns in `layer`, ascending: local head i is global head
  // local_heads(layer, g)[i] (its query heads are [h * group, (h + 1) * group)).
  std::vector<int> local_heads(int layer, int g) const;
  // Whether every KV-head index is owned by the same GPU in every layer.
  bool same_in_every_layer() const;
};

// The balance of an assignment against a role matrix.
struct TpBalance {
  std::vector<int> retrieval;   // [n_layers] r_l: retrieval heads of layer l
  std::vector<int> max_on_gpu;  // [n_layers] max over GPUs of layer l's retrieval heads on one GPU
  int sum_max = 0;              // sum_l max_on_gpu[l]: dense heads the straggler reads per step
  int sum_bound = 0;            // sum_l ceil(r_l / N): what the best per-layer split reaches
  double sum_mean = 0;          // sum_l r_l / N: a perfectly divisible split
  int layers_above_bound = 0;   // layers with max_on_gpu[l] > ceil(r_l / N)
  // LycheeDecode selection sets one decode step sends between GPUs, per sequence: pairs (writer,
  // GPU) where a retrieval head's set is read by a later sparse head of its KV index on another
  // GPU before the index's next retrieval head (0 when same_in_every_layer()). The last layer's
  // retrieval heads select nothing (lychee_spec), so they send nothing.
  int selection_transfers = 0;
};

// Error(kInvalidArgument) unless n_gpus >= 1 divides c.n_kv_heads and the MLP width (naming both
// numbers).
void check_tensor_parallel(const ModelConfig& c, int n_gpus);

TpAssignment tp_assign_contiguous(const ModelConfig& c, int n_gpus);
// Branch and bound over the partitions of the KV-head indices (groups unlabelled; GPU labels in
// order of each group's lowest index), started from the better of kContiguous and a pairwise-swap
// local search, so a tie keeps the contiguous split. Exhaustive for the shapes models have (8 KV
// heads: at most 105 partitions); past `max_nodes` search nodes it returns the best found with
// optimal = false.
TpAssignment tp_assign_permutation(const ModelConfig& c, const HeadRoles& roles, int n_gpus,
                                   uint64_t max_nodes = 20'000'000);
// Starts from tp_assign_permutation and, per layer, swaps a retrieval head of each GPU above
// ceil(r_l / N) with a sparse head of a GPU below it (the fewest moves from the permutation).
TpAssignment tp_assign_per_layer(const ModelConfig& c, const HeadRoles& roles, int n_gpus);
TpAssignment tp_assign(const ModelConfig& c, const HeadRoles& roles, int n_gpus,
                       TpRule rule = TpRule::kPermutation);

// Error(kInvalidArgument) when roles and the assignment do not have the same shape.
TpBalance tp_balance(const TpAssignment& a, const HeadRoles& roles);

// ---------------------------------------------------------------- what a rank holds (the runner)

// The KV heads of each GPU under an assignment that is the same in every layer ([n_gpus], each
// ascending): the runner shards by these. Error(kUnsupported) for an assignment that differs per
// layer (kPerLayer: it would send selection sets between GPUs, which the runner does not do).
std::vector<std::vector<int>> tp_rank_heads(const TpAssignment& a);

// A run of rows or columns a rank copies from the full matrix: [src, src + n) -> [dst, dst + n).
struct TpBlock {
  int src = 0, dst = 0, n = 0;
  bool operator==(const TpBlock&) const = default;
};

// One rank's part of every layer (Megatron's split, attention by KV heads): its shape (heads,
// KV heads, MLP width of this rank; the rest as the model) and which rows / columns of each
// full matrix it holds. The Q/K/V rows of its KV heads (their query heads with them) in the
// order given; the output product's columns of those query heads; the gate and up rows and the
// down columns of MLP slice `rank`. Norms and the output / down biases are whole on every rank
// (the biases are added once, after the all-reduce). Pure.
struct TpShardShape {
  ModelConfig config;
  std::vector<TpBlock> qkv_rows;      // rows of Wq|Wk|Wv (and its bias)
  std::vector<TpBlock> o_cols;        // columns of Wo
  std::vector<TpBlock> gate_up_rows;  // rows of Wgate|Wup (and its bias)
  std::vector<TpBlock> down_cols;     // columns of Wdown
};
TpShardShape tp_shard_shape(const ModelConfig& c, const std::vector<int>& kv_heads, int rank, int n_gpus);

// The split LM head's vocabulary rows of rank `rank` of n_gpus: [first, first + count) with
// first = rank V' and V' = ceil(V / n_gpus) (the last ranks may hold fewer, or none). Pure.
struct TpVocabRows {
  int part = 0;   // V': rows per rank, the stride of the gathered logits
  int first = 0;  // rank * V'
  int count = 0;  // rows this rank computes
};
TpVocabRows tp_vocab_rows(int vocab, int n_gpus, int rank);

// The part of a decode spec a rank runs: every pattern restricted to its KV heads (local head i
// is global head kv_heads[i]; LycheeDecode's sets stay per KV-head index, so a rank that owns
// index h in every layer holds every set its sparse heads of index h read). Pure.
DecodeSpec tp_shard_spec(const DecodeSpec& spec, const std::vector<int>& kv_heads);

}  // namespace lychee
