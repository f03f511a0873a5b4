// The scheduler on the default model through the C++ API: concurrent greedy requests produce
// exactly what each produces alone, cancellation and finishing free their KV capacity, a full
// queue refuses, and after every run the pool is back to its starting value.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "server/params.h"
#include "server/scheduler.h"
#include "test_util.h"

namespace lychee::server {
namespace {

using namespace std::chrono_literals;

Engine& default_engine(const std::string& path) {
  static std::unique_ptr<Engine> engine;
  if (!engine) {
    EngineOptions o;
    o.model_path = path;
    o.device = "cpu";
    engine = std::make_unique<Engine>(o);
  }
  return *engine;
}

GenerationParams params(Engine& engine, const Scheduler& s, const std::string& body) {
  ServerModel m{&engine, "m", PolicySettings{}, s.context()};
  return make_params(parse_completion_request(body), m);
}

std::string greedy(const std::string& prompt, int max_tokens, const std::string& extra = "") {
  return fmt::format(R"({{"prompt": "{}", "max_tokens": {}, "temperature": 0{}}})", prompt, max_tokens, extra);
}

// The pool is back to its starting value: nothing running, waiting or reserved.
void expect_pool_empty(Scheduler& s) {
  ASSERT_TRUE(s.wait_idle(std::chrono::steady_clock::now() + 30s));
  const SchedulerGauges g = s.gauges();
  EXPECT_EQ(g.running, 0);
  EXPECT_EQ(g.waiting, 0);
  EXPECT_EQ(g.kv_tokens_used, 0);
  EXPECT_EQ(g.kv_tokens_capacity, s.kv_capacity());
}

const std::vector<std::string> kPrompts = {"The capital of France is", "Once upon a time", "1, 2, 3, 4,",
                                           "def fibonacci(n):"};

TEST(ServerScheduler, ConcurrentGreedyRequestsMatchAlone) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  // A pool that holds only two of the four at once: the others wait for capacity and join later.
  SchedulerOptions o;
  o.max_running = 4;
  o.prefill_chunk = 3;  // prompts are cut across steps, interleaved with decodes
  Scheduler probe(engine, o);
  const int64_t one = kv_reservation(params(engine, probe, greedy(kPrompts[0], 10)));
  o.kv_tokens = 2 * one + 4;
  Scheduler s(engine, o, &metrics);
  std::vector<RequestUpdate> alone;
  for (const std::string& p : kPrompts) {
    auto r = std::make_shared<Request>(params(engine, s, greedy(p, 10)));
    s.submit(r);
    alone.push_back(r->wait());
    EXPECT_EQ(alone.back().finish_reason, "length") << p;
    EXPECT_EQ(alone.back().usage.completion_tokens, 10) << p;
    EXPECT_FALSE(alone.back().text.empty()) << p;
  }
  std::vector<std::shared_ptr<Request>> together;
  for (const std::string& p : kPrompts) {
    together.push_back(std::make_shared<Request>(params(engine, s, greedy(p, 10))));
    s.submit(together.back());
  }
  for (size_t i = 0; i < together.size(); ++i) {
    const RequestUpdate u = together[i]->wait();
    EXPECT_EQ(u.text, alone[i].text) << kPrompts[i];
    EXPECT_EQ(u.finish_reason, alone[i].finish_reason);
    EXPECT_EQ(u.usage.prompt_tokens, alone[i].usage.prompt_tokens);
  }
  expect_pool_empty(s);
  EXPECT_EQ(metrics.requests("ok"), 8u);
}

TEST(ServerScheduler, StopStringsAndLogprobs) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Scheduler s(engine, SchedulerOptions{});
  auto full = std::make_shared<Request>(params(engine, s, greedy("1, 2, 3, 4,", 12)));
  s.submit(full);
  const RequestUpdate all = full->wait();
  ASSERT_GT(all.text.size(), 4u);
  // Stop at a piece of the greedy text: the text before it, without it, finish "stop".
  const std::string stop = all.text.substr(3, 2);
  const std::string escaped = nlohmann::json(stop).dump();
  auto stopped = std::make_shared<Request>(
      params(engine, s, greedy("1, 2, 3, 4,", 12, ", \"stop\": [\"zzz\", " + escaped + "], \"logprobs\": 2")));
  s.submit(stopped);
  const RequestUpdate u = stopped->wait();
  EXPECT_EQ(u.finish_reason, "stop");
  EXPECT_EQ(u.text, all.text.substr(0, all.text.find(stop)));
  EXPECT_LT(u.usage.completion_tokens, 12);
  ASSERT_EQ(int(u.logprobs.size()), u.usage.completion_tokens);
  for (const TokenLogprob& t : u.logprobs) {
    EXPECT_LE(t.logprob, 0.0f);
    ASSERT_EQ(t.top.size(), 2u);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_EQ(t.top[0].token, t.token);  // greedy takes the most likely token
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
  }
  expect_pool_empty(s);
}

