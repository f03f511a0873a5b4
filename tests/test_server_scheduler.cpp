// The scheduler on the default model through the C++ API: concurrent greedy requests produce
// exactly what each produces alone, seeded requests the same tokens alone, among others and from
// the prefix cache, speculating requests batched what each produces alone, cancellation and
// finishing free their KV pages, a full queue refuses, cache salts isolate prefixes, an engine
// fault fails the requests and not the process, and after every run the pool is back to its
// starting value. On the CPU by default; LYCHEE_TEST_DEVICE=cuda (the GPU script's server stage)
// runs the same tests on the GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "server/params.h"
#include "server/scheduler.h"
#include "test_util.h"

namespace lychee::server {
namespace {

using namespace std::chrono_literals;

std::string test_device() {
  const char* d = std::getenv("LYCHEE_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? d : "cpu";
}

Engine& default_engine(const std::string& path) {
  static std::unique_ptr<Engine> engine;
  if (!engine) {
    EngineOptions o;
    o.model_path = path;
    o.device = test_device();
    o.max_batch = 24;
    o.max_context = 2048;
    engine = std::make_unique<Engine>(o);
    std::printf("[server scheduler tests on %s]\n", engine->device().c_str());
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
  EXPECT_EQ(g.kv_pages_used, 0);
  EXPECT_EQ(g.kv_pages_capacity, s.kv_capacity());
}

const std::vector<std::string> kPrompts = {"The capital of France is", "Once upon a time", "1, 2, 3, 4,",
                                           "def fibonacci(n):"};

// The value of the sample `name` (with its labels) in a /metrics text; NaN when absent.
double sample(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + key.size(), text.find('\n', at + key.size()) - at - key.size()));
}

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
  const int page = probe.page_tokens();
  o.kv_tokens = (2 * ((one + page - 1) / page)) * page + page - 1;  // two requests' pages, not three
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
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < together.size(); ++i) {
    const RequestUpdate u = together[i]->wait();
    EXPECT_EQ(u.text, alone[i].text) << kPrompts[i];
    EXPECT_EQ(u.finish_reason, alone[i].finish_reason);
    EXPECT_EQ(u.usage.prompt_tokens, alone[i].usage.prompt_tokens);
    prompt_tokens += 2 * u.usage.prompt_tokens;  // alone and together
  }
  expect_pool_empty(s);
  EXPECT_EQ(metrics.requests("ok"), 8u);
  // Every request's queue, prefill and first-token times observed once; every prompt token either
  // prefilled by an engine step or copied from the prefix cache; a request alone starts with a
  // prefill-only step and ends with decode-only ones (whether a prompt's chunk meets another
  // request's decode, a mixed step, depends on when the submissions reach the engine thread).
  const std::string t = metrics.render(s.gauges());
  for (const char* h : {"lychee_request_queue_seconds_count", "lychee_request_prefill_seconds_count",
                        "lychee_time_to_first_token_seconds_count"})
    EXPECT_EQ(sample(t, h), 8.0) << h << " in\n" << t;
  double prefilled = 0;
  for (const char* kind : {"prefill", "decode", "mixed"})
    prefilled += sample(t, fmt::format("lychee_engine_prefill_tokens_total{{kind=\"{}\"}}", kind));
  EXPECT_EQ(prefilled + sample(t, "lychee_prefix_cache_reused_tokens_total"), double(prompt_tokens)) << t;
  EXPECT_EQ(sample(t, "lychee_engine_prefill_tokens_total{kind=\"decode\"}"), 0.0);
  EXPECT_GT(sample(t, "lychee_engine_steps_total{kind=\"prefill\"}"), 0.0) << t;
  EXPECT_GT(sample(t, "lychee_engine_steps_total{kind=\"decode\"}"), 0.0) << t;
  EXPECT_GT(sample(t, "lychee_engine_step_seconds_total{kind=\"decode\"}"), 0.0) << t;
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
  EXPECT_GT(s.gauges().kv_pages_used, 0);
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

std::string sampled(const std::string& prompt, int max_tokens, uint64_t seed, const std::string& extra = "") {
  return fmt::format(R"({{"prompt": "{}", "max_tokens": {}, "temperature": 0.9, "seed": {}, "ignore_eos": true{}}})",
                     prompt, max_tokens, seed, extra);
}

std::string run_one(Scheduler& s, Engine& engine, const std::string& body, int* cached = nullptr) {
  auto r = std::make_shared<Request>(params(engine, s, body));
  s.submit(r);
  const RequestUpdate u = r->wait();
  EXPECT_TRUE(u.finish_reason == "length" || u.finish_reason == "stop") << u.finish_reason << " " << u.error;
  if (cached != nullptr) *cached = u.usage.cached_tokens;
  return u.text;
}

// Speculating requests at once (their cycles batched: SpeculativeDecoder::cycle_batch) give the
// text each gives alone, greedy ones Full's text, a seeded sampled one its text alone; each reports
// its drafts.
TEST(ServerScheduler, ConcurrentSpeculatingRequestsMatchAloneAndFull) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  SchedulerOptions o;
  o.max_running = 8;
  Scheduler s(engine, o, &metrics);
  const std::string spec = R"(, "lychee": {"policy": "lychee", "budget": 32, "block_size": 16, "sink": 16, "recent": 16, "speculate": 3})";
  std::vector<std::string> bodies;
  for (size_t i = 0; i < kPrompts.size(); ++i) bodies.push_back(greedy(kPrompts[i], 10 + int(i), spec));
  bodies.push_back(sampled(kPrompts[1], 12, 77, spec));
  std::vector<RequestUpdate> alone;
  for (const std::string& b : bodies) {
    auto r = std::make_shared<Request>(params(engine, s, b));
    s.submit(r);
    alone.push_back(r->wait());
    EXPECT_TRUE(alone.back().usage.speculated) << b;
    EXPECT_GT(alone.back().usage.drafted, 0u) << b;
  }
  for (size_t i = 0; i < kPrompts.size(); ++i)
    EXPECT_EQ(run_one(s, engine, greedy(kPrompts[i], 10 + int(i))), alone[i].text) << kPrompts[i];
  std::vector<std::shared_ptr<Request>> together;
  for (const std::string& b : bodies) {
    together.push_back(std::make_shared<Request>(params(engine, s, b)));
    s.submit(together.back());
  }
  for (size_t i = 0; i < together.size(); ++i) {
    const RequestUpdate u = together[i]->wait();
    EXPECT_EQ(u.text, alone[i].text) << bodies[i];
    EXPECT_EQ(u.finish_reason, alone[i].finish_reason) << bodies[i];
    EXPECT_EQ(u.usage.completion_tokens, alone[i].usage.completion_tokens) << bodies[i];
    EXPECT_GT(u.usage.drafted, 0u) << bodies[i];
  }
  expect_pool_empty(s);
}

