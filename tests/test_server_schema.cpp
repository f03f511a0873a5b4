// The server's pure pieces: request parsing and validation (every error names its field), the
// response and SSE formats, stop strings with streaming holdback, the metrics text.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "server/metrics.h"
#include "server/schema.h"
#include "server/text_stream.h"

namespace lychee::server {
namespace {

using nlohmann::json;

CompletionRequest chat(const std::string& extra) {
  return parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}])" + extra + "}");
}

// The request fails with a 400 whose param and message name `field`.
template <typename F>
void expect_bad(F&& parse, const std::string& field, const std::string& message_part = "") {
  try {
    parse();
    ADD_FAILURE() << "accepted; expected an error naming '" << field << "'";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    EXPECT_EQ(e.param(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
    if (!message_part.empty()) EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
    const json body = e.body();
    EXPECT_EQ(body["error"]["param"], field);
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(body["error"].contains("code"));
  }
}

TEST(ServerSchema, ParsesAChatRequest) {
  const CompletionRequest r = parse_chat_request(R"({
    "model": "m", "messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["x", "yz"],
    "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
    "user": "u", "some_future_field": {"ignored": true},
    "lychee": {"policy": "lychee", "budget": 256, "block_size": 16, "select": "topp", "select_value": 0.9,
               "sink": 4, "recent": 8}})");
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.lychee.policy, "lychee");
  EXPECT_EQ(r.lychee.budget, 256);
  EXPECT_EQ(r.lychee.block_size, 16);
  EXPECT_EQ(r.lychee.select, "topp");
  EXPECT_DOUBLE_EQ(*r.lychee.select_value, 0.9);
  EXPECT_EQ(r.lychee.sink, 4);
  EXPECT_EQ(r.lychee.recent, 8);
  EXPECT_FALSE(r.lychee.duo_sink.has_value());
}

TEST(ServerSchema, DefaultsAndNulls) {
  const CompletionRequest r = chat(R"(, "max_tokens": null, "stop": "END", "seed": null)");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(chat(R"(, "max_completion_tokens": 5)").max_tokens, 5);
  EXPECT_EQ(chat(R"(, "n": 1)").max_tokens, std::nullopt);
}

TEST(ServerSchema, ParsesCompletionPrompts) {
  const CompletionRequest text = parse_completion_request(R"({"prompt": "once", "logprobs": 3})");
  EXPECT_EQ(text.endpoint, Endpoint::kCompletion);
  EXPECT_EQ(text.prompt, "once");
  EXPECT_FALSE(text.prompt_is_ids);
  EXPECT_TRUE(text.logprobs);
  EXPECT_EQ(text.top_logprobs, 3);
  const CompletionRequest ids = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["one"]})").prompt, "one");
}

