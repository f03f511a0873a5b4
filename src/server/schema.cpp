#include "server/schema.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/speculative.h"

namespace lychee::server {

using nlohmann::json;

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  switch (status_) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 503: return "unavailable_error";
    default: return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

json ApiError::body() const {
  json e = {{"message", what()}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) e["param"] = param_;
  if (!code_.empty()) e["code"] = code_;
  return json{{"error", e}};
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw ApiError(400, fmt::format("'{}': {}", field, message), field);
}

// A value's JSON type in words, for messages.
std::string kind(const json& v) {
  if (v.is_number_integer()) return fmt::format("the integer {}", dump_json(v));
  if (v.is_number()) return fmt::format("the number {}", dump_json(v));
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// The field when present and not null.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t as_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  const std::string range = hi == std::numeric_limits<int64_t>::max() ? fmt::format(">= {}", lo)
                                                                       : fmt::format("from {} to {}", lo, hi);
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) bad(name, fmt::format("must be an integer {}, got {}", range, u));
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    bad(name, fmt::format("must be an integer {}, got {}", range, kind(v)));
  }
  if (x < lo || x > hi) bad(name, fmt::format("must be an integer {}, got {}", range, x));
  return x;
}

double as_number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad(name, fmt::format("must be a number from {} to {}, got {}", lo, hi, kind(v)));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad(name, fmt::format("must be a number from {} to {}, got {}", lo, hi, x));
  return x;
}

bool as_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, fmt::format("must be a boolean, got {}", kind(v)));
  return v.get<bool>();
}

std::string as_string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, fmt::format("must be a string, got {}", kind(v)));
  return v.get<std::string>();
}

std::string one_of(const json& v, const std::string& name, std::initializer_list<const char*> names) {
  const std::string s = as_string(v, name);
  std::string list;
  for (const char* n : names) {
    if (s == n) return s;
    list += list.empty() ? n : fmt::format(", {}", n);
  }
  bad(name, fmt::format("must be one of {}, got '{}'", list, s));
}

json parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", kind(j)));
  return j;
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined).
std::string message_content(const json& v, const std::string& name) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(name, fmt::format("must be a string or an array of text parts, got {}", kind(v)));
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = fmt::format("{}[{}]", name, i);
    if (!v[i].is_object()) bad(part, fmt::format("must be an object, got {}", kind(v[i])));
    const json* type = field(v[i], "type");
    if (type == nullptr) bad(part + ".type", "is missing");
    if (as_string(*type, part + ".type") != "text")
      bad(part + ".type", fmt::format("only 'text' parts are supported, got '{}'", type->get<std::string>()));
    const json* t = field(v[i], "text");
    if (t == nullptr) bad(part + ".text", "is missing");
    text += as_string(*t, part + ".text");
  }
  return text;
}

std::vector<ChatMessageIn> parse_messages(const json& obj) {
  const json* m = field(obj, "messages");
  if (m == nullptr) bad("messages", "is missing");
  if (!m->is_array()) bad("messages", fmt::format("must be an array of messages, got {}", kind(*m)));
  if (m->empty()) bad("messages", "must hold at least one message");
  std::vector<ChatMessageIn> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const std::string name = fmt::format("messages[{}]", i);
    const json& msg = (*m)[i];
    if (!msg.is_object()) bad(name, fmt::format("must be an object, got {}", kind(msg)));
    const json* role = field(msg, "role");
    if (role == nullptr) bad(name + ".role", "is missing");
    ChatMessageIn in;
    in.role = one_of(*role, name + ".role", {"system", "developer", "user", "assistant", "tool"});
    if (in.role == "developer") in.role = "system";  // OpenAI's newer name for the system role
    const json* content = field(msg, "content");
    if (content == nullptr) bad(name + ".content", "is missing");
    in.content = message_content(*content, name + ".content");
    out.push_back(std::move(in));
  }
  return out;
}