TEST(ServerScheduler, CancellationFreesCapacity) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  Scheduler s(engine, SchedulerOptions{}, &metrics);
  auto r = std::make_shared<Request>(params(engine, s, greedy("Once upon a time", 400)));
  s.submit(r);
  RequestUpdate u;
  while (u.text.empty() && !u.done) r->next(u, 1000ms);
  EXPECT_GT(s.gauges().kv_tokens_used, 0);
  r->cancel();
  while (!u.done) r->next(u, 1000ms);
  EXPECT_EQ(u.finish_reason, "cancelled");
  EXPECT_LT(u.usage.completion_tokens, 400);
  expect_pool_empty(s);
  EXPECT_EQ(metrics.requests("cancelled"), 1u);
}

TEST(ServerScheduler, FullQueueRefuses) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  SchedulerOptions o;
  o.max_running = 1;
  o.max_queue = 1;
  Scheduler s(engine, o);
  auto running = std::make_shared<Request>(params(engine, s, greedy("Once upon a time", 400)));
  s.submit(running);
  RequestUpdate u;
  while (u.text.empty() && !u.done) running->next(u, 1000ms);  // it runs: the queue is empty
  auto queued = std::make_shared<Request>(params(engine, s, greedy("Hello", 4)));
  s.submit(queued);
  EXPECT_EQ(s.gauges().waiting, 1);
  auto refused = std::make_shared<Request>(params(engine, s, greedy("Hello", 4)));
  try {
    s.submit(refused);
    ADD_FAILURE() << "a full queue accepted a request";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 503);
    EXPECT_NE(std::string(e.what()).find("busy"), std::string::npos) << e.what();
  }
  running->cancel();
  EXPECT_EQ(queued->wait().finish_reason, "length");  // admitted once the first left
  expect_pool_empty(s);
  s.drain();
  EXPECT_THROW(s.submit(refused), ApiError);
}

TEST(ServerScheduler, PromptLongerThanTheContextIsRefusedBeforeAnyWork) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  SchedulerOptions o;
  o.max_context = 16;
  Scheduler s(engine, o);
  try {
    std::string words;
    for (int i = 0; i < 40; ++i) words += "word ";
    params(engine, s, greedy(words, 4));
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("context of 16 tokens"), std::string::npos) << e.what();
  }
  // max_tokens beyond the context is cut to what fits (finish "length").
  const GenerationParams p = params(engine, s, greedy("Hello there", 1000));
  EXPECT_EQ(kv_reservation(p), 16);
}

// The prefill budget in token-equivalents: a token at position p weighs 1 + p / k, k the context
// at which attention work equals weight work (26624 on the Llama-3-8B shape: 218 M linear
// parameters a layer over 2 x 4096 query channels). The chunk is the largest that fits.
TEST(ServerScheduler, PrefillChunksShrinkWithThePromptsDepth) {
  EXPECT_NEAR(attention_balance_context(llama3_8b_shape()), 26624.0, 1e-6);
  const double k = 26624.0;
  for (const int64_t position : {int64_t(0), int64_t(2048), int64_t(32768), int64_t(100000)}) {
    const int n = prefill_tokens_within(512.0, position, k);
    EXPECT_LE(prefill_weight(n, position, k), 512.0 + 1e-9) << position;
    EXPECT_GT(prefill_weight(n + 1, position, k), 512.0) << position;
  }
  EXPECT_EQ(prefill_tokens_within(512.0, 0, 1e15), 512);   // no attention weight: plain tokens
  EXPECT_EQ(prefill_tokens_within(512.0, 100000, k), 107); // 512 / 4.76, less the n^2 term
  EXPECT_EQ(prefill_tokens_within(0.0, 0, k), 0);
  EXPECT_EQ(prefill_tokens_within(0.5, 0, k), 0);
}

}  // namespace
}  // namespace lychee::server
