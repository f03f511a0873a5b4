#include "train/cpu_student.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/weight_table.h"

namespace lychee::train {

namespace {

template <typename Real>
const Real* ptr(const std::vector<Real>& v) {
  return v.empty() ? nullptr : v.data();
}

// Whether a loop over KV heads is worth an OpenMP team: on a loaded machine a team for a tiny
// model's few microseconds of work waits a whole time slice for a preempted thread.
bool worth_threads(int64_t flops) { return flops >= (int64_t(1) << 22); }

}  // namespace

template <typename Real>
CpuStudent<Real>::CpuStudent(const ModelConfig& config, const HostWeights& weights,
                             StudentOptions options, int max_context)
    : config_(config), options_(options), max_context_(max_context) {
  const ModelConfig& c = config_;
  LY_CHECK(options.keep_ratio > 0.0 && options.keep_ratio <= 1.0, ErrorCode::kInvalidArgument,
           "student: keep_ratio must be in (0, 1], got {}", options.keep_ratio);
  LY_CHECK(max_context >= 2 && max_context <= c.max_context, ErrorCode::kInvalidArgument,
           "student: max_context must be in [2, {}] (the model's context length), got {}",
           c.max_context, max_context);
  LY_CHECK(
      c.n_layers >= 1 && c.head_dim % 2 == 0 && c.n_kv_heads >= 1 && c.n_heads % c.n_kv_heads == 0,
      ErrorCode::kInvalidArgument,
      "student: unsupported shape: {} layers, head_dim {}, {} heads over {} KV heads", c.n_layers,
      c.head_dim, c.n_heads, c.n_kv_heads);
  // A weight the config calls for and HostWeights lacks is an error unless the table marks it
  // optional; absent weights stay empty vectors.
  auto take = [&](WeightId id, int layer) {
    const WeightSpec& spec = weight_spec(id);
    const bool wanted = spec.present == nullptr || spec.present(c);
    const float* p = wanted ? weights.get(id, layer) : nullptr;
    LY_CHECK(p != nullptr || !wanted || spec.optional, ErrorCode::kNotFound,
             "student: weight {} (layer {}) is missing from the loaded weights",
             weight_hf_name(spec, layer), layer);
    return p == nullptr ? std::vector<Real>() : std::vector<Real>(p, p + weight_numel(spec, c));
  };
  tok_embd_ = take(WeightId::kTokEmbd, 0);
  output_norm_ = take(WeightId::kOutputNorm, 0);
  output_ = take(WeightId::kOutput, 0);  // empty when tied: lm_head() is the embedding
  std::vector<float> inv = rope_inv_freq(c);
  if (const float* ff = weights.get(WeightId::kRopeFreqs)) {  // GGUF llama3 factors, as cpu::Model
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= ff[i];
  }
  inv_freq_.assign(inv.begin(), inv.end());
  layers_.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = layers_[size_t(l)];
    w.attn_norm = take(WeightId::kAttnNorm, l);
    w.wq = take(WeightId::kWq, l);
    w.wk = take(WeightId::kWk, l);
    w.wv = take(WeightId::kWv, l);
    w.wo = take(WeightId::kWo, l);
    w.bq = take(WeightId::kBq, l);
    w.bk = take(WeightId::kBk, l);
    w.bv = take(WeightId::kBv, l);
    w.bo = take(WeightId::kBo, l);
    w.q_norm = take(WeightId::kQNorm, l);
    w.k_norm = take(WeightId::kKNorm, l);
    w.ffn_norm = take(WeightId::kFfnNorm, l);
    w.w_gate = take(WeightId::kWGate, l);
    w.w_up = take(WeightId::kWUp, l);
    w.w_down = take(WeightId::kWDown, l);
    w.b_gate = take(WeightId::kBGate, l);
    w.b_up = take(WeightId::kBUp, l);
    w.b_down = take(WeightId::kBDown, l);
  }
  const size_t kv_len = size_t(c.n_kv_heads) * size_t(max_context) * size_t(c.head_dim);
  k_.assign(size_t(c.n_layers), std::vector<Real>(kv_len));
  v_.assign(size_t(c.n_layers), std::vector<Real>(kv_len));
  acts_.resize(size_t(c.n_layers));
}