void parse_prompt(const json& obj, CompletionRequest& r) {
  const json* p = field(obj, "prompt");
  if (p == nullptr) bad("prompt", "is missing");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    if (r.prompt.empty()) bad("prompt", "must not be empty");
    return;
  }
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {  // a batch of one prompt
    r.prompt = (*p)[0].get<std::string>();
    if (r.prompt.empty()) bad("prompt", "must not be empty");
    return;
  }
  if (!p->is_array()) bad("prompt", fmt::format("must be a string or an array of token ids, got {}", kind(*p)));
  if (p->empty()) bad("prompt", "must not be empty");
  r.prompt_is_ids = true;
  for (size_t i = 0; i < p->size(); ++i) {
    if ((*p)[i].is_string() || (*p)[i].is_array())
      bad("prompt", "only one prompt per request is supported (a string or one array of token ids)");
    r.prompt_ids.push_back(int32_t(as_int((*p)[i], fmt::format("prompt[{}]", i), 0, std::numeric_limits<int32_t>::max())));
  }
}

void parse_stop(const json& obj, CompletionRequest& r) {
  const json* s = field(obj, "stop");
  if (s == nullptr) return;
  if (s->is_string()) {
    if (!s->get<std::string>().empty()) r.stop.push_back(s->get<std::string>());
    return;
  }
  if (!s->is_array()) bad("stop", fmt::format("must be a string or an array of strings, got {}", kind(*s)));
  if (s->size() > 16) bad("stop", fmt::format("at most 16 stop strings, got {}", s->size()));
  for (size_t i = 0; i < s->size(); ++i) {
    std::string t = as_string((*s)[i], fmt::format("stop[{}]", i));
    if (!t.empty()) r.stop.push_back(std::move(t));
  }
}

void parse_lychee(const json& obj, PolicyOverrides& o) {
  const json* l = field(obj, "lychee");
  if (l == nullptr) return;
  if (!l->is_object()) bad("lychee", fmt::format("must be an object, got {}", kind(*l)));
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  auto int_field = [&](const char* name, std::optional<int>& out, int64_t lo) {
    if (const json* v = field(*l, name)) out = int(as_int(*v, fmt::format("lychee.{}", name), lo, kMax));
  };
  if (const json* v = field(*l, "policy")) o.policy = one_of(*v, "lychee.policy", {"full", "lychee", "tidal", "quest", "duo"});
  int_field("budget", o.budget, 1);
  int_field("block_size", o.block_size, 1);
  if (const json* v = field(*l, "select")) o.select = one_of(*v, "lychee.select", {"topk", "topp", "threshold", "ratio"});
  if (const json* v = field(*l, "select_value")) o.select_value = as_number(*v, "lychee.select_value", 0.0, 1e9);
  int_field("sink", o.sink, 0);
  int_field("recent", o.recent, 0);
  int_field("quest_page", o.quest_page, 1);
  int_field("duo_sink", o.duo_sink, 0);
  int_field("duo_recent", o.duo_recent, 1);
  if (const json* v = field(*l, "speculate")) {
    // A count (0..16) or "auto"/"off": checked here so the 400 names the field.
    std::string text;
    if (v->is_number_integer()) text = std::to_string(as_int(*v, "lychee.speculate", 0, kMaxSpeculate));
    else if (v->is_string()) text = v->get<std::string>();
    else bad("lychee.speculate", fmt::format("must be a count of drafted tokens or \"auto\", got {}", kind(*v)));
    try {
      parse_speculate(text, "lychee.speculate");
    } catch (const Error& e) {
      bad("lychee.speculate", e.what());
    }
    o.speculate = text;
  }
  if (const json* v = field(*l, "tidal_layers")) {
    if (!v->is_array()) bad("lychee.tidal_layers", fmt::format("must be an array of layer indices, got {}", kind(*v)));
    std::vector<int> layers;
    for (size_t i = 0; i < v->size(); ++i)
      layers.push_back(int(as_int((*v)[i], fmt::format("lychee.tidal_layers[{}]", i), 0, 1 << 16)));
    o.tidal_layers = layers;
  }
}

