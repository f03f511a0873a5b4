#include "cpu/model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "cpu/decode_attention.h"
#include "cpu/ops.h"
#include "cpu/quant_pack.h"

namespace lychee::cpu {

namespace {

// LYCHEE_CPU_GEMM_ROWS (a lab knob for measuring the products, docs/results/cpu_default.md): the
// row count from which quantised matrices go through dequantised sgemm, 0 for never; unset:
// kDefaultGemmRows.
int64_t gemm_rows_setting() {
  const char* v = std::getenv("LYCHEE_CPU_GEMM_ROWS");
  if (v == nullptr) return kDefaultGemmRows;
  char* end = nullptr;
  errno = 0;
  const long long rows = std::strtoll(v, &end, 10);
  LY_CHECK(end != v && *end == '\0' && errno == 0 && rows >= 0, ErrorCode::kInvalidArgument,
           "LYCHEE_CPU_GEMM_ROWS must be a row count >= 0 (0: never dequantise for sgemm), got \"{}\"", v);
  return rows;
}

// LYCHEE_CPU_PACK=0 (a lab knob, docs/results/cpu_default.md): keep every matrix in the file's
// row-major layout, through the one-row kernels; unset or 1: eight-row groups where there is a layout.
bool pack_setting() {
  const char* v = std::getenv("LYCHEE_CPU_PACK");
  if (v == nullptr) return true;
  const std::string_view s(v);
  LY_CHECK(s == "0" || s == "1", ErrorCode::kInvalidArgument, "LYCHEE_CPU_PACK must be 0 or 1, got \"{}\"", v);
  return s == "1";
}

// Every block-quantised matrix the products read, of a type with an eight-row layout and at
// least one group, re-laid out into cpu/quant_pack.h's groups. The token embedding only when it
// is the (tied) LM head: lookups read one row, which the layout makes slower.
void pack_for_decode(HostWeights& w, const ModelConfig& c) {
  const bool tied = w.view(WeightId::kOutput).data == w.view(WeightId::kTokEmbd).data;
  for (const WeightSpec& spec : weight_table())
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      if (spec.id == (tied ? WeightId::kOutput : WeightId::kTokEmbd)) continue;
      const WeightView& v = w.view(spec.id, layer);
      if (v.data == nullptr || !v.quantized() || !packable(v.dtype) || v.rows < kPackRows) continue;
      w.relayout(spec.id, layer, kPackRows,
                 [](uint8_t* bytes, const WeightView& m) { pack_rows8(m.dtype, bytes, m.rows, m.cols); });
    }
}

}  // namespace

Model::Model(const ModelConfig& config, HostWeights weights)
    : config_(config), weights_(std::move(weights)), inv_freq_(rope_inv_freq(config)),
      min_gemm_rows_(gemm_rows_setting()) {
  if (const float* ff = weights_.get(WeightId::kRopeFreqs)) {  // GGUF llama3 frequency factors
    for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= ff[i];
  }
  if (weights_.format() == WeightFormat::kNative && detected_quant_isa() == QuantIsa::kAvx2 && pack_setting())
    pack_for_decode(weights_, config_);
}

void Model::forward(std::span<const int32_t> tokens, KvCache& kv, std::vector<float>& logits,
                    bool all_logits, AttentionPolicy* policy, KvReadStats* stats) {
  const ModelConfig& c = config_;
  const int n = int(tokens.size());
  LY_CHECK(n > 0, ErrorCode::kInvalidArgument, "forward needs at least one token");
  LY_CHECK(kv.length() + n <= kv.capacity(), ErrorCode::kCapacity,
           "KV cache full: {} cached + {} new tokens exceed its capacity of {} tokens", kv.length(),
           n, kv.capacity());
  LY_CHECK(kv.length() + n <= c.max_context, ErrorCode::kCapacity,
           "sequence of {} tokens exceeds the model's context length {}", kv.length() + n,
           c.max_context);
  const int64_t d = c.d_model;
  s_.x.resize(size_t(n * d));
  const WeightView& embd = weights_.view(WeightId::kTokEmbd);
  for (int t = 0; t < n; ++t) {
    LY_CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size, ErrorCode::kInvalidArgument,
             "token id {} at position {} is outside the vocabulary (size {})", tokens[t], t,
             c.vocab_size);
    weight_row_f32(embd, tokens[t], &s_.x[size_t(t * d)]);
  }
  s_.pos.resize(size_t(n));
  for (int t = 0; t < n; ++t) s_.pos[size_t(t)] = kv.length() + t;

  const bool decode = n == 1 && kv.length() > 0;
  if (decode && stats != nullptr) ++stats->decode_steps;
  for (int layer = 0; layer < c.n_layers; ++layer) {
    attention_block(layer, n, kv, decode ? policy : nullptr, decode ? stats : nullptr);
    mlp_block(layer, n);
  }
  kv.advance(n);

  const int first = all_logits ? 0 : n - 1;
  const int n_out = n - first;
  s_.h.resize(size_t(n_out * d));
  rmsnorm(&s_.x[size_t(first * d)], weights_.get(WeightId::kOutputNorm), s_.h.data(), n_out, int(d),
          c.rms_eps);
  logits.resize(size_t(n_out) * c.vocab_size);
  linear(s_.h.data(), WeightId::kOutput, WeightId::kCount, 0, logits.data(), n_out);
}

