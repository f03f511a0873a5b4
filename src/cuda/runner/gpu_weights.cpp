#include "cuda/runner/gpu_weights.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/kernels/kernels.h"

namespace lychee::cuda {

namespace {

// Offsets of every tensor in the arena, 256-byte aligned.
struct ArenaPlan {
  size_t size = 0;
  size_t add(size_t bytes) {
    const size_t off = size;
    size += (bytes + 255) / 256 * 256;
    return off;
  }
};

struct LayerOffsets {
  size_t attn_norm, wqkv, bqkv = SIZE_MAX, q_norm = SIZE_MAX, k_norm = SIZE_MAX, wo, bo = SIZE_MAX,
         ffn_norm, w_gate_up, b_gate_up = SIZE_MAX, w_down, b_down = SIZE_MAX;
};

struct Layout {
  size_t embed, output, out_norm, inv_freq;
  std::vector<LayerOffsets> layers;
  size_t total;
};

Layout plan_layout(const ModelConfig& c) {
  ArenaPlan a;
  Layout l;
  const size_t d = size_t(c.d_model), ff = size_t(c.d_ff), qkv = size_t(c.q_dim() + 2 * c.kv_dim());
  l.embed = a.add(size_t(c.vocab_size) * d * 2);
  l.output = c.tie_embeddings ? l.embed : a.add(size_t(c.vocab_size) * d * 2);
  l.out_norm = a.add(d * 4);
  l.inv_freq = a.add(size_t(c.head_dim / 2) * 4);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerOffsets o;
    o.attn_norm = a.add(d * 4);
    o.wqkv = a.add(qkv * d * 2);
    if (c.qkv_bias) o.bqkv = a.add(qkv * 4);
    if (c.qk_norm) {
      o.q_norm = a.add(size_t(c.head_dim) * 4);
      o.k_norm = a.add(size_t(c.head_dim) * 4);
    }
    o.wo = a.add(d * size_t(c.q_dim()) * 2);
    if (c.o_bias) o.bo = a.add(d * 4);
    o.ffn_norm = a.add(d * 4);
    o.w_gate_up = a.add(2 * ff * d * 2);
    if (c.mlp_bias) o.b_gate_up = a.add(2 * ff * 4);
    o.w_down = a.add(d * ff * 2);
    if (c.mlp_bias) o.b_down = a.add(d * 4);
    l.layers.push_back(o);
  }
  l.total = a.size;
  return l;
}

template <typename T>
const T* at(const DeviceBuffer<uint8_t>& arena, size_t off) {
  return off == SIZE_MAX ? nullptr : reinterpret_cast<const T*>(arena.data() + off);
}

void bind(const Layout& l, const DeviceBuffer<uint8_t>& arena, std::vector<GpuLayerWeights>& layers,
          const bf16*& embed, const bf16*& output, const float*& out_norm, const float*& inv_freq) {
  embed = at<bf16>(arena, l.embed);
  output = at<bf16>(arena, l.output);
  out_norm = at<float>(arena, l.out_norm);
  inv_freq = at<float>(arena, l.inv_freq);
  for (const LayerOffsets& o : l.layers)
    layers.push_back({at<float>(arena, o.attn_norm), at<bf16>(arena, o.wqkv), at<float>(arena, o.bqkv),
                      at<float>(arena, o.q_norm), at<float>(arena, o.k_norm), at<bf16>(arena, o.wo),
                      at<float>(arena, o.bo), at<float>(arena, o.ffn_norm), at<bf16>(arena, o.w_gate_up),
                      at<float>(arena, o.b_gate_up), at<bf16>(arena, o.w_down), at<float>(arena, o.b_down)});
}

// Host-side conversion and upload of one checkpoint weight to arena + off (+ row offset).
class Uploader {
 public:
  Uploader(const Checkpoint& ck, DeviceBuffer<uint8_t>& arena) : ck_(ck), arena_(arena) {}
  void bf16_rows(WeightId id, int layer, size_t off, size_t first_elem) {
    const int64_t n = read(id, layer);
    bf16_.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) bf16_[size_t(i)] = lychee::f32_to_bf16(f32_[size_t(i)]);
    LY_CUDA_CHECK(cudaMemcpy(arena_.data() + off + first_elem * 2, bf16_.data(), size_t(n) * 2,
                             cudaMemcpyHostToDevice));
  }
  void f32(WeightId id, int layer, size_t off, size_t first_elem = 0) {
    const int64_t n = read(id, layer);
    LY_CUDA_CHECK(cudaMemcpy(arena_.data() + off + first_elem * 4, f32_.data(), size_t(n) * 4,
                             cudaMemcpyHostToDevice));
  }

 private:
  int64_t read(WeightId id, int layer) {
    const int64_t n = weight_numel(weight_spec(id), ck_.config());
    f32_.resize(size_t(n));
    ck_.read_f32(id, layer, f32_.data());
    return n;
  }
  const Checkpoint& ck_;
  DeviceBuffer<uint8_t>& arena_;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
};

}  // namespace

