// The OpenAI-compatible wire format: requests (JSON -> native structs, validated) and responses
// and Server-Sent-Event chunks (native -> JSON). Pure: no engine, no tokenizer, no I/O, so the
// request parser can be fuzzed on its own (fuzz/fuzz_request.cpp).
//
// Validation follows OpenAI's API: unknown fields are ignored; a known field with a bad value is a
// 400 whose message and `param` name the field.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_io.h"

namespace lychee::server {

// An error answered to the client: HTTP status plus OpenAI's error object
// {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // "invalid_request_error", "authentication_error", "not_found_error", ... by status.
  std::string type() const;
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
  std::string code_;
};


enum class Endpoint { kChat, kCompletion };

struct ChatMessageIn {
  std::string role;
  std::string content;  // text parts of an array content joined
};

// The per-request "lychee" extension object; absent fields keep the server's defaults.
struct PolicyOverrides {
  std::optional<std::string> policy;  // full, lychee, tidal, quest, duo
  std::optional<int> budget;
  std::optional<int> block_size;
  std::optional<std::string> select;  // topk, topp, threshold, ratio
  std::optional<double> select_value;
  std::optional<int> sink;
  std::optional<int> recent;
  std::optional<std::vector<int>> tidal_layers;
  std::optional<int> quest_page;
  std::optional<int> duo_sink;
  std::optional<int> duo_recent;
  std::optional<std::string> speculate;  // "off", a count of drafted tokens, "auto" (runtime/speculative.h)
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                    // "" = not given
  std::vector<ChatMessageIn> messages;  // chat
  std::string prompt;                   // completion, text prompt
  std::vector<int32_t> prompt_ids;      // completion, token-id prompt (prompt_is_ids)
  bool prompt_is_ids = false;
  std::optional<int> max_tokens;        // max_tokens or max_completion_tokens
  float temperature = 1.0f;             // OpenAI's default
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool ignore_eos = false;              // vLLM's extension: go on past the model's stop tokens (benchmarks)
  bool include_usage = false;           // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  PolicyOverrides lychee;
  std::string cache_salt;               // vLLM's: prefix-cache entries are shared only within a salt
};

// Throw ApiError(400, ...) naming the field; ApiError(400) for JSON that does not parse.
CompletionRequest parse_chat_request(std::string_view body);
CompletionRequest parse_completion_request(std::string_view body);
CompletionRequest parse_request(Endpoint endpoint, std::string_view body);

// POST /tokenize {"content", "add_special"} and POST /detokenize {"tokens"} (llama.cpp's server).
struct TokenizeRequest {
  std::string content;
  bool add_special = false;
};
TokenizeRequest parse_tokenize_request(std::string_view body);
std::vector<int32_t> parse_detokenize_request(std::string_view body);

// --- responses ---------------------------------------------------------------------------------

struct TopLogprob {
  std::string token;  // the token's bytes
  float logprob = 0.0f;
};
struct TokenLogprob {
  std::string token;
  float logprob = 0.0f;
  std::vector<TopLogprob> top;  // most likely first
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens taken from the prefix cache (prompt_tokens_details)
  // Speculative decoding (a request with lychee.speculate): usage.speculation {drafted, accepted,
  // acceptance}; absent otherwise.
  bool speculated = false;
  uint64_t drafted = 0, accepted = 0;
};

struct ResponseMeta {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint;  // the serving configuration (server::system_fingerprint); "" = null
};

struct ChoiceResult {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  std::vector<TokenLogprob> logprobs;
};

// The whole (non-streamed) response. with_logprobs adds the logprobs object in the endpoint's
// format (chat: {"content": [...]}; completion: tokens / token_logprobs / top_logprobs).
nlohmann::json completion_response(Endpoint endpoint, const ResponseMeta& meta, const ChoiceResult& choice,
                                   const Usage& usage, bool with_logprobs);
// One streamed chunk: choices[0].delta (chat; role "assistant" when first) or choices[0].text
// (completion), finish_reason null unless given. An include_usage stream's chunks carry
// "usage": null.
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseMeta& meta, std::string_view text,
                            const std::vector<TokenLogprob>* logprobs, const std::string& finish_reason,
                            bool first, bool include_usage);
// The usage chunk of stream_options.include_usage: empty choices.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);
// "data: <json>\n\n"
std::string sse_event(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace lychee::server