void Model::linear(const float* x, WeightId id, WeightId bias, int layer, float* y, int n) {
  const float* b = bias == WeightId::kCount ? nullptr : weights_.get(bias, layer);
  const WeightView w = weights_.view(id, layer);
  if (weights_.format() == WeightFormat::kNative && !w.quantized() && n > 1 &&
      product(n) == LinearProduct::kQuantDot) {
    // A plain matrix in a native model, a chunk short enough for the integer products: row by
    // row through the decode step's product, so that a prompt row gets what it gets as a decode
    // step (sgemm sums in another order).
    for (int i = 0; i < n; ++i)
      cpu::linear(x + int64_t(i) * w.cols, w, b, y + int64_t(i) * w.rows, 1, isa_, s_.lin);
    return;
  }
  cpu::linear(x, w, b, y, n, isa_, s_.lin, product(n));
}

void Model::linear_group(const float* x, std::initializer_list<Product> products, int layer, int n) {
  if (weights_.format() == WeightFormat::kNative) {
    std::vector<LinearOut>& outs = s_.group;
    outs.clear();
    bool quantised = true;
    for (const Product& p : products) {
      const WeightView w = weights_.view(p.id, layer);
      quantised &= w.quantized();
      outs.push_back({w, p.bias == WeightId::kCount ? nullptr : weights_.get(p.bias, layer), p.y});
    }
    if (quantised) {
      cpu::linear_group(x, outs, n, isa_, s_.lin, product(n));
      return;
    }
  }
  for (const Product& p : products) linear(x, p.id, p.bias, layer, p.y, n);
}

void Model::attention_block(int layer, int n, KvCache& kv, AttentionPolicy* policy, KvReadStats* stats) {
  const ModelConfig& c = config_;
  const int d = c.d_model, hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
  auto w = [&](WeightId id) { return weights_.get(id, layer); };
  s_.h.resize(size_t(n) * d);
  rmsnorm(s_.x.data(), w(WeightId::kAttnNorm), s_.h.data(), n, d, c.rms_eps);
  s_.q.resize(size_t(n) * qd);
  s_.k.resize(size_t(n) * kvd);
  s_.v.resize(size_t(n) * kvd);
  linear_group(s_.h.data(),
               {{WeightId::kWq, WeightId::kBq, s_.q.data()}, {WeightId::kWk, WeightId::kBk, s_.k.data()},
                {WeightId::kWv, WeightId::kBv, s_.v.data()}},
               layer, n);
  if (c.qk_norm) {
    rmsnorm(s_.q.data(), w(WeightId::kQNorm), s_.q.data(), n * c.n_heads, hd, c.rms_eps);
    rmsnorm(s_.k.data(), w(WeightId::kKNorm), s_.k.data(), n * c.n_kv_heads, hd, c.rms_eps);
  }
  rope(s_.q.data(), s_.pos.data(), n, c.n_heads, hd, inv_freq_.data());
  rope(s_.k.data(), s_.pos.data(), n, c.n_kv_heads, hd, inv_freq_.data());

  const int pos0 = kv.length();
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const size_t src = (size_t(t) * c.n_kv_heads + h) * hd;
      kv.write(layer, h, pos0 + t, &s_.k[src], &s_.v[src]);  // FP8-rounded with --kv-cache-dtype fp8
    }

  s_.att.resize(size_t(n) * qd);
  if (policy != nullptr) {
    decode_attention(layer, kv, policy, stats);
  } else {
    if (stats != nullptr) {  // a dense decode step reads every token of every KV head
      stats->token_reads += uint64_t(c.n_kv_heads) * uint64_t(pos0 + 1);
      stats->dense_token_reads += uint64_t(c.n_kv_heads) * uint64_t(pos0 + 1);
    }
    const int group = c.group_size();
    const float scale = 1.0f / std::sqrt(float(hd));
    if (weights_.format() == WeightFormat::kNative && product(n) == LinearProduct::kQuantDot) {
      // decode_attention.h says why; a chunk long enough for the dequantised sgemm takes the
      // reference's BLAS attention below, as the f32 model's prefill does
      attend_rows(s_.q.data(), n, c.n_heads, group, hd, kv.k(layer, 0), kv.v(layer, 0),
                  int64_t(kv.capacity()) * hd, pos0, scale, s_.att.data());
    } else {
#pragma omp parallel for schedule(dynamic)
      for (int h = 0; h < c.n_kv_heads; ++h)
        attend_causal(&s_.q[size_t(h) * group * hd], n, group, hd, qd, kv.k(layer, h), kv.v(layer, h),
                      pos0, scale, &s_.att[size_t(h) * group * hd], qd);
    }
  }
  s_.o.resize(size_t(n) * d);
  linear(s_.att.data(), WeightId::kWo, WeightId::kBo, layer, s_.o.data(), n);
  add_inplace(s_.x.data(), s_.o.data(), int64_t(n) * d);
}

