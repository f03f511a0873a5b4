#include "eval/head_overlap.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention/policies.h"
#include "attention/selection.h"
#include "core/error.h"
#include "model/chat_template.h"
#include "runtime/sampler.h"

namespace lychee {

namespace {

// out[t] = q·k_t (double accumulation) for the first out.size() tokens of one KV head's cache.
void dot_scores(const float* q, const float* k, int head_dim, std::span<double> out) {
  for (size_t t = 0; t < out.size(); ++t) {
    double dot = 0.0;
    for (int i = 0; i < head_dim; ++i) dot += double(q[i]) * double(k[t * size_t(head_dim) + size_t(i)]);
    out[t] = dot;
  }
}

// A dense policy that, in the one decode step it sees, records each query head's top-k positions
// by q·k (softmax is monotonic, so the same order as the attention scores) over the tokens before
// the current one.
class TopkRecorder final : public AttentionPolicy {
 public:
  TopkRecorder(const ModelConfig& c, int k) : c_(c), spec_(full_spec(c)), k_(k) {
    topk_.assign(size_t(c.n_layers), std::vector<std::vector<int32_t>>(size_t(c.n_heads)));
  }
  std::string name() const override { return "top-k recorder"; }
  const DecodeSpec& spec() const override { return spec_; }
  void reset() override {}
  void begin_step(int) override {}
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead>) override {
    const int group = c_.n_heads / c_.n_kv_heads, hd = kv.head_dim, n = kv.length - 1;
    std::vector<double> s(static_cast<size_t>(n));
    std::vector<int32_t> idx(static_cast<size_t>(n));
    for (int h = 0; h < c_.n_heads; ++h) {
      dot_scores(q + size_t(h) * size_t(hd), kv.k_head(h / group), hd, s);
      std::iota(idx.begin(), idx.end(), 0);
      const size_t m = std::min(size_t(k_), idx.size());
      std::partial_sort(idx.begin(), idx.begin() + long(m), idx.end(), [&](int32_t a, int32_t b) {
        return s[size_t(a)] != s[size_t(b)] ? s[size_t(a)] > s[size_t(b)] : a < b;
      });
      topk_[size_t(layer)][size_t(h)].assign(idx.begin(), idx.begin() + long(m));
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> take() { return std::move(topk_); }

 private:
  const ModelConfig& c_;
  DecodeSpec spec_;
  int k_;
  std::vector<std::vector<std::vector<int32_t>>> topk_;
};

}  // namespace

HeadOverlap head_topk_overlap(Engine& engine, const std::string& prompt, int k, bool chat) {
  LY_CHECK(engine.device() == "cpu", ErrorCode::kUnsupported,
           "head overlap reads q and K through the CPU reference's policy hook: run it with --device cpu");
  LY_CHECK(k >= 1, ErrorCode::kInvalidArgument, "top-k overlap: k must be >= 1, got {}", k);
  const ModelConfig& c = engine.config();
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<int32_t> ids =
      chat ? encode_chat(tok, {{"user", prompt}}) : tok.encode(prompt, tok.add_bos_default(), true);
  LY_CHECK(int(ids.size()) >= k, ErrorCode::kInvalidArgument,
           "top-k overlap: the prompt has {} tokens, fewer than k = {}", ids.size(), k);
  std::unique_ptr<Session> s = engine.new_session(int(ids.size()) + 1);
  s->feed(ids);
  Sampler greedy(SamplingParams{});
  HeadOverlap r;
  r.prompt = prompt;
  r.answer_token = s->sample(greedy);
  r.answer = r.answer_token < tok.vocab_size() ? tok.token_piece(r.answer_token) : std::string();
  r.k = k;
  r.n_layers = c.n_layers;
  r.n_heads = c.n_heads;
  r.context = int(ids.size());
  TopkRecorder rec(c, k);
  s->set_policy(&rec);
  s->feed(std::span<const int32_t>(&r.answer_token, 1));  // one decode step: the recorder sees every layer
  r.topk = rec.take();
  r.overlap.assign(size_t(c.n_layers - 1) * size_t(c.n_heads), 0.0f);
  for (int l = 0; l + 1 < c.n_layers; ++l)
    for (int h = 0; h < c.n_heads; ++h) {
      const auto& a = r.topk[size_t(l)][size_t(h)];
      const auto& b = r.topk[size_t(l + 1)][size_t(h)];
      int common = 0;
      for (int32_t t : a) common += std::find(b.begin(), b.end(), t) != b.end() ? 1 : 0;
      r.overlap[size_t(l) * size_t(c.n_heads) + size_t(h)] = a.empty() ? 0.0f : float(common) / float(a.size());
    }
  return r;
}

namespace {

class QuestRecorder final : public AttentionPolicy {
 public:
  QuestRecorder(const ModelConfig& c, int page, int budget, int dense_layers)
      : recall_(size_t(c.n_layers), 0.0), mass_(size_t(c.n_layers), 0.0), c_(c), spec_(full_spec(c)), page_(page),
        budget_(budget), dense_(dense_layers) {}
  std::string name() const override { return "quest check"; }
  const DecodeSpec& spec() const override { return spec_; }
  void reset() override {}
  void begin_step(int) override {}
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead>) override {
    if (layer < dense_) return;
    const int group = c_.n_heads / c_.n_kv_heads, d = kv.head_dim, n = kv.length;
    const int n_pages = (n + page_ - 1) / page_, K = std::min(n_pages, std::max(1, budget_ / page_));
    // Quest's metadata: channel-wise min and max of each page's keys, once per KV head.
    std::vector<float> mn(size_t(n_pages) * size_t(d)), mx(size_t(n_pages) * size_t(d));
    SelectParams top;  // top-k pages, the last one always: Quest's rule, for both rankings
    top.budget = K * page_;
    std::vector<float> exact(static_cast<size_t>(n_pages)), bound(static_cast<size_t>(n_pages));
    std::vector<double> s(static_cast<size_t>(n)), page_mass(static_cast<size_t>(n_pages));
    double rec = 0.0, mass = 0.0;
    for (int h = 0; h < c_.n_heads; ++h) {
      const float* qh = q + size_t(h) * size_t(d);
      const float* k = kv.k_head(h / group);
      if (h % group == 0) {
        std::fill(mn.begin(), mn.end(), INFINITY);
        std::fill(mx.begin(), mx.end(), -INFINITY);
        for (int t = 0; t < n; ++t)
          for (int i = 0; i < d; ++i) {
            const size_t at = size_t(t / page_) * size_t(d) + size_t(i);
            mn[at] = std::min(mn[at], k[size_t(t) * size_t(d) + size_t(i)]);
            mx[at] = std::max(mx[at], k[size_t(t) * size_t(d) + size_t(i)]);
          }
      }
      dot_scores(qh, k, d, s);
      double smax = -INFINITY;
      for (double& v : s) smax = std::max(smax, v /= std::sqrt(double(d)));
      double z = 0.0;
      std::fill(page_mass.begin(), page_mass.end(), 0.0);
      std::fill(exact.begin(), exact.end(), -INFINITY);
      for (int t = 0; t < n; ++t) {
        const double p = std::exp(s[size_t(t)] - smax);
        z += p;
        page_mass[size_t(t / page_)] += p;
        exact[size_t(t / page_)] = std::max(exact[size_t(t / page_)], float(s[size_t(t)]));
      }
      for (int pg = 0; pg < n_pages; ++pg)
        bound[size_t(pg)] = quest_page_bound(qh, &mn[size_t(pg) * size_t(d)], &mx[size_t(pg) * size_t(d)], d);
      const std::vector<int32_t> a = select_units(bound, page_, n, top, 1.0f),
                                 b = select_units(exact, page_, n, top, 1.0f);
      int common = 0;
      double ma = 0.0, mb = 0.0;
      for (int32_t pg : a) {
        common += std::binary_search(b.begin(), b.end(), pg) ? 1 : 0;
        ma += page_mass[size_t(pg)] / z;
      }
      for (int32_t pg : b) mb += page_mass[size_t(pg)] / z;
      rec += double(common) / double(K);
      mass += mb > 0.0 ? ma / mb : 1.0;
    }
    recall_[size_t(layer)] = rec / c_.n_heads;
    mass_[size_t(layer)] = mass / c_.n_heads;
  }
  std::vector<double> recall_, mass_;

