#include "model/weight_table.h"

#include <fmt/format.h>

#include "core/error.h"

namespace lychee {

namespace {

using Shape = std::vector<int64_t>;
using C = const ModelConfig&;

// Shapes, outermost first, as Hugging Face stores them.
Shape vocab_by_model(C c) { return {c.vocab_size, c.d_model}; }
Shape model_vec(C c) { return {c.d_model}; }
Shape half_head(C c) { return {c.head_dim / 2}; }
Shape q_by_model(C c) { return {c.q_dim(), c.d_model}; }
Shape kv_by_model(C c) { return {c.kv_dim(), c.d_model}; }
Shape model_by_q(C c) { return {c.d_model, c.q_dim()}; }
Shape q_vec(C c) { return {c.q_dim()}; }
Shape kv_vec(C c) { return {c.kv_dim()}; }
Shape head_vec(C c) { return {c.head_dim}; }
Shape ff_by_model(C c) { return {c.d_ff, c.d_model}; }
Shape model_by_ff(C c) { return {c.d_model, c.d_ff}; }
Shape ff_vec(C c) { return {c.d_ff}; }

bool untied(C c) { return !c.tie_embeddings; }
bool qkv_bias(C c) { return c.qkv_bias; }
bool o_bias(C c) { return c.o_bias; }
bool qk_norm(C c) { return c.qk_norm; }
bool mlp_bias(C c) { return c.mlp_bias; }

const WeightSpec kTable[] = {
    {WeightId::kTokEmbd, false, "model.embed_tokens.weight", "token_embd.weight", vocab_by_model, nullptr, false},
    {WeightId::kOutputNorm, false, "model.norm.weight", "output_norm.weight", model_vec, nullptr, false},
    {WeightId::kOutput, false, "lm_head.weight", "output.weight", vocab_by_model, untied, false},
    {WeightId::kRopeFreqs, false, "", "rope_freqs.weight", half_head, nullptr, true},
    {WeightId::kAttnNorm, true, "model.layers.{}.input_layernorm.weight", "blk.{}.attn_norm.weight", model_vec, nullptr, false},
    {WeightId::kWq, true, "model.layers.{}.self_attn.q_proj.weight", "blk.{}.attn_q.weight", q_by_model, nullptr, false},
    {WeightId::kWk, true, "model.layers.{}.self_attn.k_proj.weight", "blk.{}.attn_k.weight", kv_by_model, nullptr, false},
    {WeightId::kWv, true, "model.layers.{}.self_attn.v_proj.weight", "blk.{}.attn_v.weight", kv_by_model, nullptr, false},
    {WeightId::kWo, true, "model.layers.{}.self_attn.o_proj.weight", "blk.{}.attn_output.weight", model_by_q, nullptr, false},
    {WeightId::kBq, true, "model.layers.{}.self_attn.q_proj.bias", "blk.{}.attn_q.bias", q_vec, qkv_bias, false},
    {WeightId::kBk, true, "model.layers.{}.self_attn.k_proj.bias", "blk.{}.attn_k.bias", kv_vec, qkv_bias, false},
    {WeightId::kBv, true, "model.layers.{}.self_attn.v_proj.bias", "blk.{}.attn_v.bias", kv_vec, qkv_bias, false},
    {WeightId::kBo, true, "model.layers.{}.self_attn.o_proj.bias", "blk.{}.attn_output.bias", model_vec, o_bias, false},
    {WeightId::kQNorm, true, "model.layers.{}.self_attn.q_norm.weight", "blk.{}.attn_q_norm.weight", head_vec, qk_norm, false},
    {WeightId::kKNorm, true, "model.layers.{}.self_attn.k_norm.weight", "blk.{}.attn_k_norm.weight", head_vec, qk_norm, false},
    {WeightId::kFfnNorm, true, "model.layers.{}.post_attention_layernorm.weight", "blk.{}.ffn_norm.weight", model_vec, nullptr, false},
    {WeightId::kWGate, true, "model.layers.{}.mlp.gate_proj.weight", "blk.{}.ffn_gate.weight", ff_by_model, nullptr, false},
    {WeightId::kWUp, true, "model.layers.{}.mlp.up_proj.weight", "blk.{}.ffn_up.weight", ff_by_model, nullptr, false},
    {WeightId::kWDown, true, "model.layers.{}.mlp.down_proj.weight", "blk.{}.ffn_down.weight", model_by_ff, nullptr, false},
    {WeightId::kBGate, true, "model.layers.{}.mlp.gate_proj.bias", "blk.{}.ffn_gate.bias", ff_vec, mlp_bias, false},
    {WeightId::kBUp, true, "model.layers.{}.mlp.up_proj.bias", "blk.{}.ffn_up.bias", ff_vec, mlp_bias, false},
    {WeightId::kBDown, true, "model.layers.{}.mlp.down_proj.bias", "blk.{}.ffn_down.bias", model_vec, mlp_bias, false},
};
static_assert(std::size(kTable) == size_t(kNumWeightIds));

}  // namespace

std::span<const WeightSpec> weight_table() { return kTable; }

const WeightSpec& weight_spec(WeightId id) {
  const WeightSpec& s = kTable[int(id)];
  LY_ASSERT(s.id == id);
  return s;
}

std::string weight_hf_name(const WeightSpec& spec, int layer) {
  return spec.per_layer ? fmt::format(fmt::runtime(spec.hf_name), layer) : std::string(spec.hf_name);
}

std::string weight_gguf_name(const WeightSpec& spec, int layer) {
  if (spec.gguf_name == nullptr) return {};
  return spec.per_layer ? fmt::format(fmt::runtime(spec.gguf_name), layer) : std::string(spec.gguf_name);
}

int64_t weight_numel(const WeightSpec& spec, const ModelConfig& c) {
  int64_t n = 1;
  for (int64_t d : spec.shape(c)) n *= d;
  return n;
}

}  // namespace lychee