// A long document so that prompts span several aligned prefill chunks (invariant_chunk 16 here).
std::string document() {
  std::string doc = "Inventory notes.";
  const char* colours[] = {"red", "blue", "green", "yellow", "purple", "orange", "black", "white"};
  for (int i = 0; i < 8; ++i) doc += fmt::format(" The {} box holds {} marbles and {} keys.", colours[i], i * 7 + 3, i + 2);
  return doc;
}

// Seeded requests are batch-invariant: the same text alone, again from the prefix cache, and
// among 16 concurrent requests of other lengths (greedy, seeded and not), while a different seed
// gives different text. Prompts are prefilled in aligned chunks, and the cache is entered only
// at a chunk boundary.
TEST(ServerScheduler, SeededRequestsGiveTheSameTokensAloneFromTheCacheAndAmongOthers) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  SchedulerOptions o;
  o.max_running = 24;
  o.invariant_chunk = 16;
  o.max_context = 1024;
  Scheduler s(engine, o, &metrics);
  const std::string q = document() + " Question: how many keys does the green box hold? Answer:";
  const std::string alone = run_one(s, engine, sampled(q, 24, 123));
  int cached = -1;
  const std::string again = run_one(s, engine, sampled(q, 24, 123), &cached);
  EXPECT_GT(cached, 0) << "the second request did not hit the prefix cache";
  EXPECT_EQ(cached % 16, 0) << "a batch-invariant request copies whole aligned chunks";
  EXPECT_EQ(again, alone);
  EXPECT_FALSE(alone.empty());
  // A different question about the same document: cached, and equal to a cache-less server's.
  const std::string q2 = document() + " Question: which box holds 24 marbles? Answer:";
  const std::string with_cache = run_one(s, engine, sampled(q2, 16, 7), &cached);
  EXPECT_GT(cached, 0);
  SchedulerOptions no_cache = o;
  no_cache.prefix_cache_tokens = 0;
  {
    Scheduler plain(engine, no_cache);
    EXPECT_EQ(run_one(plain, engine, sampled(q2, 16, 7)), with_cache);
  }
  // Among 16 others: greedy and sampled, short and long, some with the same document.
  std::vector<std::shared_ptr<Request>> others;
  for (int i = 0; i < 16; ++i) {
    const std::string p = i % 3 == 0 ? document() + fmt::format(" Note {}:", i) : kPrompts[size_t(i) % kPrompts.size()];
    const std::string body = i % 2 ? greedy(p, 20 + i) : sampled(p, 20 + i, uint64_t(1000 + i));
    others.push_back(std::make_shared<Request>(params(engine, s, body)));
  }
  auto probe = std::make_shared<Request>(params(engine, s, sampled(q, 24, 123)));
  for (size_t i = 0; i < others.size(); ++i) {
    if (i == 5) s.submit(probe);
    s.submit(others[i]);
  }
  EXPECT_EQ(probe->wait().text, alone);
  for (auto& r : others) EXPECT_NE(r->wait().finish_reason, "error");
  EXPECT_NE(run_one(s, engine, sampled(q, 24, 124)), alone) << "another seed gave the same 24 tokens";
  expect_pool_empty(s);
}