 private:
  const ModelConfig& c_;
  DecodeSpec spec_;
  int page_, budget_, dense_;
};

}  // namespace

QuestCheck quest_against_exact(Engine& engine, std::span<const int32_t> prompt_ids, int page, int budget,
                               int dense_layers) {
  LY_CHECK(engine.device() == "cpu", ErrorCode::kUnsupported,
           "the Quest check reads q and K through the CPU reference's policy hook: run it with --device cpu");
  LY_CHECK(page >= 1 && budget >= page && dense_layers >= 0 && !prompt_ids.empty(), ErrorCode::kInvalidArgument,
           "Quest check: page {} and budget {} (>= page), dense layers {} and a prompt are needed", page, budget,
           dense_layers);
  const ModelConfig& c = engine.config();
  std::unique_ptr<Session> s = engine.new_session(int(prompt_ids.size()) + 1);
  s->feed(prompt_ids);
  Sampler greedy(SamplingParams{});
  QuestCheck r;
  r.answer_token = s->sample(greedy);
  r.context = int(prompt_ids.size());
  QuestRecorder rec(c, page, budget, dense_layers);
  s->set_policy(&rec);
  s->feed(std::span<const int32_t>(&r.answer_token, 1));
  r.recall = std::move(rec.recall_);
  r.mass = std::move(rec.mass_);
  return r;
}

const std::vector<std::string>& paper_overlap_prompts() {
  static const std::vector<std::string> prompts = {
      "Please directly output the final answer based on the given question. Question: In a world containing only "
      "squares, circles, and triangles, one shape is defined by having no angles and being perfectly symmetrical from "
      "every point on its perimeter. What is the single name of the only shape that fits this description? Answer:",
      "Please directly output the final answer based on the given question. Question: There are only two kinds of "
      "fruit in a box: apples and bananas. All apples are sour, and all bananas are sweet. I took a fruit from the box "
      "and tasted it. It was sweet. What is this fruit? Answer:",
      "Please directly output the final answer based on the given question. Question: If you walk 10 meters north "
      "from a starting point, then 10 meters east, and finally 10 meters west, what direction are you from the "
      "original position? Answer:",
      "Please directly output the final answer based on the given question. Question: You start facing east. You "
      "turn left 90 degrees, then turn right 180 degrees, and finally turn left 90 degrees. What direction are you "
      "facing now? Answer:",
      "Please directly output the final answer based on the given question. Question: If two days ago was Monday, "
      "what day is tomorrow? Answer:",
  };
  return prompts;
}

}  // namespace lychee
