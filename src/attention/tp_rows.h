// Tensor parallelism per row of a batch: the mirrored-row rule and the attention work it gives
// each GPU per layer. Pure host code over an assignment of tp_assign.h.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/head_roles.h"
#include "attention/tp_assign.h"

namespace lychee {

// Why per row: placement by whole KV heads cannot balance a layer whose retrieval-head count r_l
// is not a multiple of N (one GPU reads the context for the odd head, the others budgets: 1.7x the
// mean at batch 8 on two GPUs, docs/scaling.md). But a sequence's KV and selection sets need only
// stay on one GPU *for that sequence*: if row b sees the groups of the base assignment rotated by
// shift[b] (group j on GPU (j + shift[b]) mod N, the same in every layer), each of its KV-head
// indices still lives on one GPU in every layer (no selection traffic), while across rows every GPU
// takes every group in turn. With the shifts spread evenly (B / N rows each) every layer's dense
// work splits exactly: r_l B / N dense heads per GPU. The price: a GPU holds the attention weights
// (Q/K/V rows, output columns) of every group some row gives it (all of them once B >= N), and the
// runner needs a per-row head map (docs/scaling.md, "Mirrored rows").
//   kSame       every row shift 0: the base assignment (what the runner does).
//   kMirrored   rows in cycles of N take shifts 0..N-1 (at N = 2: even rows as the base, odd rows
//               mirrored); the last B mod N rows each take the shift that least raises the summed
//               per-layer maximum of dense heads (ties: the smallest shift).
enum class TpRowRule : uint8_t { kSame, kMirrored };

const char* tp_row_rule_name(TpRowRule r);  // "same", "mirrored"

struct TpRowAssignment {
  TpAssignment base;
  TpRowRule rule = TpRowRule::kSame;
  std::vector<int> shift;  // [batch] row b's rotation of the base's GPU labels

  int batch() const { return int(shift.size()); }
  int gpu_of(int row, int layer, int kv_head) const {
    return (base.gpu_of(layer, kv_head) + shift[size_t(row)]) % base.n_gpus;
  }
  // [n_groups] the base groups (GPU labels of the base) whose attention weights GPU g needs: those
  // some row places on it. Ascending.
  std::vector<int> groups_held(int g) const;
};

// Error(kInvalidArgument) for batch < 1 or roles not of the base's shape.
TpRowAssignment tp_assign_rows(const TpAssignment& base, const HeadRoles& roles, int batch, TpRowRule rule);

// The attention work of one decode step per (layer, GPU) under a row assignment, in KV tokens read:
// a retrieval head reads `context` tokens, a sparse head min(budget, context) (LycheeDecode's
// model; bench_e2e's policy_reads), summed over the rows. The layer's time is its slowest GPU's.
struct TpWorkBalance {
  std::vector<double> max_over_mean;  // [n_layers] slowest GPU's work / mean work of the layer
  double worst = 1.0;                 // max over layers of max_over_mean
  int worst_layer = 0;
  double sum_max = 0, sum_mean = 0;   // tokens: sum over layers of the slowest GPU's / the mean work
  std::vector<std::vector<int>> dense;  // [n_layers][n_gpus] retrieval heads read, summed over rows
  std::vector<int> groups_held;         // [n_gpus] base groups whose attention weights each GPU holds
};
TpWorkBalance tp_work_balance(const TpRowAssignment& a, const HeadRoles& roles, int64_t context, int64_t budget);

}  // namespace lychee