template <typename Real>
void CpuStudent<Real>::check_tokens(std::span<const int32_t> tokens, const char* what) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    LY_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size, ErrorCode::kInvalidArgument,
             "student: {} token {} at index {} is outside the vocabulary (size {})", what,
             tokens[i], i, config_.vocab_size);
}

template <typename Real>
void CpuStudent<Real>::embed(std::span<const int32_t> tokens, Real* x) const {
  const int64_t d = config_.d_model;
  for (size_t t = 0; t < tokens.size(); ++t)
    std::copy_n(tok_embd_.data() + int64_t(tokens[t]) * d, d, x + int64_t(t) * d);
}

// q[n, q_dim] after the qk norms and RoPE for rows at positions pos0 … pos0 + n − 1 of input
// x[n, d]; their K (after RoPE) and V go to the layer's cache rows. acts (targets of the
// student) keeps the pre-norm q and k.
template <typename Real>
void CpuStudent<Real>::project_qkv(int layer, const Real* x, int n, int pos0, LayerActs* acts,
                                   Real* q) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[size_t(layer)];
  const int d = c.d_model, hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
  const Real eps = Real(c.rms_eps);
  std::vector<Real> h(size_t(n) * d), k(size_t(n) * kvd), v(size_t(n) * kvd);
  rmsnorm<Real>(x, w.attn_norm.data(), h.data(), n, d, eps);
  linear<Real>(h.data(), w.wq.data(), ptr(w.bq), q, n, d, qd);
  linear<Real>(h.data(), w.wk.data(), ptr(w.bk), k.data(), n, d, kvd);
  linear<Real>(h.data(), w.wv.data(), ptr(w.bv), v.data(), n, d, kvd);
  if (c.qk_norm) {
    if (acts != nullptr) {
      acts->q_pre.assign(q, q + int64_t(n) * qd);
      acts->k_pre = k;
    }
    rmsnorm<Real>(q, w.q_norm.data(), q, n * c.n_heads, hd, eps);
    rmsnorm<Real>(k.data(), w.k_norm.data(), k.data(), n * c.n_kv_heads, hd, eps);
  }
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) pos[size_t(t)] = pos0 + t;
  rope<Real>(q, pos.data(), n, c.n_heads, hd, inv_freq_.data());
  rope<Real>(k.data(), pos.data(), n, c.n_kv_heads, hd, inv_freq_.data());
  for (int t = 0; t < n; ++t)
    for (int kh = 0; kh < c.n_kv_heads; ++kh) {
      const int64_t src = (int64_t(t) * c.n_kv_heads + kh) * hd;
      const int64_t dst = (int64_t(kh) * max_context_ + pos0 + t) * hd;
      std::copy_n(k.data() + src, hd, k_[size_t(layer)].data() + dst);
      std::copy_n(v.data() + src, hd, v_[size_t(layer)].data() + dst);
    }
}

// x[n, d] += SwiGLU MLP of rmsnorm(x). acts keeps the input (x2) and the gate and up products.
template <typename Real>
void CpuStudent<Real>::mlp(int layer, Real* x, int n, LayerActs* acts) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[size_t(layer)];
  const int d = c.d_model, ff = c.d_ff;
  std::vector<Real> h(size_t(n) * d), gate(size_t(n) * ff), up(size_t(n) * ff), y(size_t(n) * d);
  rmsnorm<Real>(x, w.ffn_norm.data(), h.data(), n, d, Real(c.rms_eps));
  linear<Real>(h.data(), w.w_gate.data(), ptr(w.b_gate), gate.data(), n, d, ff);
  linear<Real>(h.data(), w.w_up.data(), ptr(w.b_up), up.data(), n, d, ff);
  std::vector<Real> m(size_t(n) * ff);
  swiglu<Real>(gate.data(), up.data(), m.data(), int64_t(n) * ff);
  linear<Real>(m.data(), w.w_down.data(), ptr(w.b_down), y.data(), n, ff, d);
  if (acts != nullptr) {
    acts->x2.assign(x, x + int64_t(n) * d);
    acts->gate = std::move(gate);
    acts->up = std::move(up);
  }
  for (int64_t i = 0; i < int64_t(n) * d; ++i) x[i] += y[i];
}