TEST(ServerSchema, EveryBadFieldIsNamed) {
  expect_bad([] { chat(R"(, "max_tokens": 0)"); }, "max_tokens", "got 0");
  expect_bad([] { chat(R"(, "max_tokens": 1.5)"); }, "max_tokens");
  expect_bad([] { chat(R"(, "max_tokens": "10")"); }, "max_tokens", "a string");
  expect_bad([] { chat(R"(, "max_completion_tokens": -1)"); }, "max_completion_tokens");
  expect_bad([] { chat(R"(, "temperature": 3)"); }, "temperature", "from 0 to 2");
  expect_bad([] { chat(R"(, "temperature": "hot")"); }, "temperature");
  expect_bad([] { chat(R"(, "top_p": 1.5)"); }, "top_p");
  expect_bad([] { chat(R"(, "top_k": -1)"); }, "top_k");
  expect_bad([] { chat(R"(, "seed": "abc")"); }, "seed");
  expect_bad([] { chat(R"(, "stop": 5)"); }, "stop");
  expect_bad([] { chat(R"(, "stop": ["a", 1])"); }, "stop[1]");
  expect_bad([] { chat(R"(, "n": 2)"); }, "n", "only n = 1 is supported");
  expect_bad([] { chat(R"(, "stream": "yes")"); }, "stream");
  expect_bad([] { chat(R"(, "stream_options": {"include_usage": 1})"); }, "stream_options.include_usage");
  expect_bad([] { chat(R"(, "logprobs": 1)"); }, "logprobs");
  expect_bad([] { chat(R"(, "top_logprobs": 2)"); }, "top_logprobs", "logprobs");
  expect_bad([] { chat(R"(, "logprobs": true, "top_logprobs": 21)"); }, "top_logprobs");
  expect_bad([] { chat(R"(, "model": 7)"); }, "model");
  expect_bad([] { chat(R"(, "user": 7)"); }, "user");
  expect_bad([] { chat(R"(, "lychee": 1)"); }, "lychee");
  expect_bad([] { chat(R"(, "lychee": {"policy": "magic"})"); }, "lychee.policy", "full, lychee, tidal, quest, duo");
  expect_bad([] { chat(R"(, "lychee": {"budget": 0})"); }, "lychee.budget");
  expect_bad([] { chat(R"(, "lychee": {"block_size": -4})"); }, "lychee.block_size");
  expect_bad([] { chat(R"(, "lychee": {"select": "best"})"); }, "lychee.select");
  expect_bad([] { chat(R"(, "lychee": {"select_value": "x"})"); }, "lychee.select_value");
  expect_bad([] { chat(R"(, "lychee": {"sink": -1})"); }, "lychee.sink");
  expect_bad([] { chat(R"(, "lychee": {"recent": true})"); }, "lychee.recent");
  expect_bad([] { chat(R"(, "lychee": {"tidal_layers": [1, "x"]})"); }, "lychee.tidal_layers[1]");
}

TEST(ServerSchema, BadMessagesAreNamed) {
  expect_bad([] { parse_chat_request("{}"); }, "messages", "missing");
  expect_bad([] { parse_chat_request(R"({"messages": "hi"})"); }, "messages");
  expect_bad([] { parse_chat_request(R"({"messages": []})"); }, "messages", "at least one");
  expect_bad([] { parse_chat_request(R"({"messages": [3]})"); }, "messages[0]");
  expect_bad([] { parse_chat_request(R"({"messages": [{"content": "x"}]})"); }, "messages[0].role", "missing");
  expect_bad([] { parse_chat_request(R"({"messages": [{"role": "robot", "content": "x"}]})"); }, "messages[0].role");
  expect_bad([] { parse_chat_request(R"({"messages": [{"role": "user"}]})"); }, "messages[0].content", "missing");
  expect_bad([] { parse_chat_request(R"({"messages": [{"role": "user", "content": 5}]})"); }, "messages[0].content");
  expect_bad([] { parse_chat_request(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"); },
             "messages[0].content[0].type", "only 'text'");
  expect_bad([] { parse_chat_request(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})"); },
             "messages[0].content[0].text");
  expect_bad([] { parse_completion_request("{}"); }, "prompt", "missing");
  expect_bad([] { parse_completion_request(R"({"prompt": ""})"); }, "prompt");
  expect_bad([] { parse_completion_request(R"({"prompt": []})"); }, "prompt");
  expect_bad([] { parse_completion_request(R"({"prompt": ["a", "b"]})"); }, "prompt", "one prompt");
  expect_bad([] { parse_completion_request(R"({"prompt": [1, -2]})"); }, "prompt[1]");
  expect_bad([] { parse_completion_request(R"({"prompt": "x", "echo": true})"); }, "echo");
  expect_bad([] { parse_tokenize_request("{}"); }, "content");
  expect_bad([] { parse_tokenize_request(R"({"content": "x", "add_special": 1})"); }, "add_special");
  expect_bad([] { parse_detokenize_request(R"({"tokens": [1, "a"]})"); }, "tokens[1]");
}

TEST(ServerSchema, MalformedBodiesAre400) {
  for (const char* body : {"", "{", "[1, 2]", "\"text\"", "null", "{\"messages\": [}", "\xff\xfe"}) {
    try {
      parse_chat_request(body);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
      EXPECT_NE(std::string(e.what()).find("request body"), std::string::npos) << e.what();
    }
  }
}

ResponseMeta meta() { return ResponseMeta{"chatcmpl-1", 1700000000, "m"}; }

TEST(ServerSchema, ChatResponse) {
  const ChoiceResult c{"Paris.", "stop", {{"Paris", -0.25f, {{"Paris", -0.25f}, {"London", -2.0f}}}}};
  const json j = completion_response(Endpoint::kChat, meta(), c, Usage{10, 3}, true);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  const json& lp = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "Paris");
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(lp["top_logprobs"][1]["token"], "London");
  EXPECT_EQ(lp["bytes"].size(), 5u);
  EXPECT_TRUE(completion_response(Endpoint::kChat, meta(), c, Usage{}, false)["choices"][0]["logprobs"].is_null());
}

TEST(ServerSchema, CompletionResponseWithLegacyLogprobs) {
  const ChoiceResult c{"ab", "length", {{"a", -1.0f, {{"a", -1.0f}}}, {"b", -2.0f, {}}}};
  const json j = completion_response(Endpoint::kCompletion, meta(), c, Usage{1, 2}, true);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0]["a"].get<float>(), -1.0f);
}

