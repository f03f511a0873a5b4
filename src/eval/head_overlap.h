// The paper's Figure 1 (and its appendix cases) on any model: for a prompt, the model's greedy
// answer token is fed as one decode step; for every query head of every layer, the top-k context
// tokens by attention score of that token; then, for each head index, the share of its top-k set
// that the same-index head of the next layer also has in its top-k (1 = the same critical
// tokens). High overlap is what lets a sparse head reuse an earlier layer's selection; its spread
// over heads is why LycheeDecode chooses per head rather than per layer.
#pragma once

#include <string>
#include <vector>

#include "runtime/engine.h"

namespace lychee {

struct HeadOverlap {
  std::string prompt;
  std::string answer;                       // the greedy answer token's text
  int32_t answer_token = -1;
  int k = 5;
  int n_layers = 0, n_heads = 0;
  int context = 0;                          // tokens before the answer token
  std::vector<std::vector<std::vector<int32_t>>> topk;  // [layer][head]: positions, best first
  std::vector<float> overlap;               // [(n_layers - 1) * n_heads]: layer l vs l + 1
  float at(int layer, int head) const { return overlap[size_t(layer) * size_t(n_heads) + size_t(head)]; }
};

// Runs on the engine's backend; the capture needs the CPU reference (it reads q and K through the
// attention-policy hook), so a CUDA engine is refused with kUnsupported. k >= 1, and the prompt
// must have at least k tokens (kInvalidArgument otherwise). chat: the prompt is the user turn of
// the model's chat template (an instruct model's answer then starts right after it); otherwise
// raw text.
HeadOverlap head_topk_overlap(Engine& engine, const std::string& prompt, int k, bool chat = true);

// Quest's page choice against the exact one, at a prompt's answer token: in every layer from
// dense_layers on and for every query head, the top budget/page pages by Quest's upper bound and
// by the exact per-page max of q·k (the last page kept in both, as Quest does); recall = the
// share of the exact pages Quest also chose, mass = the softmax attention mass on Quest's pages
// over the mass on the exact ones. CPU engine only (kUnsupported otherwise).
struct QuestCheck {
  int32_t answer_token = -1;
  int context = 0;
  std::vector<double> recall, mass;  // [layer] means over query heads (0 for dense layers)
};
QuestCheck quest_against_exact(Engine& engine, std::span<const int32_t> prompt_ids, int page, int budget,
                               int dense_layers);

// The five prompts of the paper's Figure 1 and appendix Figures 7-10, verbatim.
const std::vector<std::string>& paper_overlap_prompts();

}  // namespace lychee