// The fields chat and completion share.
void parse_common(const json& obj, CompletionRequest& r) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (const json* v = field(obj, "model")) r.model = as_string(*v, "model");
  if (const json* v = field(obj, "max_tokens")) r.max_tokens = int(as_int(*v, "max_tokens", 1, kMax));
  if (const json* v = field(obj, "max_completion_tokens"))
    r.max_tokens = int(as_int(*v, "max_completion_tokens", 1, kMax));
  if (const json* v = field(obj, "temperature")) r.temperature = float(as_number(*v, "temperature", 0.0, 2.0));
  if (const json* v = field(obj, "top_p")) {
    r.top_p = float(as_number(*v, "top_p", 0.0, 1.0));
    if (r.top_p == 0.0f) r.top_p = 1e-6f;  // 0 keeps only the most likely token
  }
  if (const json* v = field(obj, "top_k")) r.top_k = int(as_int(*v, "top_k", 0, kMax));
  if (const json* v = field(obj, "seed")) {
    if (v->is_number_unsigned()) r.seed = v->get<uint64_t>();
    else r.seed = uint64_t(as_int(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  }
  if (const json* v = field(obj, "n")) {
    const int64_t n = as_int(*v, "n", 1, kMax);
    if (n != 1) bad("n", fmt::format("only n = 1 is supported, got {}", n));
  }
  if (const json* v = field(obj, "best_of")) {
    const int64_t n = as_int(*v, "best_of", 1, kMax);
    if (n != 1) bad("best_of", fmt::format("only best_of = 1 is supported, got {}", n));
  }
  if (const json* v = field(obj, "stream")) r.stream = as_bool(*v, "stream");
  if (const json* v = field(obj, "cache_salt")) {
    r.cache_salt = as_string(*v, "cache_salt");
    if (r.cache_salt.empty()) bad("cache_salt", "must be a non-empty string when given");
    if (r.cache_salt.size() > 1024) bad("cache_salt", fmt::format("is {} bytes; at most 1024", r.cache_salt.size()));
  }
  if (const json* v = field(obj, "ignore_eos")) r.ignore_eos = as_bool(*v, "ignore_eos");
  if (const json* v = field(obj, "stream_options")) {
    if (!v->is_object()) bad("stream_options", fmt::format("must be an object, got {}", kind(*v)));
    if (const json* u = field(*v, "include_usage")) r.include_usage = as_bool(*u, "stream_options.include_usage");
  }
  if (const json* v = field(obj, "user")) as_string(*v, "user");  // accepted and ignored
  parse_stop(obj, r);
  parse_lychee(obj, r.lychee);
}

}  // namespace

CompletionRequest parse_chat_request(std::string_view body) {
  const json obj = parse_object(body);
  CompletionRequest r;
  r.endpoint = Endpoint::kChat;
  r.messages = parse_messages(obj);
  parse_common(obj, r);
  if (const json* v = field(obj, "logprobs")) r.logprobs = as_bool(*v, "logprobs");
  if (const json* v = field(obj, "top_logprobs")) {
    r.top_logprobs = int(as_int(*v, "top_logprobs", 0, 20));
    if (!r.logprobs && r.top_logprobs > 0) bad("top_logprobs", "needs 'logprobs': true");
  }
  return r;
}

CompletionRequest parse_completion_request(std::string_view body) {
  const json obj = parse_object(body);
  CompletionRequest r;
  r.endpoint = Endpoint::kCompletion;
  parse_prompt(obj, r);
  parse_common(obj, r);
  // The legacy API's logprobs is the number of alternatives (0..5) to return per token.
  if (const json* v = field(obj, "logprobs")) {
    if (v->is_boolean()) {
      r.logprobs = v->get<bool>();
    } else {
      r.top_logprobs = int(as_int(*v, "logprobs", 0, 20));
      r.logprobs = true;
    }
  }
  if (const json* v = field(obj, "echo"))
    if (as_bool(*v, "echo")) bad("echo", "echo = true is not supported");
  if (const json* v = field(obj, "suffix")) as_string(*v, "suffix");
  return r;
}

