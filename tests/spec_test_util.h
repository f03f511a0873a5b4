// Shared helpers of the policy-description tests (test_decode_spec.cpp, test_runner_plan.cpp).
#pragma once

#include <initializer_list>

#include "attention/head_roles.h"
#include "model/config.h"

namespace lychee::test {

// A model shape for tests that need no weights: the attention policy compilers and the GPU
// runner's host plans. hidden = n_heads * head_dim.
inline ModelConfig model_shape(int n_layers, int n_heads, int n_kv_heads, int head_dim) {
  ModelConfig c;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.d_model = n_heads * head_dim;
  c.d_ff = 64;
  c.vocab_size = 100;
  c.max_context = 4096;
  return c;
}

// A role matrix of the model's shape from rows of 0/1 per layer (1 = retrieval head).
inline HeadRoles roles_of(const ModelConfig& c, std::initializer_list<std::initializer_list<int>> rows) {
  HeadRoles r = make_head_roles(c);
  size_t i = 0;
  for (auto row : rows)
    for (int x : row) r.retrieval[i++] = uint8_t(x);
  return r;
}

}  // namespace lychee::test
