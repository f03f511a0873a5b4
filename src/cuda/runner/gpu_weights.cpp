#include "cuda/runner/gpu_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "attention/tp_assign.h"
#include "core/fp8.h"
#include "cuda/kernels/fp8_gemv.h"
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

// A linear weight's place: its values (bf16 or e4m3 codes) and, for FP8, its row scales.
struct MatrixOffsets {
  size_t values = SIZE_MAX, scales = SIZE_MAX;
  int rows = 0, cols = 0;
};

struct LayerOffsets {
  size_t attn_norm, bqkv = SIZE_MAX, q_norm = SIZE_MAX, k_norm = SIZE_MAX, bo = SIZE_MAX, ffn_norm,
         b_gate_up = SIZE_MAX, b_down = SIZE_MAX;
  MatrixOffsets wqkv, wo, w_gate_up, w_down;
};

struct Layout {
  size_t embed, output, out_norm, inv_freq;
  MatrixOffsets output8;  // LYCHEE_FP8_LM_HEAD: an FP8 copy of the output matrix (values unset otherwise)
  std::vector<LayerOffsets> layers;
  size_t total;
  size_t matrix_bytes = 0;  // the layers' linear weights (values and scales)
};

// Lab knob for FP8 weights: LYCHEE_FP8_KEEP_BF16 = "MATRIX@LAYERS,..." keeps those matrices in
// bf16 (MATRIX: qkv, o, gate_up, down or all; LAYERS: indices joined by '+', or '*' for every
// layer), e.g. "qkv@0+1+7" (which matrices carry FP8's quality cost; docs/results/fp8_gpu).
// Anything malformed is an error naming the variable.
bool keep_bf16(const char* matrix, int layer) {
  static const std::vector<std::pair<std::string, std::string>> rules = [] {
    std::vector<std::pair<std::string, std::string>> r;
    const char* v = std::getenv("LYCHEE_FP8_KEEP_BF16");
    if (v == nullptr) return r;
    std::string text(v);
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = std::min(text.find(',', start), text.size());
      const std::string item = text.substr(start, end - start);
      const size_t at = item.find('@');
      LY_CHECK(at != std::string::npos, ErrorCode::kInvalidArgument,
               "LYCHEE_FP8_KEEP_BF16: '{}' is not MATRIX@LAYERS (e.g. qkv@0+1+7)", item);
      const std::string m = item.substr(0, at);
      LY_CHECK(m == "qkv" || m == "o" || m == "gate_up" || m == "down" || m == "all", ErrorCode::kInvalidArgument,
               "LYCHEE_FP8_KEEP_BF16: unknown matrix '{}' (qkv, o, gate_up, down or all)", m);
      r.emplace_back(m, "+" + item.substr(at + 1) + "+");
      start = end + 1;
    }
    return r;
  }();
  for (const auto& [m, layers] : rules)
    if ((m == "all" || m == matrix) && (layers == "+*+" || layers.find("+" + std::to_string(layer) + "+") != std::string::npos))
      return true;
  return false;
}