CompletionRequest parse_request(Endpoint endpoint, std::string_view body) {
  return endpoint == Endpoint::kChat ? parse_chat_request(body) : parse_completion_request(body);
}

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const json obj = parse_object(body);
  TokenizeRequest r;
  const json* c = field(obj, "content");
  if (c == nullptr) bad("content", "is missing");
  r.content = as_string(*c, "content");
  if (const json* v = field(obj, "add_special")) r.add_special = as_bool(*v, "add_special");
  return r;
}

std::vector<int32_t> parse_detokenize_request(std::string_view body) {
  const json obj = parse_object(body);
  const json* t = field(obj, "tokens");
  if (t == nullptr) bad("tokens", "is missing");
  if (!t->is_array()) bad("tokens", fmt::format("must be an array of token ids, got {}", kind(*t)));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t->size(); ++i)
    ids.push_back(int32_t(as_int((*t)[i], fmt::format("tokens[{}]", i), 0, std::numeric_limits<int32_t>::max())));
  return ids;
}

// --- responses ---------------------------------------------------------------------------------

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
json chat_logprobs(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    json top = json::array();
    for (const TopLogprob& a : t.top) top.push_back({{"token", a.token}, {"logprob", a.logprob}, {"bytes", bytes_of(a.token)}});
    content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

// completion (legacy): parallel arrays; text_offset counts bytes from the start of the text.
json completion_logprobs(const std::vector<TokenLogprob>& lps, size_t offset0) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = offset0;
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const TopLogprob& a : t.top) top[a.token] = a.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json usage_json(const Usage& u) {
  json j{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.speculated)
    j["speculation"] = {{"drafted", u.drafted},
                        {"accepted", u.accepted},
                        {"acceptance", u.drafted > 0 ? double(u.accepted) / double(u.drafted) : 0.0}};
  return j;
}

json envelope(Endpoint endpoint, const ResponseMeta& meta, bool chunk) {
  const char* object = endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion";
  return json{{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model},
              {"system_fingerprint", meta.system_fingerprint.empty() ? json(nullptr) : json(meta.system_fingerprint)}};
}

}  // namespace

json completion_response(Endpoint endpoint, const ResponseMeta& meta, const ChoiceResult& choice,
                         const Usage& usage, bool with_logprobs) {
  json j = envelope(endpoint, meta, false);
  json c = {{"index", 0}, {"finish_reason", choice.finish_reason}, {"logprobs", nullptr}};
  if (endpoint == Endpoint::kChat) {
    c["message"] = {{"role", "assistant"}, {"content", choice.text}};
    if (with_logprobs) c["logprobs"] = chat_logprobs(choice.logprobs);
  } else {
    c["text"] = choice.text;
    if (with_logprobs) c["logprobs"] = completion_logprobs(choice.logprobs, 0);
  }
  j["choices"] = json::array({c});
  j["usage"] = usage_json(usage);
  return j;
}

json stream_chunk(Endpoint endpoint, const ResponseMeta& meta, std::string_view text,
                  const std::vector<TokenLogprob>* logprobs, const std::string& finish_reason, bool first,
                  bool include_usage) {
  json j = envelope(endpoint, meta, true);
  json c = {{"index", 0}, {"logprobs", nullptr}};
  c["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish_reason.empty()) delta["content"] = std::string(text);
    c["delta"] = delta;
    if (logprobs != nullptr) c["logprobs"] = chat_logprobs(*logprobs);
  } else {
    c["text"] = std::string(text);
    if (logprobs != nullptr) c["logprobs"] = completion_logprobs(*logprobs, 0);
  }
  j["choices"] = json::array({c});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  json j = envelope(endpoint, meta, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace lychee::server
