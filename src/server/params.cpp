#include "server/params.h"

#include <random>

#include "core/error.h"
#include "model/chat_template.h"
#include "runtime/generate.h"

#ifndef LYCHEE_VERSION_STRING
#define LYCHEE_VERSION_STRING "unknown"
#endif

namespace lychee::server {

PolicySettings apply_overrides(PolicySettings s, const PolicyOverrides& o) {
  if (o.policy) s.policy = *o.policy;
  if (o.budget) s.budget = *o.budget;
  if (o.block_size) s.block_size = *o.block_size;
  if (o.select) s.select = *o.select;
  if (o.select_value) s.select_value = *o.select_value;
  if (o.sink) s.sink = *o.sink;
  if (o.recent) s.recent = *o.recent;
  if (o.tidal_layers) s.tidal_layers = *o.tidal_layers;
  if (o.quest_page) s.quest_page = *o.quest_page;
  if (o.duo_sink) s.duo_sink = *o.duo_sink;
  if (o.duo_recent) s.duo_recent = *o.duo_recent;
  if (o.speculate) s.speculate = *o.speculate;
  return s;
}

namespace {

std::vector<int32_t> tokenize_prompt(const CompletionRequest& req, const Tokenizer& tok) {
  if (req.endpoint == Endpoint::kChat) {
    std::vector<ChatMessage> messages;
    for (const ChatMessageIn& m : req.messages) messages.push_back({m.role, m.content});
    try {
      return encode_chat(tok, messages);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "messages");
    }
  }
  if (req.prompt_is_ids) {
    for (size_t i = 0; i < req.prompt_ids.size(); ++i)
      if (req.prompt_ids[i] >= tok.vocab_size())
        throw ApiError(400, fmt::format("'prompt[{}]': token id {} is outside the vocabulary of {} tokens", i,
                                        req.prompt_ids[i], tok.vocab_size()),
                       "prompt");
    return req.prompt_ids;
  }
  // Special tokens in a raw prompt are text, as OpenAI's API treats them.
  return tok.encode(req.prompt, tok.add_bos_default(), false);
}

}  // namespace

std::string system_fingerprint(const Engine& engine, const std::string& settings) {
  const ModelConfig& c = engine.config();
  const std::string what = fmt::format(
      "lychee {}|{}|{}|layers {} d {} heads {}/{} vocab {}|{}|page {}|kv {}|{}", LYCHEE_VERSION_STRING,
      engine.checkpoint().path(), c.n_params(), c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.vocab_size,
      engine.device(), engine.kv_page_tokens(), kv_cache_dtype_name(engine.kv_cache_dtype()), settings);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : what) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return fmt::format("fp_{:016x}", h);
}

GenerationParams make_params(const CompletionRequest& req, const ServerModel& model) {
  const Engine& engine = *model.engine;
  if (!req.model.empty() && req.model != model.id)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", req.model, model.id),
                   "model", "model_not_found");
  GenerationParams p;
  p.prompt = tokenize_prompt(req, engine.tokenizer());
  const char* prompt_field = req.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (p.prompt.empty()) throw ApiError(400, fmt::format("'{}': the prompt has no tokens", prompt_field), prompt_field);
  try {
    check_prompt_fits(int64_t(p.prompt.size()), model.context);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), prompt_field, "context_length_exceeded");
  }
  // Every generated token but the last is fed: the sequence holds prompt + max_tokens - 1.
  const int room = model.context - int(p.prompt.size()) + 1;
  p.max_tokens = req.max_tokens ? std::min(*req.max_tokens, room) : room;
  p.sampling.temperature = req.temperature;
  p.sampling.top_k = req.top_k;
  p.sampling.top_p = req.top_p;
  p.sampling.seed = req.seed ? *req.seed : std::random_device{}();
  p.stop = req.stop;
  p.logprobs = req.logprobs;
  p.top_logprobs = req.top_logprobs;
  p.ignore_eos = req.ignore_eos;
  p.seeded = req.seed.has_value();
  p.cache_salt = req.cache_salt;
  try {
    const PolicySettings settings = apply_overrides(model.defaults, req.lychee);
    p.policy = settings.options(engine.config());
    p.speculate = parse_speculate(settings.speculate, "lychee.speculate");
    // The draft's logits are not the answer's: a speculating request reports no logprobs.
    LY_CHECK(!p.speculate.enabled() || !p.logprobs, ErrorCode::kInvalidArgument,
             "speculate does not combine with logprobs (ask for one or the other)");
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("'lychee': {}", e.what()), "lychee");
  }
  return p;
}

}  // namespace lychee::server