TEST(ServerSchema, SseChunks) {
  const json first = stream_chunk(Endpoint::kChat, meta(), "Hel", nullptr, "", true, false);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const json last = stream_chunk(Endpoint::kChat, meta(), "", nullptr, "length", false, true);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  EXPECT_TRUE(last["usage"].is_null());
  const json u = usage_chunk(Endpoint::kChat, meta(), Usage{4, 5});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 5);
  const json text = stream_chunk(Endpoint::kCompletion, meta(), "lo", nullptr, "", false, false);
  EXPECT_EQ(text["choices"][0]["text"], "lo");
  const std::string event = sse_event(json{{"a", 1}});
  EXPECT_EQ(event, "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // A token that ends inside a UTF-8 character never breaks the JSON.
  EXPECT_NO_THROW(sse_event(stream_chunk(Endpoint::kChat, meta(), "\xe2\x82", nullptr, "", false, false)));
}

// Pushes pieces one by one; returns what a client would have seen.
std::string run(TextStream& s, const std::vector<std::string>& pieces, std::vector<std::string>* seen = nullptr) {
  std::string out;
  for (const std::string& p : pieces) {
    const std::string t = s.push(p);
    if (seen) seen->push_back(t);
    out += t;
  }
  if (!s.stopped()) out += s.finish();
  return out;
}

TEST(ServerTextStream, StopStringIsNotReturned) {
  TextStream s({"STOP"});
  EXPECT_EQ(run(s, {"Hello ", "wor", "ld", "ST", "OP", " more"}), "Hello world");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("x"), "");
}

TEST(ServerTextStream, HoldsBackAPossibleStopPrefixWhileStreaming) {
  TextStream s({"</end>"});
  std::vector<std::string> seen;
  EXPECT_EQ(run(s, {"a<", "/e", "x", "b"}, &seen), "a</exb");
  EXPECT_EQ(seen[0], "a");  // "<" may begin "</end>"
  EXPECT_EQ(seen[1], "");   // "</e" still may
  EXPECT_EQ(seen[2], "</ex");  // no longer
  EXPECT_FALSE(s.stopped());
}

TEST(ServerTextStream, EarliestOfSeveralStops) {
  // "ab" is held back as a prefix of "abcd"; once "cd" arrives both stops are in the text and the
  // one that starts first wins.
  TextStream s({"bc", "abcd", "x"});
  EXPECT_EQ(run(s, {"zab", "cd"}), "z");
  TextStream t({"\n\n"});
  EXPECT_EQ(run(t, {"line\n", "\n", "next"}), "line");
}

