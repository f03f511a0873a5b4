#include "eval/role_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "eval/coverage.h"
#include "eval/tasks.h"
#include "model/chat_template.h"
#include "runtime/sampler.h"

namespace lychee {

namespace {

// Wraps the policy; in the one decode step it sees, adds each query head's attention over the
// context to the sums of its role.
class RoleRecorder final : public AttentionPolicy {
 public:
  RoleRecorder(AttentionPolicy& inner, int context) : inner_(inner), context_(context) {
    retrieval_.assign(size_t(context), 0.0);
    sparse_.assign(size_t(context), 0.0);
    sparse_full_.assign(size_t(context), 0.0);
  }
  std::string name() const override { return inner_.name(); }
  const DecodeSpec& spec() const override { return inner_.spec(); }
  void reset() override { inner_.reset(); }
  void begin_step(int n_ctx) override { inner_.begin_step(n_ctx); }
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override {
    inner_.plan_layer(layer, q, kv, reads);
    const DecodeSpec& s = inner_.spec();
    const float scale = 1.0f / std::sqrt(float(kv.head_dim));
    std::vector<double> p(size_t(kv.length));
    for (size_t h = 0; h < reads.size(); ++h) {
      head_softmax(q + h * size_t(kv.head_dim), kv.k_head(int(h) / s.group), kv.head_dim, scale, p);
      if (reads[h].dense) {
        for (int t = 0; t < context_; ++t) retrieval_[size_t(t)] += p[size_t(t)];
        ++n_retrieval_;
        continue;
      }
      double kept = 0.0;
      for (int32_t t : reads[h].tokens) kept += p[size_t(t)];
      for (int32_t t : reads[h].tokens)
        if (t < context_) sparse_[size_t(t)] += p[size_t(t)] / kept;
      for (int t = 0; t < context_; ++t) sparse_full_[size_t(t)] += p[size_t(t)];
      ++n_sparse_;
    }
  }
  void finish(RoleAttention& r) const {
    r.n_retrieval = n_retrieval_;
    r.n_sparse = n_sparse_;
    r.retrieval = retrieval_;
    r.sparse = sparse_;
    for (double& v : r.retrieval) v /= std::max(1, n_retrieval_);
    for (double& v : r.sparse) v /= std::max(1, n_sparse_);
    for (int32_t t : r.distractor) {
      r.retrieval_distractor += r.retrieval[size_t(t)];
      r.sparse_distractor += r.sparse[size_t(t)];
      r.full_distractor_sparse_heads += sparse_full_[size_t(t)] / std::max(1, n_sparse_);
    }
  }

 private:
  AttentionPolicy& inner_;
  int context_;
  std::vector<double> retrieval_, sparse_, sparse_full_;
  int n_retrieval_ = 0, n_sparse_ = 0;
};

}  // namespace

RoleAttention attention_by_role(Engine& engine, const std::string& prompt, const std::string& distractor,
                                AttentionPolicy& policy, bool chat) {
  LY_CHECK(engine.device() == "cpu", ErrorCode::kUnsupported,
           "the role attention reads q and K through the CPU reference's policy hook: run it with --device cpu");
  const Tokenizer& tok = engine.tokenizer();
  const std::string text =
      chat ? render_chat(tok, {{"user", prompt}}) : prompt;
  const size_t at = text.find(distractor);
  LY_CHECK(!distractor.empty(), ErrorCode::kInvalidArgument,
           "--distractor: no passage given (with --prompt, pass the irrelevant passage as it occurs in the prompt)");
  LY_CHECK(at != std::string::npos, ErrorCode::kInvalidArgument, "--distractor: '{}' does not occur in the prompt",
           distractor);
  const bool bos = !chat && tok.add_bos_default();  // the chat template writes its own start
  const std::vector<int32_t> ids = tok.encode(text, bos, true);
  RoleAttention r;
  r.context = int(ids.size());
  const TokenSpan span = token_span(tok, text, at, distractor.size(), bos);
  for (size_t t = span.first; t < std::min(span.end, ids.size()); ++t) r.distractor.push_back(int32_t(t));
  for (int32_t id : ids) r.pieces.push_back(tok.token_piece(id));
  std::unique_ptr<Session> s = engine.new_session(r.context + 1);
  s->feed(ids);
  Sampler greedy(SamplingParams{});
  r.answer_token = s->sample(greedy);
  r.answer = tok.token_piece(r.answer_token);
  RoleRecorder rec(policy, r.context);
  s->set_policy(&rec);
  s->feed(std::span<const int32_t>(&r.answer_token, 1));  // one decode step through the policy
  rec.finish(r);
  return r;
}

const std::string& denoise_prompt() {
  static const std::string p =
      "Read the facts and answer the question.\n"
      "Tom is taller than Sam. Sam is taller than Ben. The old lighthouse on the West coast was painted red "
      "by the fishermen of the town last summer. Ben is taller than Max.\n"
      "Question: who is the shortest of the four? Answer with one name.";
  return p;
}

const std::string& denoise_distractor() {
  static const std::string d =
      "The old lighthouse on the West coast was painted red by the fishermen of the town last summer.";
  return d;
}

}  // namespace lychee