GpuWeights GpuWeights::from_checkpoint(const Checkpoint& ck) {
  GpuWeights w;
  w.config_ = ck.config();
  const ModelConfig& c = w.config_;
  const Layout l = plan_layout(c);
  w.arena_ = DeviceBuffer<uint8_t>(l.total);
  Uploader up(ck, w.arena_);
  up.bf16_rows(WeightId::kTokEmbd, 0, l.embed, 0);
  if (!c.tie_embeddings) up.bf16_rows(WeightId::kOutput, 0, l.output, 0);
  up.f32(WeightId::kOutputNorm, 0, l.out_norm);
  std::vector<float> inv = rope_inv_freq(c);
  if (ck.weight(WeightId::kRopeFreqs) != nullptr) {
    std::vector<float> ff(inv.size());
    ck.read_f32(WeightId::kRopeFreqs, 0, ff.data());
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= ff[i];
  }
  LY_CUDA_CHECK(cudaMemcpy(w.arena_.data() + l.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  const size_t d = size_t(c.d_model), qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim()), ff = size_t(c.d_ff);
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerOffsets& o = l.layers[size_t(i)];
    up.f32(WeightId::kAttnNorm, i, o.attn_norm);
    up.bf16_rows(WeightId::kWq, i, o.wqkv, 0);
    up.bf16_rows(WeightId::kWk, i, o.wqkv, qd * d);
    up.bf16_rows(WeightId::kWv, i, o.wqkv, (qd + kvd) * d);
    if (c.qkv_bias) {
      up.f32(WeightId::kBq, i, o.bqkv, 0);
      up.f32(WeightId::kBk, i, o.bqkv, qd);
      up.f32(WeightId::kBv, i, o.bqkv, qd + kvd);
    }
    if (c.qk_norm) {
      up.f32(WeightId::kQNorm, i, o.q_norm);
      up.f32(WeightId::kKNorm, i, o.k_norm);
    }
    up.bf16_rows(WeightId::kWo, i, o.wo, 0);
    if (c.o_bias) up.f32(WeightId::kBo, i, o.bo);
    up.f32(WeightId::kFfnNorm, i, o.ffn_norm);
    up.bf16_rows(WeightId::kWGate, i, o.w_gate_up, 0);
    up.bf16_rows(WeightId::kWUp, i, o.w_gate_up, ff * d);
    if (c.mlp_bias) {
      up.f32(WeightId::kBGate, i, o.b_gate_up, 0);
      up.f32(WeightId::kBUp, i, o.b_gate_up, ff);
      up.f32(WeightId::kBDown, i, o.b_down);
    }
    up.bf16_rows(WeightId::kWDown, i, o.w_down, 0);
  }
  bind(l, w.arena_, w.layers, w.embed, w.output, w.out_norm, w.inv_freq);
  return w;
}

GpuWeights GpuWeights::random(const ModelConfig& c, uint64_t seed) {
  GpuWeights w;
  w.config_ = c;
  const Layout l = plan_layout(c);
  w.arena_ = DeviceBuffer<uint8_t>(l.total);
  auto fill = [&](size_t off, size_t n) {
    fill_normal_bf16(reinterpret_cast<bf16*>(w.arena_.data() + off), n, seed++, 0.02f, nullptr);
  };
  auto ones = [&](size_t off, size_t n) {
    fill_const_f32(reinterpret_cast<float*>(w.arena_.data() + off), n, 1.0f, nullptr);
  };
  const size_t d = size_t(c.d_model), ff = size_t(c.d_ff), qkv = size_t(c.q_dim() + 2 * c.kv_dim());
  fill(l.embed, size_t(c.vocab_size) * d);
  if (!c.tie_embeddings) fill(l.output, size_t(c.vocab_size) * d);
  ones(l.out_norm, d);
  for (const LayerOffsets& o : l.layers) {
    ones(o.attn_norm, d);
    ones(o.ffn_norm, d);
    fill(o.wqkv, qkv * d);
    fill(o.wo, d * size_t(c.q_dim()));
    fill(o.w_gate_up, 2 * ff * d);
    fill(o.w_down, d * ff);
    LY_CHECK(o.bqkv == SIZE_MAX && o.q_norm == SIZE_MAX && o.bo == SIZE_MAX && o.b_gate_up == SIZE_MAX,
             ErrorCode::kInvalidArgument, "random weights support Llama-shaped configs without biases or q/k norms");
  }
  const std::vector<float> inv = rope_inv_freq(c);
  LY_CUDA_CHECK(cudaMemcpy(w.arena_.data() + l.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  bind(l, w.arena_, w.layers, w.embed, w.output, w.out_norm, w.inv_freq);
  return w;
}

uint64_t GpuWeights::bytes_read_per_step(int batch) const {
  const ModelConfig& c = config_;
  const uint64_t d = uint64_t(c.d_model), ff = uint64_t(c.d_ff);
  const uint64_t per_layer = (uint64_t(c.q_dim() + 2 * c.kv_dim()) * d + d * uint64_t(c.q_dim()) + 3 * ff * d) * 2 + 2 * d * 4;
  return per_layer * uint64_t(c.n_layers) + uint64_t(c.vocab_size) * d * 2 + d * 4 + uint64_t(batch) * d * 2;
}

}  // namespace lychee::cuda
