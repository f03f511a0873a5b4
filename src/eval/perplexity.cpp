#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace lychee {

namespace {

// log-softmax of a logit row in double.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, double(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
}

double kl_of_log_probs(const std::vector<double>& lp, const std::vector<double>& lq) {
  double kl = 0.0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for equal rows
}

}  // namespace

double kl_of_logits(std::span<const float> p_logits, std::span<const float> q_logits) {
  LY_CHECK(p_logits.size() == q_logits.size() && !p_logits.empty(), ErrorCode::kInvalidArgument,
           "KL of logit rows of {} and {} entries", p_logits.size(), q_logits.size());
  std::vector<double> lp, lq;
  log_softmax(p_logits, lp);
  log_softmax(q_logits, lq);
  return kl_of_log_probs(lp, lq);
}

PerplexityResult compare_perplexity(Session& base, Session& test, std::span<const int32_t> tokens, int ctx,
                                    int max_windows, const std::function<void(const std::string&)>& progress) {
  LY_CHECK(ctx >= 4, ErrorCode::kInvalidArgument, "--ctx: a window needs at least 4 tokens, got {}", ctx);
  LY_CHECK(max_windows >= 1, ErrorCode::kInvalidArgument, "--windows: must be >= 1, got {}", max_windows);
  const int n_windows = std::min<int64_t>(max_windows, int64_t(tokens.size()) / ctx);
  LY_CHECK(n_windows >= 1, ErrorCode::kInvalidArgument,
           "the text has {} tokens, less than one window of --ctx {}", tokens.size(), ctx);
  LY_CHECK(base.capacity() >= ctx && test.capacity() >= ctx, ErrorCode::kInvalidArgument,
           "sessions hold {} and {} tokens, less than a window of {}", base.capacity(), test.capacity(), ctx);
  // The two sessions step in turn: each one's logits must survive the other's step (they may share
  // one GPU runner, whose logits rows the next forward pass overwrites).
  struct KeepLogits {
    Session &a, &b;
    KeepLogits(Session& x, Session& y) : a(x), b(y) { a.keep_logits(true), b.keep_logits(true); }
    ~KeepLogits() { a.keep_logits(false), b.keep_logits(false); }
  } keep(base, test);
  PerplexityResult r;
  r.windows = n_windows;
  std::vector<double> kls, lb, lt;
  double nll_base = 0.0, nll_test = 0.0;
  int64_t agree = 0;
  const int half = ctx / 2;
  for (int w = 0; w < n_windows; ++w) {
    const std::span<const int32_t> win = tokens.subspan(size_t(w) * size_t(ctx), size_t(ctx));
    base.truncate(0);
    test.truncate(0);
    base.feed(win.first(size_t(half)));
    test.feed(win.first(size_t(half)));
    double window_kl = 0.0;
    for (int i = half; i < ctx; ++i) {  // logits now predict win[i]
      log_softmax(base.logits(), lb);
      log_softmax(test.logits(), lt);
      LY_CHECK(lb.size() == lt.size(), ErrorCode::kInvalidArgument,
               "the two configurations have vocabularies of {} and {} tokens", lb.size(), lt.size());
      nll_base -= lb[size_t(win[size_t(i)])];
      nll_test -= lt[size_t(win[size_t(i)])];
      kls.push_back(kl_of_log_probs(lb, lt));
      window_kl += kls.back();
      agree += std::max_element(lb.begin(), lb.end()) - lb.begin() == std::max_element(lt.begin(), lt.end()) - lt.begin();
      if (i + 1 < ctx) {
        base.feed(win.subspan(size_t(i), 1));
        test.feed(win.subspan(size_t(i), 1));
      }
    }
    if (progress)
      progress(fmt::format("window {}/{}: mean KL {:.5f} nats over {} tokens", w + 1, n_windows,
                           window_kl / (ctx - half), ctx - half));
  }
  r.scored = int64_t(kls.size());
  r.base_ppl = std::exp(nll_base / double(r.scored));
  r.test_ppl = std::exp(nll_test / double(r.scored));
  double sum = 0.0;
  for (double k : kls) sum += k;
  r.mean_kl = sum / double(r.scored);
  std::sort(kls.begin(), kls.end());
  r.max_kl = kls.back();
  r.p99_kl = kls[std::min(kls.size() - 1, size_t(std::ceil(0.99 * double(kls.size()))) - 1)];
  r.top1_agree = double(agree) / double(r.scored);
  return r;
}

}  // namespace lychee