template <typename Real>
void CpuStudent<Real>::set_context(std::span<const int32_t> tokens) {
  const ModelConfig& c = config_;
  const int n = int(tokens.size());
  LY_CHECK(int64_t(tokens.size()) < max_context_, ErrorCode::kCapacity,
           "student: a context of {} tokens leaves no room for a target in max_context {}",
           tokens.size(), max_context_);
  check_tokens(tokens, "context");
  n_ctx_ = -1;
  have_teacher_ = false;
  targets_.clear();
  const int d = c.d_model, qd = c.q_dim(), hd = c.head_dim, group = c.group_size();
  const Real scale = Real(1) / std::sqrt(Real(hd));
  std::vector<Real> x(size_t(n) * d), q(size_t(n) * qd), att(size_t(n) * qd), o(size_t(n) * d);
  embed(tokens, x.data());
  for (int l = 0; l < c.n_layers && n > 0; ++l) {
    project_qkv(l, x.data(), n, 0, nullptr, q.data());
    if (l + 1 == c.n_layers) break;  // the targets need only the last layer's K/V
#pragma omp parallel for schedule(dynamic) if (worth_threads(int64_t(n) * n * qd))
    for (int kh = 0; kh < c.n_kv_heads; ++kh) {
      const int64_t off = int64_t(kh) * max_context_ * hd, col = int64_t(kh) * group * hd;
      attend_mix_group<Real>(q.data() + col, n, group, hd, qd, k_[size_t(l)].data() + off,
                             v_[size_t(l)].data() + off, 0, nullptr, scale, Real(1),
                             att.data() + col, qd, nullptr);
    }
    const LayerWeights& w = layers_[size_t(l)];
    linear<Real>(att.data(), w.wo.data(), ptr(w.bo), o.data(), n, qd, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    mlp(l, x.data(), n, nullptr);
  }
  n_ctx_ = n;
}

// Attention of the T target rows in `layer`: att[T, q_dim] from q[T, q_dim] and the cached K/V.
// z: the layer's gates [n_kv_heads] with `in` the sets the sparse part reads, or both nullptr for
// dense. out (when given) receives each row's new set from the group-mean raw logits.
template <typename Real>
void CpuStudent<Real>::attend_targets(int layer, const Real* q, const Real* z, const Sets* in,
                                      Sets* out, Real* att) const {
  const ModelConfig& c = config_;
  const int n_t = n_targets(), hd = c.head_dim, qd = c.q_dim(), group = c.group_size();
  const int width = n_ctx_ + n_t;
  const Real scale = Real(1) / std::sqrt(Real(hd));
#pragma omp parallel for schedule(dynamic) if (worth_threads(int64_t(n_t) * width * qd))
  for (int kh = 0; kh < c.n_kv_heads; ++kh) {
    const int64_t off = int64_t(kh) * max_context_ * hd, col = int64_t(kh) * group * hd;
    std::vector<Real> mean(out != nullptr ? size_t(n_t) * size_t(width) : 0);  // [T, L + T]
    attend_mix_group<Real>(
        q + col, n_t, group, hd, qd, k_[size_t(layer)].data() + off, v_[size_t(layer)].data() + off,
        n_ctx_, in != nullptr ? (*in)[size_t(kh)].data() : nullptr, scale,
        z != nullptr ? z[kh] : Real(1), att + col, qd, out != nullptr ? mean.data() : nullptr);
    for (int t = 0; t < n_t && out != nullptr; ++t) {
      const int p = n_ctx_ + t;
      select_set<Real>(mean.data() + int64_t(t) * width, p,
                       student_budget(options_.keep_ratio, p + 1), (*out)[size_t(kh)][size_t(t)]);
    }
  }
}

// The targets through the model: z == nullptr is the teacher (dense everywhere, nothing kept);
// otherwise the student (z: [n_layers * n_kv_heads]) keeps what backward() needs.
template <typename Real>
void CpuStudent<Real>::forward_targets(const Real* z, std::vector<Real>& out) {
  const ModelConfig& c = config_;
  const bool is_student = z != nullptr;
  const int n_t = n_targets(), d = c.d_model, qd = c.q_dim(), n_kv = c.n_kv_heads;
  std::vector<Real> x(size_t(n_t) * d), q(size_t(n_t) * qd), att(size_t(n_t) * qd),
      o(size_t(n_t) * d);
  embed(targets_, x.data());
  // cur: the sets the next layer's sparse part reads; next: this layer's new selection.
  Sets cur(static_cast<size_t>(n_kv), std::vector<std::vector<int32_t>>(size_t(n_t))), next = cur;
  if (is_student) used_sets_.assign(size_t(c.n_layers), cur);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerActs* a = is_student ? &acts_[size_t(l)] : nullptr;
    if (a != nullptr) a->x = x;
    project_qkv(l, x.data(), n_t, n_ctx_, a, q.data());
    if (a != nullptr) a->q = q;
    const bool mix = is_student && l >= 1, select = is_student && l + 1 < c.n_layers;
    if (mix) used_sets_[size_t(l)] = cur;
    attend_targets(l, q.data(), mix ? z + int64_t(l) * n_kv : nullptr, mix ? &cur : nullptr,
                   select ? &next : nullptr, att.data());
    if (select)
      for (int kh = 0; kh < n_kv; ++kh)
        if (l == 0 || !options_.propagate_only_retrieval || z[int64_t(l) * n_kv + kh] > Real(0.5))
          cur[size_t(kh)].swap(next[size_t(kh)]);
    const LayerWeights& w = layers_[size_t(l)];
    linear<Real>(att.data(), w.wo.data(), ptr(w.bo), o.data(), n_t, qd, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    mlp(l, x.data(), n_t, a);
  }
  if (is_student) x_final_ = x;
  std::vector<Real> h(size_t(n_t) * d);
  rmsnorm<Real>(x.data(), output_norm_.data(), h.data(), n_t, d, Real(c.rms_eps));
  if (options_.loss == DistillLoss::kHidden) {
    out = std::move(h);
  } else {
    out.resize(size_t(n_t) * size_t(c.vocab_size));
    linear<Real>(h.data(), lm_head(), nullptr, out.data(), n_t, d, c.vocab_size);
  }
}

template <typename Real>
void CpuStudent<Real>::teacher(std::span<const int32_t> targets) {
  LY_CHECK(n_ctx_ >= 0, ErrorCode::kInvalidArgument, "student: teacher() before set_context()");
  LY_CHECK(!targets.empty(), ErrorCode::kInvalidArgument,
           "student: teacher() needs at least one target token");
  LY_CHECK(int64_t(n_ctx_) + int64_t(targets.size()) <= max_context_, ErrorCode::kCapacity,
           "student: context of {} + {} target tokens exceeds max_context {}", n_ctx_,
           targets.size(), max_context_);
  check_tokens(targets, "target");
  have_teacher_ = false;
  targets_.assign(targets.begin(), targets.end());
  target_pos_.resize(targets_.size());
  for (size_t t = 0; t < targets_.size(); ++t) target_pos_[t] = n_ctx_ + int32_t(t);
  forward_targets(nullptr, teacher_out_);
  used_sets_.clear();
  have_teacher_ = true;
}

template <typename Real>
Real CpuStudent<Real>::student_real(std::span<const Real> z, std::span<Real> dz) {
  const ModelConfig& c = config_;
  const size_t n_gates = size_t(c.n_layers) * size_t(c.n_kv_heads);
  LY_CHECK(have_teacher_, ErrorCode::kInvalidArgument,
           "student: student() before teacher(): run teacher(targets) after set_context()");
  LY_CHECK(z.size() == n_gates, ErrorCode::kInvalidArgument,
           "student: z has {} values, expected n_layers * n_kv_heads = {} * {} = {}", z.size(),
           c.n_layers, c.n_kv_heads, n_gates);
  LY_CHECK(dz.empty() || dz.size() == n_gates, ErrorCode::kInvalidArgument,
           "student: dz has {} values, expected {} (or 0 for the forward only)", dz.size(),
           n_gates);
  for (size_t i = 0; i < z.size(); ++i)
    LY_CHECK(z[i] >= Real(0) && z[i] <= Real(1), ErrorCode::kInvalidArgument,
             "student: z[{}] (layer {}, KV head {}) = {} is outside [0, 1]", i,
             i / size_t(c.n_kv_heads), i % size_t(c.n_kv_heads), double(z[i]));
  forward_targets(z.data(), student_out_);
  const int n_t = n_targets();
  const double scale =
      options_.loss == DistillLoss::kHidden ? 1.0 / (double(n_t) * c.d_model) : 1.0 / double(n_t);
  std::vector<Real> dout(dz.empty() ? 0 : student_out_.size());
  last_loss_ = Real(squared_error<Real>(student_out_.data(), teacher_out_.data(),
                                        int64_t(student_out_.size()), scale,
                                        dz.empty() ? nullptr : dout.data()));
  if (!dz.empty()) backward(z.data(), dout.data(), dz.data());
  return last_loss_;
}

template <typename Real>
double CpuStudent<Real>::student(std::span<const float> z, std::span<float> dz) {
  std::vector<Real> zr(z.begin(), z.end()), dzr(dz.size());
  const Real loss = student_real(zr, dzr);
  std::copy(dzr.begin(), dzr.end(), dz.begin());
  return double(loss);
}

// dloss/dz from dout = dloss/d(student output) [T, vocab] or [T, d], back through every op of
// layers n_layers − 1 … 1 (the selection passes no gradient). Layer 1's gates are the lowest, so
// the pass stops at layer 1's attention; layer 0's entries are 0.
template <typename Real>
void CpuStudent<Real>::backward(const Real* z, const Real* dout, Real* dz) {
  const ModelConfig& c = config_;
  const int n_t = n_targets(), d = c.d_model, ff = c.d_ff, qd = c.q_dim(), kvd = c.kv_dim();
  const int hd = c.head_dim, n_kv = c.n_kv_heads, group = c.group_size();
  const Real eps = Real(c.rms_eps), scale = Real(1) / std::sqrt(Real(hd));
  std::fill(dz, dz + int64_t(c.n_layers) * n_kv, Real(0));
  if (c.n_layers < 2) return;
  std::vector<Real> dx(size_t(n_t) * d), dh(size_t(n_t) * d);
  if (options_.loss == DistillLoss::kHidden)
    std::copy_n(dout, dh.size(), dh.begin());
  else
    linear_backward<Real>(dout, lm_head(), dh.data(), n_t, d, c.vocab_size, false);
  rmsnorm_backward<Real>(x_final_.data(), output_norm_.data(), dh.data(), dx.data(), n_t, d, eps,
                         false);
  std::vector<Real> dm(size_t(n_t) * ff), dg(dm.size()), du(dm.size()), datt(size_t(n_t) * qd),
      dq(datt.size()), dk_head(size_t(n_kv) * n_t * hd), dv_head(dk_head.size()),
      dk(size_t(n_t) * kvd), dv(dk.size());
  for (int l = c.n_layers - 1; l >= 1; --l) {
    const LayerWeights& w = layers_[size_t(l)];
    const LayerActs& a = acts_[size_t(l)];
    // MLP: x3 = x2 + down(silu(gate) · up), gate/up from rmsnorm(x2). dx holds dloss/dx3.
    linear_backward<Real>(dx.data(), w.w_down.data(), dm.data(), n_t, ff, d, false);
    swiglu_backward<Real>(a.gate.data(), a.up.data(), dm.data(), dg.data(), du.data(),
                          int64_t(n_t) * ff);
    linear_backward<Real>(dg.data(), w.w_gate.data(), dh.data(), n_t, d, ff, false);
    linear_backward<Real>(du.data(), w.w_up.data(), dh.data(), n_t, d, ff, true);
    rmsnorm_backward<Real>(a.x2.data(), w.ffn_norm.data(), dh.data(), dx.data(), n_t, d, eps, true);
    // Attention: x2 = x + o(att). dx holds dloss/dx2.
    linear_backward<Real>(dx.data(), w.wo.data(), datt.data(), n_t, qd, d, false);
    std::fill(dq.begin(), dq.end(), Real(0));
    std::fill(dk_head.begin(), dk_head.end(), Real(0));
    std::fill(dv_head.begin(), dv_head.end(), Real(0));
    const Real* zl = z + int64_t(l) * n_kv;
#pragma omp parallel for schedule(dynamic) if (worth_threads(int64_t(n_t) * (n_ctx_ + n_t) * qd))
    for (int kh = 0; kh < n_kv; ++kh) {  // one thread per KV head: its dk, dv rows are its own
      const int64_t off = int64_t(kh) * max_context_ * hd;
      const Real* k = k_[size_t(l)].data() + off;
      const Real* v = v_[size_t(l)].data() + off;
      const int64_t col = int64_t(kh) * group * hd, own = int64_t(kh) * n_t * hd;
      dz[int64_t(l) * n_kv + kh] = attend_mix_group_backward<Real>(
          a.q.data() + col, n_t, group, hd, qd, k, v, n_ctx_,
          used_sets_[size_t(l)][size_t(kh)].data(), scale, zl[kh], datt.data() + col, qd,
          dq.data() + col, dk_head.data() + own, dv_head.data() + own);
    }
    if (l == 1) break;  // nothing below layer 1's attention has a gate
    for (int t = 0; t < n_t; ++t)
      for (int kh = 0; kh < n_kv; ++kh) {
        const int64_t src = (int64_t(kh) * n_t + t) * hd, dst = (int64_t(t) * n_kv + kh) * hd;
        std::copy_n(dk_head.data() + src, hd, dk.data() + dst);
        std::copy_n(dv_head.data() + src, hd, dv.data() + dst);
      }
    rope_backward<Real>(dq.data(), target_pos_.data(), n_t, c.n_heads, hd, inv_freq_.data());
    rope_backward<Real>(dk.data(), target_pos_.data(), n_t, n_kv, hd, inv_freq_.data());
    if (c.qk_norm) {
      rmsnorm_backward<Real>(a.q_pre.data(), w.q_norm.data(), dq.data(), dq.data(), n_t * c.n_heads,
                             hd, eps, false);
      rmsnorm_backward<Real>(a.k_pre.data(), w.k_norm.data(), dk.data(), dk.data(), n_t * n_kv, hd,
                             eps, false);
    }
    linear_backward<Real>(dq.data(), w.wq.data(), dh.data(), n_t, d, qd, false);
    linear_backward<Real>(dk.data(), w.wk.data(), dh.data(), n_t, d, kvd, true);
    linear_backward<Real>(dv.data(), w.wv.data(), dh.data(), n_t, d, kvd, true);
    rmsnorm_backward<Real>(a.x.data(), w.attn_norm.data(), dh.data(), dx.data(), n_t, d, eps, true);
  }
}

template <typename Real>
const std::vector<std::vector<int32_t>>& CpuStudent<Real>::selected(int layer, int kv_head) const {
  LY_CHECK(!used_sets_.empty(), ErrorCode::kInvalidArgument,
           "student: selected() before a student pass");
  LY_CHECK(layer >= 0 && layer < config_.n_layers && kv_head >= 0 && kv_head < config_.n_kv_heads,
           ErrorCode::kInvalidArgument,
           "student: selected(layer {}, KV head {}) is outside {} layers x {} KV heads", layer,
           kv_head, config_.n_layers, config_.n_kv_heads);
  return used_sets_[size_t(layer)][size_t(kv_head)];
}

template class CpuStudent<float>;
template class CpuStudent<double>;

}  // namespace lychee::train