// Lab knob for FP8 weights: LYCHEE_FP8_LM_HEAD=1 adds an FP8 copy of the LM head (the output
// matrix, or the embedding table when tied; the bf16 one stays for the embedding lookup and for
// more than 32 rows), which decode logits then read: what an FP8 LM head saves and costs
// (docs/results/fp8_gpu). Not the default: the LM head stays bf16.
bool fp8_lm_head() {
  static const bool on = [] {
    const char* v = std::getenv("LYCHEE_FP8_LM_HEAD");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

// One layer's tensors, in the arena's order (bf16: the layout of before FP8 existed).
LayerOffsets plan_layer(ArenaPlan& a, const ModelConfig& c, GpuWeightFormat format, const Fp8Keep& keep, int layer,
                        size_t& matrix_bytes) {
  const bool fp8_format = format == GpuWeightFormat::kFp8;
  const auto matrix = [&](int rows, int cols, const char* name) {
    const bool fp8 = fp8_format && !keep_bf16(name, layer) && !(std::string_view(name) == "qkv" && keep.keeps_qkv(layer));
    const size_t values = size_t(rows) * size_t(cols) * (fp8 ? 1 : 2), scales = fp8 ? size_t(rows) * 4 : 0;
    MatrixOffsets m{SIZE_MAX, SIZE_MAX, rows, cols};
    m.values = a.add(values);
    if (fp8) m.scales = a.add(scales);
    matrix_bytes += values + scales;
    return m;
  };
  const size_t d = size_t(c.d_model);
  const int qkv = c.q_dim() + 2 * c.kv_dim();
  LayerOffsets o;
  o.attn_norm = a.add(d * 4);
  o.wqkv = matrix(qkv, c.d_model, "qkv");
  if (c.qkv_bias) o.bqkv = a.add(size_t(qkv) * 4);
  if (c.qk_norm) {
    o.q_norm = a.add(size_t(c.head_dim) * 4);
    o.k_norm = a.add(size_t(c.head_dim) * 4);
  }
  o.wo = matrix(c.d_model, c.q_dim(), "o");
  if (c.o_bias) o.bo = a.add(d * 4);
  o.ffn_norm = a.add(d * 4);
  o.w_gate_up = matrix(2 * c.d_ff, c.d_model, "gate_up");
  if (c.mlp_bias) o.b_gate_up = a.add(2 * size_t(c.d_ff) * 4);
  o.w_down = matrix(c.d_model, c.d_ff, "down");
  if (c.mlp_bias) o.b_down = a.add(d * 4);
  return o;
}

// The same sequence of tensors for both formats.
Layout plan_layout(const ModelConfig& c, GpuWeightFormat format, const Fp8Keep& keep) {
  ArenaPlan a;
  Layout l;
  const size_t d = size_t(c.d_model);
  l.embed = a.add(size_t(c.vocab_size) * d * 2);
  l.output = c.tie_embeddings ? l.embed : a.add(size_t(c.vocab_size) * d * 2);
  l.out_norm = a.add(d * 4);
  l.inv_freq = a.add(size_t(c.head_dim / 2) * 4);
  if (format == GpuWeightFormat::kFp8 && fp8_lm_head()) {
    l.output8 = {a.add(size_t(c.vocab_size) * d), SIZE_MAX, c.vocab_size, c.d_model};
    l.output8.scales = a.add(size_t(c.vocab_size) * 4);
  }
  for (int i = 0; i < c.n_layers; ++i) l.layers.push_back(plan_layer(a, c, format, keep, i, l.matrix_bytes));
  l.total = a.size;
  return l;
}

template <typename T>
const T* at(const DeviceBuffer<uint8_t>& arena, size_t off) {
  return off == SIZE_MAX ? nullptr : reinterpret_cast<const T*>(arena.data() + off);
}

GpuMatrix bind_matrix(const MatrixOffsets& m, const DeviceBuffer<uint8_t>& arena) {
  GpuMatrix g;
  if (m.scales != SIZE_MAX) {
    g.codes = at<uint8_t>(arena, m.values);
    g.scales = at<float>(arena, m.scales);
  } else {
    g.values = at<bf16>(arena, m.values);
  }
  g.rows = m.rows;
  g.cols = m.cols;
  return g;
}

void bind_layout(const Layout& l, const DeviceBuffer<uint8_t>& arena, std::vector<GpuLayerWeights>& layers,
          const bf16*& embed, const bf16*& output, GpuMatrix& output8, const float*& out_norm,
          const float*& inv_freq) {
  embed = at<bf16>(arena, l.embed);
  if (l.output8.values != SIZE_MAX) output8 = bind_matrix(l.output8, arena);
  output = at<bf16>(arena, l.output);
  out_norm = at<float>(arena, l.out_norm);
  inv_freq = at<float>(arena, l.inv_freq);
  for (const LayerOffsets& o : l.layers)
    layers.push_back({at<float>(arena, o.attn_norm), bind_matrix(o.wqkv, arena), at<float>(arena, o.bqkv),
                      at<float>(arena, o.q_norm), at<float>(arena, o.k_norm), bind_matrix(o.wo, arena),
                      at<float>(arena, o.bo), at<float>(arena, o.ffn_norm), bind_matrix(o.w_gate_up, arena),
                      at<float>(arena, o.b_gate_up), bind_matrix(o.w_down, arena), at<float>(arena, o.b_down)});
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
  // The weight's rows as rows first_row.. of the fused matrix m, in m's format. FP8 rows are
  // quantised one by one (core/fp8.h), so a fused matrix holds exactly its parts' codes.
  void matrix_rows(WeightId id, int layer, const MatrixOffsets& m, int first_row) {
    if (m.scales == SIZE_MAX) return bf16_rows(id, layer, m.values, size_t(first_row) * size_t(m.cols));
    const int64_t n = read(id, layer), rows = n / m.cols;
    codes_.resize(size_t(n));
    scales_.resize(size_t(rows));
    quantize_rows_e4m3(f32_.data(), rows, m.cols, codes_.data(), scales_.data());
    LY_CUDA_CHECK(cudaMemcpy(arena_.data() + m.values + size_t(first_row) * size_t(m.cols), codes_.data(),
                             size_t(n), cudaMemcpyHostToDevice));
    LY_CUDA_CHECK(cudaMemcpy(arena_.data() + m.scales + size_t(first_row) * 4, scales_.data(), size_t(rows) * 4,
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
  std::vector<uint8_t> codes_;
  std::vector<float> scales_;
};

void upload_layer(Uploader& up, const ModelConfig& c, int i, const LayerOffsets& o) {
  const int qd = c.q_dim(), kvd = c.kv_dim();
  up.f32(WeightId::kAttnNorm, i, o.attn_norm);
  up.matrix_rows(WeightId::kWq, i, o.wqkv, 0);
  up.matrix_rows(WeightId::kWk, i, o.wqkv, qd);
  up.matrix_rows(WeightId::kWv, i, o.wqkv, qd + kvd);
  if (c.qkv_bias) {
    up.f32(WeightId::kBq, i, o.bqkv, 0);
    up.f32(WeightId::kBk, i, o.bqkv, size_t(qd));
    up.f32(WeightId::kBv, i, o.bqkv, size_t(qd + kvd));
  }
  if (c.qk_norm) {
    up.f32(WeightId::kQNorm, i, o.q_norm);
    up.f32(WeightId::kKNorm, i, o.k_norm);
  }
  up.matrix_rows(WeightId::kWo, i, o.wo, 0);
  if (c.o_bias) up.f32(WeightId::kBo, i, o.bo);
  up.f32(WeightId::kFfnNorm, i, o.ffn_norm);
  up.matrix_rows(WeightId::kWGate, i, o.w_gate_up, 0);
  up.matrix_rows(WeightId::kWUp, i, o.w_gate_up, c.d_ff);
  if (c.mlp_bias) {
    up.f32(WeightId::kBGate, i, o.b_gate_up, 0);
    up.f32(WeightId::kBUp, i, o.b_gate_up, size_t(c.d_ff));
    up.f32(WeightId::kBDown, i, o.b_down);
  }
  up.matrix_rows(WeightId::kWDown, i, o.w_down, 0);
}

// The embedding, LM head, final norm and RoPE frequencies (whole on every rank).
void upload_globals(Uploader& up, const Checkpoint& ck, DeviceBuffer<uint8_t>& arena, const Layout& l) {
  const ModelConfig& c = ck.config();
  up.bf16_rows(WeightId::kTokEmbd, 0, l.embed, 0);
  if (!c.tie_embeddings) up.bf16_rows(WeightId::kOutput, 0, l.output, 0);
  if (l.output8.values != SIZE_MAX)
    up.matrix_rows(c.tie_embeddings ? WeightId::kTokEmbd : WeightId::kOutput, 0, l.output8, 0);
  up.f32(WeightId::kOutputNorm, 0, l.out_norm);
  std::vector<float> inv = rope_inv_freq(c);
  if (ck.weight(WeightId::kRopeFreqs) != nullptr) {
    std::vector<float> ff(inv.size());
    ck.read_f32(WeightId::kRopeFreqs, 0, ff.data());
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= ff[i];
  }
  LY_CUDA_CHECK(cudaMemcpy(arena.data() + l.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
}

void check_format(const ModelConfig& c, GpuWeightFormat format) {
  if (format != GpuWeightFormat::kFp8) return;
  const std::string why = fp8_weights_unsupported(c);
  LY_CHECK(why.empty(), ErrorCode::kUnsupported, "{}", why);
}

// Random weights, tensor by tensor with consecutive seeds (the order GpuWeights::random and its
// shards both follow, so a shard's values are slices of the whole model's).
struct RandomFiller {
  uint64_t seed;
  void bf16s(uint8_t* p, size_t n) { fill_normal_bf16(reinterpret_cast<bf16*>(p), n, seed++, 0.02f, nullptr); }
  void ones(uint8_t* p, size_t n) { fill_const_f32(reinterpret_cast<float*>(p), n, 1.0f, nullptr); }
  // codes of N(0, 112²) and row scales 0.02 / 112 (see GpuWeights::random), or bf16 N(0, 0.02²)
  void matrix(uint8_t* arena, const MatrixOffsets& m) {
    constexpr float kCodeStd = kE4m3Max / 4;
    const size_t n = size_t(m.rows) * size_t(m.cols);
    if (m.scales == SIZE_MAX) return bf16s(arena + m.values, n);
    fill_normal_e4m3(arena + m.values, n, seed++, kCodeStd, nullptr);
    fill_const_f32(reinterpret_cast<float*>(arena + m.scales), size_t(m.rows), 0.02f / kCodeStd, nullptr);
  }
  void layer(uint8_t* arena, const LayerOffsets& o, const ModelConfig& c) {
    const size_t d = size_t(c.d_model);
    ones(arena + o.attn_norm, d);
    ones(arena + o.ffn_norm, d);
    matrix(arena, o.wqkv);
    matrix(arena, o.wo);
    matrix(arena, o.w_gate_up);
    matrix(arena, o.w_down);
    LY_CHECK(o.bqkv == SIZE_MAX && o.q_norm == SIZE_MAX && o.bo == SIZE_MAX && o.b_gate_up == SIZE_MAX,
             ErrorCode::kInvalidArgument, "random weights support Llama-shaped configs without biases or q/k norms");
  }
  void globals(uint8_t* arena, const Layout& l, const ModelConfig& c) {
    const size_t d = size_t(c.d_model);
    bf16s(arena + l.embed, size_t(c.vocab_size) * d);
    if (!c.tie_embeddings) bf16s(arena + l.output, size_t(c.vocab_size) * d);
    if (l.output8.values != SIZE_MAX) matrix(arena, l.output8);
    ones(arena + l.out_norm, d);
    const std::vector<float> inv = rope_inv_freq(c);
    LY_CUDA_CHECK(cudaMemcpy(arena + l.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  }
};

// Device copies of blocks of a row-major [.][src_cols] matrix of `es`-byte elements into a
// [.][dst_cols] one: every (row block, column block) pair.
void copy_blocks(uint8_t* dst, int dst_cols, const uint8_t* src, int src_cols, size_t es,
                 const std::vector<TpBlock>& rows, const std::vector<TpBlock>& cols) {
  for (const TpBlock& r : rows)
    for (const TpBlock& k : cols)
      LY_CUDA_CHECK(cudaMemcpy2D(dst + (size_t(r.dst) * size_t(dst_cols) + size_t(k.dst)) * es, size_t(dst_cols) * es,
                                 src + (size_t(r.src) * size_t(src_cols) + size_t(k.src)) * es, size_t(src_cols) * es,
                                 size_t(k.n) * es, size_t(r.n), cudaMemcpyDeviceToDevice));
}

void copy_whole(uint8_t* dst, size_t dst_off, const uint8_t* src, size_t src_off, size_t bytes) {
  if (src_off == SIZE_MAX) return;
  LY_CUDA_CHECK(cudaMemcpy(dst + dst_off, src + src_off, bytes, cudaMemcpyDeviceToDevice));
}

// A matrix's rank part: its values (codes or bf16) by rows x columns, FP8 scales by rows.
void copy_matrix(uint8_t* dst, const MatrixOffsets& to, const uint8_t* src, const MatrixOffsets& from,
                 const std::vector<TpBlock>& rows, const std::vector<TpBlock>& cols) {
  const bool fp8 = from.scales != SIZE_MAX;
  copy_blocks(dst + to.values, to.cols, src + from.values, from.cols, fp8 ? 1 : 2, rows, cols);
  if (fp8) copy_blocks(dst + to.scales, 1, src + from.scales, 1, 4, rows, {{0, 0, 1}});
}

// Layer `from` of the whole model (in `src`) to its rank part `to` (in `dst`).
void copy_layer_part(uint8_t* dst, const LayerOffsets& to, const uint8_t* src, const LayerOffsets& from,
                     const ModelConfig& full, const TpShardShape& sh) {
  const size_t d = size_t(full.d_model);
  const std::vector<TpBlock> all_d{{0, 0, full.d_model}}, one{{0, 0, 1}};
  copy_whole(dst, to.attn_norm, src, from.attn_norm, d * 4);
  copy_whole(dst, to.ffn_norm, src, from.ffn_norm, d * 4);
  copy_whole(dst, to.q_norm, src, from.q_norm, size_t(full.head_dim) * 4);
  copy_whole(dst, to.k_norm, src, from.k_norm, size_t(full.head_dim) * 4);
  copy_whole(dst, to.bo, src, from.bo, d * 4);
  copy_whole(dst, to.b_down, src, from.b_down, d * 4);
  copy_matrix(dst, to.wqkv, src, from.wqkv, sh.qkv_rows, all_d);
  if (from.bqkv != SIZE_MAX) copy_blocks(dst + to.bqkv, 1, src + from.bqkv, 1, 4, sh.qkv_rows, one);
  copy_matrix(dst, to.wo, src, from.wo, all_d, sh.o_cols);
  copy_matrix(dst, to.w_gate_up, src, from.w_gate_up, sh.gate_up_rows, all_d);
  if (from.b_gate_up != SIZE_MAX) copy_blocks(dst + to.b_gate_up, 1, src + from.b_gate_up, 1, 4, sh.gate_up_rows, one);
  copy_matrix(dst, to.w_down, src, from.w_down, all_d, sh.down_cols);
}

}  // namespace

int fp8_gemv_launches(int n) {
  const int launches = (n + kFp8GemvMaxRows - 1) / kFp8GemvMaxRows;
  return n >= 1 && launches <= kFp8GemvMaxLaunches ? launches : 0;
}

std::string fp8_weights_unsupported(const ModelConfig& c) {
  if (c.d_model % 16 == 0 && c.q_dim() % 16 == 0 && c.d_ff % 16 == 0) return "";
  return fmt::format("--weights fp8: the FP8 products read 16 codes at a time, so every input width must be a "
                     "multiple of 16; {} has hidden size {}, q_dim {} (heads x head_dim) and intermediate size {}",
                     c.name, c.d_model, c.q_dim(), c.d_ff);
}

GpuWeights GpuWeights::from_checkpoint(const Checkpoint& ck, GpuWeightFormat format, const Fp8Keep& keep) {
  check_format(ck.config(), format);
  GpuWeights w;
  w.config_ = ck.config();
  w.format_ = format;
  const ModelConfig& c = w.config_;
  const Layout l = plan_layout(c, format, keep);
  w.arena_ = DeviceBuffer<uint8_t>(l.total);
  w.full_config_ = c;
  Uploader up(ck, w.arena_);
  upload_globals(up, ck, w.arena_, l);
  for (int i = 0; i < c.n_layers; ++i) upload_layer(up, c, i, l.layers[size_t(i)]);
  w.matrix_bytes_ = l.matrix_bytes;
  bind_layout(l, w.arena_, w.layers, w.embed, w.output, w.output8, w.out_norm, w.inv_freq);
  return w;
}

GpuWeights GpuWeights::random(const ModelConfig& c, uint64_t seed, GpuWeightFormat format, const Fp8Keep& keep) {
  check_format(c, format);
  GpuWeights w;
  w.config_ = c;
  w.full_config_ = c;
  w.format_ = format;
  const Layout l = plan_layout(c, format, keep);
  w.arena_ = DeviceBuffer<uint8_t>(l.total);
  RandomFiller fill{seed};
  fill.globals(w.arena_.data(), l, c);
  for (const LayerOffsets& o : l.layers) fill.layer(w.arena_.data(), o, c);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  w.matrix_bytes_ = l.matrix_bytes;
  bind_layout(l, w.arena_, w.layers, w.embed, w.output, w.output8, w.out_norm, w.inv_freq);
  return w;
}

GpuWeights GpuWeights::shard(const Checkpoint* ck, const ModelConfig& full, uint64_t seed, GpuWeightFormat format,
                             const Fp8Keep& keep, const std::vector<int>& kv_heads, int rank, int n_gpus) {
  const TpShardShape sh = tp_shard_shape(full, kv_heads, rank, n_gpus);
  check_format(full, format);
  check_format(sh.config, format);
  GpuWeights w;
  w.config_ = sh.config;
  w.full_config_ = full;
  w.format_ = format;
  w.tp_rank_ = rank;
  w.tp_size_ = n_gpus;
  w.kv_heads_ = kv_heads;
  const Layout l = plan_layout(sh.config, format, keep);
  w.arena_ = DeviceBuffer<uint8_t>(l.total);
  // The whole model's layers, one at a time, in a scratch of the largest.
  std::vector<LayerOffsets> full_layers;
  size_t scratch_bytes = 0, unused = 0;
  for (int i = 0; i < full.n_layers; ++i) {
    ArenaPlan a;
    full_layers.push_back(plan_layer(a, full, format, keep, i, unused));
    scratch_bytes = std::max(scratch_bytes, a.size);
  }
  DeviceBuffer<uint8_t> scratch(scratch_bytes);
  RandomFiller fill{seed};
  if (ck != nullptr) {
    Uploader up(*ck, w.arena_);
    upload_globals(up, *ck, w.arena_, l);
  } else {
    fill.globals(w.arena_.data(), l, full);
  }
  for (int i = 0; i < full.n_layers; ++i) {
    if (ck != nullptr) {
      Uploader up(*ck, scratch);
      upload_layer(up, full, i, full_layers[size_t(i)]);
    } else {
      fill.layer(scratch.data(), full_layers[size_t(i)], full);
    }
    copy_layer_part(w.arena_.data(), l.layers[size_t(i)], scratch.data(), full_layers[size_t(i)], full, sh);
  }
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  w.matrix_bytes_ = l.matrix_bytes;
  bind_layout(l, w.arena_, w.layers, w.embed, w.output, w.output8, w.out_norm, w.inv_freq);
  return w;
}

uint64_t GpuWeights::bytes_read_per_step(int batch) const {
  const ModelConfig& c = config_;
  const uint64_t d = uint64_t(c.d_model);
  const uint64_t per_layer_norms = 2 * d * 4;
  const uint64_t lm_head = output8.fp8() ? uint64_t(c.vocab_size) * (d + 4) : uint64_t(c.vocab_size) * d * 2;
  return uint64_t(matrix_bytes_) + per_layer_norms * uint64_t(c.n_layers) + lm_head + d * 4 + uint64_t(batch) * d * 2;
}

}  // namespace lychee::cuda