// Prefix-cache entries are shared only within a cache_salt: another tenant's identical prompt is
// not a hit (cached_tokens cannot reveal it), the same tenant's is.
TEST(ServerScheduler, CacheSaltsIsolateThePrefixCache) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  SchedulerOptions o;
  o.max_context = 1024;
  Scheduler s(engine, o);
  const std::string q = document() + " Question: what is in the red box? Answer:";
  int cached = -1;
  const std::string a = run_one(s, engine, greedy(q, 6, R"(, "cache_salt": "tenant-a")"), &cached);
  EXPECT_EQ(cached, 0);
  run_one(s, engine, greedy(q, 6, R"(, "cache_salt": "tenant-b")"), &cached);
  EXPECT_EQ(cached, 0) << "tenant b hit tenant a's prompt";
  run_one(s, engine, greedy(q, 6), &cached);
  EXPECT_EQ(cached, 0) << "the unsalted namespace hit a salted prompt";
  EXPECT_EQ(run_one(s, engine, greedy(q, 6, R"(, "cache_salt": "tenant-a")"), &cached), a);
  EXPECT_GT(cached, 0);
  expect_pool_empty(s);
}

// A cancelled request leaves the queue at once, wherever it waits, not when it reaches the front.
TEST(ServerScheduler, CancelledRequestsLeaveTheQueueAtOnce) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  SchedulerOptions o;
  o.max_running = 1;
  o.max_queue = 4;
  Scheduler s(engine, o, &metrics);
  auto running = std::make_shared<Request>(params(engine, s, greedy("Once upon a time", 400)));
  s.submit(running);
  RequestUpdate u;
  while (u.text.empty() && !u.done) running->next(u, 1000ms);
  auto first = std::make_shared<Request>(params(engine, s, greedy("Hello", 4)));
  auto second = std::make_shared<Request>(params(engine, s, greedy("Hi", 4)));
  s.submit(first);
  s.submit(second);
  ASSERT_EQ(s.gauges().waiting, 2);
  second->cancel();
  RequestUpdate c;
  ASSERT_TRUE(second->next(c, 5000ms));  // while `running` still runs and `first` still waits
  EXPECT_TRUE(c.done);
  EXPECT_EQ(c.finish_reason, "cancelled");
  EXPECT_EQ(s.gauges().waiting, 1);
  running->cancel();
  EXPECT_EQ(first->wait().finish_reason, "length");
  expect_pool_empty(s);
  EXPECT_EQ(metrics.requests("cancelled"), 2u);
}

