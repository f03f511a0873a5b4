// The paper's denoising case study (its Figure "attention visualisation") on any model: the
// attention of the answer token over the context, averaged over LycheeDecode's retrieval heads
// (full attention) and over its sparse heads (attention over the set they reuse, renormalised, as
// they compute it), and how much of each falls on a distractor passage. The paper's claim: the
// retrieval heads spread weight over irrelevant text where the sparse heads do not.
#pragma once

#include <string>
#include <vector>

#include "attention/policy.h"
#include "runtime/engine.h"

namespace lychee {

struct RoleAttention {
  std::string answer;                  // the greedy answer token's text (fed as the decode step)
  int32_t answer_token = -1;
  int context = 0;                     // prompt tokens
  std::vector<std::string> pieces;     // [context] each prompt token's text
  std::vector<double> retrieval;       // [context] mean attention over the retrieval heads
  std::vector<double> sparse;          // [context] mean attention over the sparse heads (renormalised)
  int n_retrieval = 0, n_sparse = 0;   // (layer, query head) pairs averaged
  std::vector<int32_t> distractor;     // token positions of the distractor passage
  double retrieval_distractor = 0;     // retrieval's mass on those positions
  double sparse_distractor = 0;        // the sparse heads' mass on them
  double full_distractor_sparse_heads = 0;  // what full attention would give the sparse heads there
};

// prompt: the user turn of the chat template (chat) or raw text; distractor: a passage that must
// occur in the prompt (kInvalidArgument otherwise). policy: a LycheeDecode policy (a head reads
// densely = retrieval, a read list = sparse). CPU engine only (kUnsupported otherwise).
RoleAttention attention_by_role(Engine& engine, const std::string& prompt, const std::string& distractor,
                                AttentionPolicy& policy, bool chat = true);

// The built-in case: a short ordering puzzle with one irrelevant sentence in the middle.
const std::string& denoise_prompt();
const std::string& denoise_distractor();

}  // namespace lychee