TEST(ServerTextStream, WithoutStopsPassesTextButHoldsUnfinishedCharacters) {
  TextStream s;
  std::vector<std::string> seen;
  // "€" is e2 82 ac: split across tokens it is sent whole.
  EXPECT_EQ(run(s, {"a\xe2", "\x82", "\xac", "b"}, &seen), "a\xe2\x82\xac" "b");
  EXPECT_EQ(seen[0], "a");
  EXPECT_EQ(seen[1], "");
  EXPECT_EQ(seen[2], "\xe2\x82\xac");
  EXPECT_EQ(incomplete_utf8_tail("ab"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xf0\x9f\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_tail("a\xf0\x9f\x98\x80"), 0u);
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  m.count_request("ok");
  m.count_request("ok");
  m.count_request("rejected");
  m.add_tokens(10, 4);
  m.observe_ttft(0.03);
  m.observe_ttft(100.0);
  m.observe_tpot(0.02);
  m.observe_queue(0.2);
  m.observe_prefill(1.5);
  m.add_step("mixed", 0.25, 100);
  m.add_step("mixed", 0.5, 28);
  m.add_kv_reads("lychee", 250, 1000);
  const std::string t = m.render(SchedulerGauges{2, 1, 300, 1000});
  for (const char* line : {"lychee_requests_total{outcome=\"ok\"} 2\n", "lychee_requests_total{outcome=\"rejected\"} 1\n",
                           "lychee_prompt_tokens_total 10\n", "lychee_generated_tokens_total 4\n",
                           "lychee_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n",
                           "lychee_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
                           "lychee_time_to_first_token_seconds_count 2\n",
                           "lychee_time_per_output_token_seconds_bucket{le=\"0.02\"} 1\n",
                           "lychee_running_requests 2\n", "lychee_waiting_requests 1\n", "lychee_kv_tokens_used 300\n",
                           "lychee_kv_tokens_free 700\n", "lychee_kv_read_ratio{policy=\"lychee\"} 0.25\n",
                           "# TYPE lychee_time_to_first_token_seconds histogram\n",
                           "lychee_request_queue_seconds_bucket{le=\"0.1\"} 0\n",
                           "lychee_request_queue_seconds_bucket{le=\"0.5\"} 1\n",
                           "lychee_request_prefill_seconds_bucket{le=\"1\"} 0\n",
                           "lychee_request_prefill_seconds_bucket{le=\"2.5\"} 1\n",
                           "lychee_engine_steps_total{kind=\"mixed\"} 2\n", "lychee_engine_steps_total{kind=\"prefill\"} 0\n",
                           "lychee_engine_step_seconds_total{kind=\"mixed\"} 0.75\n",
                           "lychee_engine_prefill_tokens_total{kind=\"mixed\"} 128\n"})
    EXPECT_NE(t.find(line), std::string::npos) << "missing: " << line << "in\n" << t;
  // Every line is a comment or "name{labels} value".
  size_t start = 0;
  while (start < t.size()) {
    const size_t end = t.find('\n', start);
    ASSERT_NE(end, std::string::npos) << "the text must end with a newline";
    const std::string line = t.substr(start, end - start);
    if (line[0] != '#') {
      const size_t space = line.rfind(' ');
      ASSERT_NE(space, std::string::npos) << line;
      EXPECT_NO_THROW((void)std::stod(line.substr(space + 1))) << line;
    }
    start = end + 1;
  }
}

// Every family that has samples names the same labels on every replica: a by-policy family is
// absent until its first sample (sglang-router's /engine_metrics merges replicas' families and
// refuses an empty family beside a labelled one).
TEST(ServerMetrics, ByPolicyFamiliesAppearWithTheirFirstSample) {
  Metrics m;
  const std::string idle = m.render(SchedulerGauges{});
  EXPECT_EQ(idle.find("lychee_kv_read"), std::string::npos) << idle;
  for (const char* family : {"lychee_requests_total", "lychee_prefix_cache_hits_total", "lychee_kv_pages_used"})
    EXPECT_NE(idle.find(fmt::format("# TYPE {} ", family)), std::string::npos) << family;
  m.add_kv_reads("full", 100, 100);
  const std::string busy = m.render(SchedulerGauges{});
  for (const char* line : {"# TYPE lychee_kv_read_bytes_total counter\n", "lychee_kv_read_bytes_total{policy=\"full\"} 100\n",
                           "lychee_kv_read_ratio{policy=\"full\"} 1\n"})
    EXPECT_NE(busy.find(line), std::string::npos) << "missing: " << line << "in\n" << busy;
}

}  // namespace
}  // namespace lychee::server