// An exception escaping the engine loop ends the running and waiting requests with an error,
// turns healthy() false and refuses new requests (503), instead of terminating the process.
TEST(ServerScheduler, AnEngineFaultFailsTheRequestsAndNotTheProcess) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  SchedulerOptions o;
  o.max_running = 1;
  o.fault_at_step = 6;
  Scheduler s(engine, o, &metrics);
  auto running = std::make_shared<Request>(params(engine, s, greedy("Once upon a time", 100)));
  auto waiting = std::make_shared<Request>(params(engine, s, greedy("Hello", 4)));
  s.submit(running);
  s.submit(waiting);
  const RequestUpdate a = running->wait(), b = waiting->wait();
  EXPECT_EQ(a.finish_reason, "error");
  EXPECT_NE(a.error.find("injected fault at step 6"), std::string::npos) << a.error;
  EXPECT_EQ(b.finish_reason, "error");
  EXPECT_FALSE(s.healthy());
  EXPECT_NE(s.fault().find("injected fault"), std::string::npos);
  EXPECT_FALSE(s.gauges().healthy);
  try {
    s.submit(std::make_shared<Request>(params(engine, s, greedy("Hello", 4))));
    ADD_FAILURE() << "a failed engine accepted a request";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 503);
    EXPECT_NE(std::string(e.what()).find("engine failed"), std::string::npos) << e.what();
  }
}

// Admission counts KV pages: the budget is capped at the pool's pages (the GPU's pool; the CPU
// has none and counts single tokens), and requests whose pages together pass it wait instead of
// failing, all finishing with every page back.
TEST(ServerScheduler, AdmissionCountsPagesAndTheBudgetIsCappedAtThePool) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine& engine = default_engine(path);
  Metrics metrics;
  SchedulerOptions o;
  o.max_running = 8;
  o.kv_tokens = int64_t(1) << 40;  // far more than any pool
  if (engine.kv_pool_pages() > 0) {
    Scheduler big(engine, o);
    EXPECT_EQ(big.kv_capacity(), engine.kv_pool_pages());
    EXPECT_EQ(big.page_tokens(), engine.kv_page_tokens());
  }
  // Room for three requests' pages: eight requests queue and finish, none fails.
  Scheduler probe(engine, SchedulerOptions{});
  const int64_t tokens = kv_reservation(params(engine, probe, greedy(kPrompts[1], 40)));
  const int page = probe.page_tokens();
  o.kv_tokens = 3 * ((tokens + page - 1) / page) * page;
  Scheduler s(engine, o, &metrics);
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < 8; ++i) {
    rs.push_back(std::make_shared<Request>(params(engine, s, greedy(kPrompts[1], 40))));
    s.submit(rs.back());
  }
  int max_running = 0;
  while (s.gauges().running + s.gauges().waiting > 0) {
    max_running = std::max(max_running, s.gauges().running);
    std::this_thread::sleep_for(1ms);
  }
  for (auto& r : rs) EXPECT_EQ(r->wait().finish_reason, "length");
  EXPECT_LE(max_running, 3);
  EXPECT_EQ(metrics.requests("ok"), 8u);
  expect_pool_empty(s);
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