void Model::decode_attention(int layer, KvCache& kv, AttentionPolicy* policy, KvReadStats* stats) {
  const ModelConfig& c = config_;
  const int hd = c.head_dim;
  const int n_ctx = kv.length() + 1;  // the current token's K/V are written, not yet counted
  LayerKvView view{kv.k(layer, 0), kv.v(layer, 0), kv.capacity(), c.n_kv_heads, hd, n_ctx};
  s_.reads.assign(size_t(c.n_heads), HeadRead{});
  policy->plan_layer(layer, s_.q.data(), view, s_.reads);
  for (int h = 0; h < c.n_heads; ++h) {  // checked before the parallel loop, which must not throw
    const HeadRead& r = s_.reads[size_t(h)];
    if (!r.dense) {
      LY_CHECK(!r.tokens.empty() && r.tokens.back() < n_ctx && r.tokens.front() >= 0,
               ErrorCode::kInternal, "policy {} gave layer {} head {} an invalid read set",
               policy->name(), layer, h);
    }
  }
  const float scale = 1.0f / std::sqrt(float(hd));
  // Native weights: the f32 per-head routine of attend_rows (a dense head gives what a step without
  // a policy gives); f32 weights: ops.h's attend, the reference (double sums). Heads in parallel,
  // one at a time, so that a preempted thread holds no static share.
  const bool native = weights_.format() == WeightFormat::kNative;
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < c.n_heads; ++h) {
    const int kvh = h / c.group_size();
    const HeadRead& r = s_.reads[size_t(h)];
    const int32_t* tokens = r.dense ? nullptr : r.tokens.data();
    const int n = r.dense ? n_ctx : int(r.tokens.size());
    float* out = &s_.att[size_t(h) * hd];
    if (native)
      attend_head(&s_.q[size_t(h) * hd], kv.k(layer, kvh), kv.v(layer, kvh), hd, tokens, n, scale, out);
    else
      attend(&s_.q[size_t(h) * hd], kv.k(layer, kvh), kv.v(layer, kvh), hd, tokens, n, scale, out);
  }
  if (stats != nullptr) {
    const int group = c.group_size();
    for (int h = 0; h < c.n_kv_heads; ++h)
      stats->token_reads += uint64_t(union_size(std::span<const HeadRead>(s_.reads).subspan(size_t(h * group), size_t(group)), n_ctx));
    stats->dense_token_reads += uint64_t(c.n_kv_heads) * uint64_t(n_ctx);
    stats->metadata_bytes += policy->metadata_bytes(layer, n_ctx);
  }
}

void Model::mlp_block(int layer, int n) {
  const ModelConfig& c = config_;
  const int d = c.d_model, ff = c.d_ff;
  auto w = [&](WeightId id) { return weights_.get(id, layer); };
  s_.h.resize(size_t(n) * d);
  rmsnorm(s_.x.data(), w(WeightId::kFfnNorm), s_.h.data(), n, d, c.rms_eps);
  s_.gate.resize(size_t(n) * ff);
  s_.up.resize(size_t(n) * ff);
  linear_group(s_.h.data(),
               {{WeightId::kWGate, WeightId::kBGate, s_.gate.data()}, {WeightId::kWUp, WeightId::kBUp, s_.up.data()}},
               layer, n);
  silu_mul(s_.gate.data(), s_.up.data(), int64_t(n) * ff);
  s_.o.resize(size_t(n) * d);
  linear(s_.gate.data(), WeightId::kWDown, WeightId::kBDown, layer, s_.o.data(), n);
  add_inplace(s_.x.data(), s_.o.data(), int64_t(n) * d);
}

}  // namespace lychee::cpu
