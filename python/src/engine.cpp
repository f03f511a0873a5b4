// lychee._lychee.Engine: a loaded model that generates (one prompt or a batch), streams,
// tokenizes and renders chats.
//
// One prompt: the runtime's generate() (runtime/generate.h) on a fresh session, with the policy
// compiled from PolicySettings (runtime/policy_settings.h) and stop strings cut by the server's
// TextStream (server/text_stream.h), so the CLI, the server and Python produce the same tokens and
// text. A batch (a list of prompts): continuous batching as the server's scheduler does it (up to
// max_batch sequences at once within the KV budget; a finished sequence's place goes to the next
// waiting prompt in the same step), every running sequence advanced by one batched decode step
// (Session::decode_batch: on the GPU one launch per layer for the sequences that share a policy),
// and the speculating ones (speculate) by one batched draft/verify cycle
// (SpeculativeDecoder::cycle_batch). Each sequence samples with a sampler of its own, so a batch
// gives each prompt the tokens a call of its own gives (greedy, or with the same seed); on the CPU
// bit for bit.
//
// The GIL: released while the engine runs. generate() runs on the calling thread and takes the
// GIL back once per token to call the on_text callback and PyErr_CheckSignals (Ctrl-C stops the
// generation after the current token and raises KeyboardInterrupt; the engine stays usable).
// stream() runs the generation on a worker thread that never touches Python; the iterator waits
// for pieces with the GIL released and checks signals between waits. One generation runs at a
// time per engine (a mutex; a caller in another thread waits with the GIL released). While a
// stream's generation runs, any other request (generate, stream, chat, evaluate) raises
// EngineBusyError at once, neither waiting for the stream (whose reader may be the caller) nor
// cancelling it: the caller reads the stream to its end or closes it first.
#include <Python.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "attention/policies.h"
#include "bindings.h"
#include "core/error.h"
#include "core/timer.h"
#include "eval/runner.h"
#include "model/chat_template.h"
#include "model/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/policy_settings.h"
#include "runtime/speculative.h"
#include "runtime/threads.h"
#include "server/scheduler.h"
#include "server/schema.h"
#include "server/text_stream.h"

namespace lychee::py {

namespace {

// What one generation asks for (the Python package fills it from a SamplingParams).
struct Request {
  std::vector<int32_t> prompt;
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;   // stop strings (cut from the text)
  bool ignore_eos = false;         // keep generating past the model's stop tokens
  int correct_every = 0;
  std::string speculate = "off";   // self-speculative decoding: "off", N drafted tokens, "auto"
  int logprobs = -1;               // -1: off; n >= 0: each token's log-probability and the n likeliest
  bool chat = false;               // a chat reply (its OpenAI form is a chat.completion)
  PolicySettings policy;
  std::optional<HeadRoles> roles;  // overrides policy.heads (a file) when set
};

struct Completion {
  std::string text;                 // UTF-8 bytes; stop strings and special tokens left out
  std::vector<int32_t> tokens;      // every generated token (a stop token included)
  std::string finish_reason;        // "stop" (stop token or string), "length", "cancelled"
  std::string policy;               // the policy's label
  std::string model;                // the model's name, as the server reports it
  bool chat = false;
  uint64_t seed = 0;                // the sampler's seed
  int prompt_tokens = 0;
  double ttft = 0.0;                // seconds from the call to the first token (prefill + sampling)
  double tpot = 0.0;                // mean seconds per token after the first
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  uint64_t kv_bytes_read = 0;       // K and V bytes decode steps read (the GPU pages' dtype, as the CLI's --stats)
  uint64_t kv_bytes_dense = 0;      // what full attention would have read
  uint64_t decode_steps = 0;
  uint64_t drafted = 0, accepted = 0;  // speculative decoding: drafts proposed and accepted
  bool with_logprobs = false;
  std::vector<server::TokenLogprob> logprobs;  // one per token when asked for

  // The OpenAI response object (the server's, server/schema.h): chat.completion or text_completion.
  nlohmann::json openai() const {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const server::Endpoint endpoint = chat ? server::Endpoint::kChat : server::Endpoint::kCompletion;
    const server::ResponseMeta meta{fmt::format("{}{:016x}{:08x}", chat ? "chatcmpl-" : "cmpl-", rng(), uint32_t(rng())),
                                    int64_t(std::time(nullptr)), model, /*system_fingerprint=*/""};
    const server::Usage usage{prompt_tokens, int(tokens.size()), 0};
    return server::completion_response(endpoint, meta, server::ChoiceResult{text, finish_reason, logprobs}, usage,
                                       with_logprobs);
  }
};

// Called once per generated token of request `index` with the text that became final (possibly
// ""), and once more with the held-back tail when there is one; false cancels the generation.
using StepFn = std::function<bool(size_t index, const std::string& piece)>;

// Policies: settings (and head roles overriding their file) per policy, as lychee.policy.resolve
// gives them.
using PolicyList = std::vector<std::pair<PolicySettings, std::optional<HeadRoles>>>;

// A policy's options for this model, its head roles (when given) replacing the file's.
PolicyOptions policy_options(const PolicySettings& settings, const std::optional<HeadRoles>& roles,
                             const ModelConfig& c) {
  PolicyOptions o = settings.options(c);
  if (roles) {
    roles->validate(c, "roles");
    o.roles = *roles;
  }
  return o;
}

// The name the server gives the model (a GGUF file's stem, a directory's name).
std::string served_model_name(const std::string& path) {
  std::filesystem::path p(path);
  if (p.filename().empty()) p = p.parent_path();
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

class PyEngine {
 public:
  PyEngine(const std::string& model, const std::string& device, double kv_memory, int max_context, int threads,
           int tensor_parallel, const std::string& weights, const std::string& cpu_weights, const PolicyList& policies,
           int max_batch, const std::string& kv_cache_dtype)
      : engine_(options(model, device, kv_memory, max_context, threads, tensor_parallel, weights, cpu_weights,
                        policies, max_batch, kv_cache_dtype)),
        context_(max_context > 0 ? std::min(max_context, engine_.config().max_context) : engine_.config().max_context),
        weights_(engine_.device() == "cuda" ? weights : cpu_weights),
        model_name_(served_model_name(engine_.checkpoint().path())),
        max_batch_(max_batch),
        kv_tokens_(kv_budget(kv_memory)) {}

  const Engine& engine() const { return engine_; }
  int context() const { return context_; }
  // The weight format of the device in use: `weights` on the GPU, `cpu_weights` on the CPU.
  const std::string& weights() const { return weights_; }
  const std::string& model_name() const { return model_name_; }
  int max_batch() const { return max_batch_; }
  int64_t kv_tokens() const { return kv_tokens_; }

  // A stream's generation holds the engine from its start to its end; another request raises
  // EngineBusy meanwhile (see the top of this file).
  void check_idle() const {
    if (streaming_.load())
      throw EngineBusy(
          "this engine is busy: a stream is still generating (stream() or chat(..., stream=True)); read it to "
          "its end, close() it or leave its with block before starting another request");
  }
  void begin_stream() {
    if (streaming_.exchange(true))
      throw EngineBusy(
          "this engine is busy: another stream is still generating; read it to its end, close() it or leave "
          "its with block before starting a new one");
  }
  void end_stream() { streaming_.store(false); }

  // One generation; called without the GIL.
  Completion run(const Request& r, const StepFn& on_step) {
    // Log-probabilities read each step's logits before the next step is queued: the batch loop
    // does that (generate() on the GPU queues the next step first).
    if (r.logprobs >= 0) return run_batch({r}, on_step)[0];
    std::lock_guard<std::mutex> lock(mutex_);
    Timer timer;  // TTFT counts the session and policy set-up too, as a caller sees it
    const Tokenizer& tok = engine_.tokenizer();
    const ModelConfig& c = engine_.config();
    const PolicyOptions po = check(r);
    GenerateOptions options;
    options.max_new_tokens = r.max_tokens;
    options.sampling = r.sampling;
    if (!r.ignore_eos) options.stop_ids = tok.stop_ids();
    options.correct_every = r.correct_every;
    options.speculate = parse_speculate(r.speculate, "speculate");
    std::unique_ptr<AttentionPolicy> policy = make_policy(po, c);
    std::unique_ptr<Session> session = engine_.new_session(capacity(r));
    session->set_policy(policy.get());

    Completion out = begin(r, po);
    server::TextStream text(r.stop);
    bool cancelled = false;
    double t_first = 0.0, t_last = 0.0;
    const GenerateResult g = generate(*session, r.prompt, options, [&](int32_t token) {
      t_last = timer.seconds();
      if (out.tokens.empty()) t_first = t_last;
      out.tokens.push_back(token);
      const std::string piece = text.push(token_text(token));
      out.text += piece;
      if (!on_step(0, piece)) {
        cancelled = true;
        return false;
      }
      return !text.stopped();
    });
    if (!text.stopped() && !cancelled) {
      const std::string tail = text.finish();
      out.text += tail;
      if (!tail.empty()) on_step(0, tail);
    }
    out.finish_reason = cancelled ? "cancelled" : text.stopped() ? "stop" : g.finish_reason;
    out.ttft = t_first;
    out.tpot = out.tokens.size() > 1 ? (t_last - t_first) / double(out.tokens.size() - 1) : 0.0;
    out.prefill_seconds = g.prefill_seconds;
    out.decode_seconds = g.decode_seconds;
    out.drafted = g.speculation.drafted;
    out.accepted = g.speculation.accepted;
    add_stats(out, *session);
    return out;
  }

  // A batch of generations by continuous batching (see the top of this file); called without the
  // GIL. Every request is checked before any runs (an error names its index). A cancel (on_step
  // false) ends every unfinished request with "cancelled".
  std::vector<Completion> run_batch(const std::vector<Request>& requests, const StepFn& on_step) {
    std::lock_guard<std::mutex> lock(mutex_);
    Timer timer;  // TTFT is from the call: a request that waits for a place counts the wait
    const ModelConfig& c = engine_.config();
    std::vector<PolicyOptions> policies;
    std::vector<SpeculateOptions> speculate;
    for (size_t i = 0; i < requests.size(); ++i) {
      try {
        policies.push_back(check(requests[i]));
        speculate.push_back(parse_speculate(requests[i].speculate, "speculate"));
        make_policy(policies.back(), c);  // its errors now, not halfway through the batch
        // A speculating sequence's tokens come from its verifications, whose rows are not the
        // logits of one step each; cache correction re-prefills what speculation verifies already.
        if (speculate.back().enabled()) {
          LY_CHECK(requests[i].logprobs < 0, ErrorCode::kInvalidArgument,
                   "speculate does not combine with logprobs (ask for one or the other)");
          LY_CHECK(requests[i].correct_every == 0, ErrorCode::kInvalidArgument,
                   "speculate verifies every token densely; it does not combine with correct_every ({})",
                   requests[i].correct_every);
        }
        LY_CHECK(capacity(requests[i]) <= kv_tokens_, ErrorCode::kCapacity,
                 "the prompt and max_tokens need {} KV tokens; kv_memory holds {}", capacity(requests[i]),
                 kv_tokens_);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("prompts[{}]: {}", i, e.what()));
      }
    }
    std::vector<Completion> out;
    for (size_t i = 0; i < requests.size(); ++i) out.push_back(begin(requests[i], policies[i]));
    std::deque<size_t> waiting;
    for (size_t i = 0; i < requests.size(); ++i) waiting.push_back(i);
    std::vector<std::unique_ptr<Sequence>> running;
    int64_t kv_used = 0;
    bool cancelled = false;
    auto take = [&](Sequence& s) {
      if (!cancelled && !sample(s, timer, on_step)) cancelled = true;
    };
    while (!cancelled && (!waiting.empty() || !running.empty())) {
      // Admission: first come, first served, while the batch and the KV budget have room; each
      // admitted prompt is prefilled and gives its first token at once.
      while (!cancelled && !waiting.empty() && int(running.size()) < max_batch_ &&
             kv_used + capacity(requests[waiting.front()]) <= kv_tokens_) {
        const size_t i = waiting.front();
        waiting.pop_front();
        const Request& r = requests[i];
        if (r.max_tokens == 0) {
          out[i].finish_reason = "length";
          continue;
        }
        auto s = std::make_unique<Sequence>(i, r, out[i]);
        s->policy = make_policy(policies[i], c);
        s->session = engine_.new_session(capacity(r));
        s->session->set_policy(s->policy.get());
        const double t0 = timer.seconds();
        prefill(*s->session, r.prompt, GenerateOptions{}.prefill_chunk);
        if (speculate[i].enabled()) {  // the first token from the prompt's (dense) logits, as generate() draws it
          s->spec = std::make_unique<SpeculativeDecoder>(*s->session, r.sampling, speculate[i]);
          if (!cancelled && !accept(*s, s->spec->first(), timer, on_step)) cancelled = true;
        } else {
          take(*s);
        }
        // Up to the first token, as generate() counts it (a GPU prefill's queued work included).
        s->decode_start = timer.seconds();
        s->out.prefill_seconds = s->decode_start - t0;
        kv_used += capacity(r);
        running.push_back(std::move(s));
      }
      std::vector<Session*> sessions;
      std::vector<int32_t> tokens;
      std::vector<Sequence*> stepping, speculating;
      for (const auto& s : running)
        if (!s->done && s->spec) {
          speculating.push_back(s.get());
        } else if (!s->done) {
          stepping.push_back(s.get());
          sessions.push_back(s->session.get());
          tokens.push_back(s->out.tokens.back());
          s->since_correction.push_back(s->out.tokens.back());
        }
      if (!cancelled && !stepping.empty()) {
        // One decode step of every running sequence, each sampled as soon as its step has run; a
        // sequence due for a cache correction (correct_every) re-prefills after the step, then samples.
        std::vector<Sequence*> correcting;
        Session::decode_batch(sessions, tokens, [&](size_t j) {
          Sequence& s = *stepping[j];
          const int every = s.request.correct_every;
          if (every > 0 && int(s.since_correction.size()) == every) correcting.push_back(&s);
          else take(s);
        });
        for (Sequence* s : correcting) {
          s->session->truncate(s->session->length() - int(s->since_correction.size()));
          s->session->feed(s->since_correction, /*allow_policy=*/false);
          s->since_correction.clear();
          take(*s);
        }
      }
      if (!cancelled && !speculating.empty()) {
        // One draft/verify cycle of every speculating sequence, batched (their draft steps and
        // verifications as batched steps); each token taken in turn.
        std::vector<SpeculativeDecoder*> decoders;
        std::vector<int> limits;
        std::vector<std::vector<int32_t>> cycle_out(speculating.size());
        std::vector<std::vector<int32_t>*> outs;
        for (size_t j = 0; j < speculating.size(); ++j) {
          Sequence& s = *speculating[j];
          decoders.push_back(s.spec.get());
          limits.push_back(s.request.max_tokens - int(s.out.tokens.size()));
          outs.push_back(&cycle_out[j]);
        }
        SpeculativeDecoder::cycle_batch(decoders, limits, outs);
        for (size_t j = 0; j < speculating.size(); ++j)
          for (const int32_t token : cycle_out[j]) {
            if (cancelled || speculating[j]->done) break;
            if (!accept(*speculating[j], token, timer, on_step)) cancelled = true;
          }
      }
      // Finished sequences leave in the step that finished them, their KV given back.
      for (auto& s : running)
        if (s->done || cancelled) {
          if (!s->done) s->out.finish_reason = "cancelled";
          kv_used -= capacity(s->request);
          finish(*s, timer);
          s.reset();
        }
      std::erase(running, nullptr);
    }
    for (size_t i : waiting) out[i].finish_reason = "cancelled";
    return out;
  }

  // The retrieval evaluation (eval/runner.h) on this engine; called without the GIL.
  std::vector<EvalRecord> evaluate(const EvalConfig& config, const EvalProgress& progress) {
    std::lock_guard<std::mutex> lock(mutex_);
    return run_eval(engine_, config, progress);
  }

  std::vector<int32_t> encode_chat(const std::vector<std::pair<std::string, std::string>>& messages,
                                   bool add_generation_prompt) const {
    LY_CHECK(!messages.empty(), ErrorCode::kInvalidArgument, "messages: the conversation is empty");
    std::vector<ChatMessage> chat;
    for (const auto& [role, content] : messages) chat.push_back({role, content});
    return lychee::encode_chat(engine_.tokenizer(), chat, add_generation_prompt);
  }

 private:
  // A request of a batch while it runs.
  struct Sequence {
    Sequence(size_t index, const Request& request, Completion& out)
        : index(index), request(request), out(out), text(request.stop), sampler(request.sampling) {}
    size_t index;
    const Request& request;
    Completion& out;
    server::TextStream text;
    Sampler sampler;
    std::unique_ptr<AttentionPolicy> policy;
    std::unique_ptr<Session> session;
    std::vector<int32_t> since_correction;  // tokens fed since the last cache correction
    std::unique_ptr<SpeculativeDecoder> spec;  // speculate: its cycles, from the prompt's end
    double decode_start = 0.0, t_last = 0.0;
    bool done = false;
  };

  // Samples s's next token from its session's last logits and takes it as generate() does (the
  // text, a stop token or string, max_tokens); false when on_step cancels.
  bool sample(Sequence& s, const Timer& call, const StepFn& on_step) {
    const Request& r = s.request;
    const int32_t token = s.session->sample(s.sampler);
    if (r.logprobs >= 0)
      s.out.logprobs.push_back(server::token_logprob(s.session->logits(), token, r.logprobs, engine_.tokenizer()));
    return accept(s, token, call, on_step);
  }

  // Takes s's next token (sampled, or a speculative cycle's): its text, a stop token or string,
  // max_tokens; false when on_step cancels.
  bool accept(Sequence& s, int32_t token, const Timer& call, const StepFn& on_step) {
    const Request& r = s.request;
    const Tokenizer& tok = engine_.tokenizer();
    s.t_last = call.seconds();
    if (s.out.tokens.empty()) s.out.ttft = s.t_last;
    s.out.tokens.push_back(token);
    const std::string piece = s.text.push(token_text(token));
    s.out.text += piece;
    if (!on_step(s.index, piece)) return false;
    const std::vector<int32_t>& stop_ids = tok.stop_ids();
    const bool stop_token = !r.ignore_eos && std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
    if (stop_token || s.text.stopped()) s.out.finish_reason = "stop";
    else if (int(s.out.tokens.size()) == r.max_tokens) s.out.finish_reason = "length";
    else return true;
    s.done = true;
    if (!s.text.stopped()) {
      const std::string tail = s.text.finish();
      s.out.text += tail;
      if (!tail.empty()) return on_step(s.index, tail);
    }
    return true;
  }

  void finish(Sequence& s, const Timer& call) {
    Completion& out = s.out;
    if (!out.tokens.empty()) {
      out.decode_seconds = call.seconds() - s.decode_start;
      out.tpot = out.tokens.size() > 1 ? (s.t_last - out.ttft) / double(out.tokens.size() - 1) : 0.0;
    }
    if (s.spec) {
      out.drafted = s.spec->stats().drafted;
      out.accepted = s.spec->stats().accepted;
    }
    add_stats(out, *s.session);
  }

  // The checks every request passes before it runs; its policy's options.
  PolicyOptions check(const Request& r) const {
    const Tokenizer& tok = engine_.tokenizer();
    LY_CHECK(!r.prompt.empty(), ErrorCode::kInvalidArgument, "the prompt is empty (no tokens)");
    for (size_t i = 0; i < r.prompt.size(); ++i)
      LY_CHECK(r.prompt[i] >= 0 && r.prompt[i] < tok.vocab_size(), ErrorCode::kInvalidArgument,
               "prompt token {} at index {} is outside the vocabulary [0, {})", r.prompt[i], i, tok.vocab_size());
    LY_CHECK(r.max_tokens >= 0, ErrorCode::kInvalidArgument, "max_tokens must be >= 0, got {}", r.max_tokens);
    LY_CHECK(r.correct_every >= 0, ErrorCode::kInvalidArgument, "correct_every must be >= 0, got {}",
             r.correct_every);
    LY_CHECK(r.logprobs >= -1, ErrorCode::kInvalidArgument, "logprobs must be >= 0 (or None), got {}", r.logprobs);
    for (const std::string& s : r.stop)
      LY_CHECK(!s.empty(), ErrorCode::kInvalidArgument, "stop: an empty stop string would end every generation");
    check_prompt_fits(int64_t(r.prompt.size()), context_);
    r.sampling.validate();
    parse_speculate(r.speculate, "speculate");
    return policy_options(r.policy, r.roles, engine_.config());
  }

  // A request's sequence length: its prompt and max_tokens within the context.
  int capacity(const Request& r) const {
    return std::min(context_, int(r.prompt.size()) + std::max(r.max_tokens, 1));
  }

  Completion begin(const Request& r, const PolicyOptions& po) const {
    Completion out;
    out.policy = po.label();
    out.model = model_name_;
    out.chat = r.chat;
    out.seed = r.sampling.seed;
    out.prompt_tokens = int(r.prompt.size());
    out.with_logprobs = r.logprobs >= 0;
    return out;
  }

  // A token's bytes in the text: none for a special token (or an id past the tokenizer's vocabulary).
  std::string token_text(int32_t token) const {
    const Tokenizer& tok = engine_.tokenizer();
    return token < tok.vocab_size() && !tok.is_special(token) ? tok.token_piece(token) : std::string();
  }

  void add_stats(Completion& out, const Session& session) const {
    const int head_dim = engine_.config().head_dim;
    const KvReadStats& s = session.stats();
    // Bytes as the GPU's pages of this KV dtype hold them (bf16, or FP8 codes and scales).
    const int64_t token_head_bytes = kv_bytes_per_token_head(engine_.kv_cache_dtype(), head_dim);
    out.kv_bytes_read = s.kv_bytes_at(token_head_bytes);
    out.kv_bytes_dense = s.dense_kv_bytes_at(token_head_bytes);
    out.decode_steps = s.decode_steps;
  }

  // The KV budget of a batch in tokens, as the server's: kv_memory over the bytes a token's K and V
  // take in every layer (f32 on the CPU; bf16, or FP8 codes and scales, on the GPU:
  // Engine::kv_tokens_for_memory); without kv_memory max_batch x context.
  int64_t kv_budget(double kv_memory_gib) const {
    if (kv_memory_gib <= 0.0) return int64_t(max_batch_) * context_;
    return engine_.kv_tokens_for_memory(kv_memory_gib);
  }

  static EngineOptions options(const std::string& model, const std::string& device, double kv_memory,
                               int max_context, int threads, int tensor_parallel, const std::string& weights,
                               const std::string& cpu_weights, const PolicyList& policies, int max_batch,
                               const std::string& kv_cache_dtype) {
    LY_CHECK(device == "auto" || device == "cpu" || device == "cuda", ErrorCode::kInvalidArgument,
             "device must be \"auto\", \"cpu\" or \"cuda\", got \"{}\"", device);
    LY_CHECK(kv_memory >= 0, ErrorCode::kInvalidArgument, "kv_memory must be >= 0 GiB, got {}", kv_memory);
    LY_CHECK(max_context >= 0, ErrorCode::kInvalidArgument, "max_context must be >= 0, got {}", max_context);
    LY_CHECK(threads >= 0, ErrorCode::kInvalidArgument, "threads must be >= 0, got {}", threads);
    LY_CHECK(tensor_parallel >= 1, ErrorCode::kInvalidArgument, "tensor_parallel must be >= 1, got {}",
             tensor_parallel);
    LY_CHECK(max_batch >= 1, ErrorCode::kInvalidArgument, "max_batch must be >= 1, got {}", max_batch);
    set_compute_threads(threads);
    EngineOptions o;
    o.model_path = model;
    o.device = device;
    o.kv_memory_gib = kv_memory;
    o.max_context = max_context;
    o.max_batch = max_batch;
    o.tensor_parallel = tensor_parallel;
    o.gpu_weights = gpu_format(weights);
    o.cpu_weights = cpu_format(cpu_weights);
    const std::optional<KvCacheDtype> kv = kv_cache_dtype_from_name(kv_cache_dtype);
    LY_CHECK(kv.has_value(), ErrorCode::kInvalidArgument,
             "kv_cache_dtype must be \"bf16\", \"fp8\", \"auto\" (= bf16) or \"fp8_e4m3\" (= fp8), got \"{}\"",
             kv_cache_dtype);
    o.kv_cache_dtype = *kv;
    // The policies the engine will run, as the CLI's --policy gives them: FP8 weights keep the
    // selecting layers' Q/K/V unrounded, tensor parallelism balances their dense heads, and "auto"
    // passes over a GPU that cannot run one of them.
    if (!policies.empty())
      o.policies = [policies](const ModelConfig& c) {
        std::vector<DecodeSpec> specs;
        for (const auto& [settings, roles] : policies) specs.push_back(compile_policy(policy_options(settings, roles, c), c));
        return specs;
      };
    return o;
  }

  // The formats by the names the CLI's --weights / --cpu-weights take (model/checkpoint.h lists
  // them; the error names them all: '"a", "b" or "c"').
  static std::string choices(const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i)
      s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("\"" + names[i] + "\"");
    return s;
  }
  static GpuWeightFormat gpu_format(const std::string& name) {
    const std::optional<GpuWeightFormat> f = gpu_weight_format_from_name(name);
    LY_CHECK(f.has_value(), ErrorCode::kInvalidArgument, "weights must be {}, got \"{}\"",
             choices(gpu_weight_format_names()), name);
    return *f;
  }
  static WeightFormat cpu_format(const std::string& name) {
    const std::optional<WeightFormat> f = weight_format_from_name(name);
    LY_CHECK(f.has_value(), ErrorCode::kInvalidArgument, "cpu_weights must be {}, got \"{}\"",
             choices(weight_format_names()), name);
    return *f;
  }

  Engine engine_;
  int context_;
  std::string weights_;
  std::string model_name_;
  int max_batch_;
  int64_t kv_tokens_;
  std::mutex mutex_;
  std::atomic<bool> streaming_{false};
};

// Runs fn (a generation) without the GIL; step(index, piece) is called with the GIL held for every
// token, and a Python exception there (from on_text, or KeyboardInterrupt from the signal check)
// cancels the generation and is raised here.
template <typename Fn>
auto run_without_gil(nb::object on_text, Fn&& fn) {
  std::optional<nb::python_error> error;
  StepFn step = [&](size_t, const std::string& piece) {
    nb::gil_scoped_acquire acquire;
    try {
      if (!piece.empty() && on_text.is_valid() && !on_text.is_none()) on_text(utf8_str(piece));
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    } catch (nb::python_error& err) {
      error.emplace(std::move(err));
      return false;
    }
    return true;
  };
  decltype(fn(step)) result;
  {
    nb::gil_scoped_release release;
    result = fn(step);
  }
  if (error) throw std::move(*error);
  return result;
}

Completion generate_one(PyEngine& e, const Request& r, nb::object on_text) {
  e.check_idle();
  return run_without_gil(on_text, [&](const StepFn& step) { return e.run(r, step); });
}

std::vector<Completion> generate_batch(PyEngine& e, const std::vector<Request>& requests) {
  e.check_idle();
  return run_without_gil(nb::none(), [&](const StepFn& step) { return e.run_batch(requests, step); });
}

// stream(): the generation on a worker thread, its pieces handed over through a queue. The worker
// never touches Python; closing or dropping the stream cancels the generation and joins. The
// engine is marked busy from the start to the worker's end.
class Stream {
 public:
  Stream(PyEngine* engine, Request request) : engine_(engine) {
    engine_->begin_stream();
    worker_ = std::thread([this, r = std::move(request)] {
      try {
        Completion c = engine_->run(r, [this](size_t, const std::string& piece) {
          if (!piece.empty()) {
            std::lock_guard<std::mutex> lock(mutex_);
            pieces_.push_back(piece);
            ready_.notify_one();
          }
          return !cancel_.load();
        });
        std::lock_guard<std::mutex> lock(mutex_);
        completion_ = std::move(c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
      }
      engine_->end_stream();  // before done_: a reader that saw the end finds the engine free
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      ready_.notify_one();
    });
  }
  ~Stream() { close(); }

  // The next piece of text; StopIteration at the end; the engine's error, or KeyboardInterrupt
  // (the generation cancelled), as an exception.
  nb::str next() {
    while (true) {
      std::optional<std::string> piece;
      bool finished = false;
      {
        nb::gil_scoped_release release;
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait_for(lock, std::chrono::milliseconds(50), [this] { return !pieces_.empty() || done_; });
        if (!pieces_.empty()) {
          piece = std::move(pieces_.front());
          pieces_.pop_front();
        } else {
          finished = done_;
        }
      }
      if (piece) return utf8_str(*piece);
      if (finished) {
        join();
        if (error_) std::rethrow_exception(error_);
        throw nb::stop_iteration();
      }
      if (PyErr_CheckSignals() != 0) {
        nb::python_error interrupt;  // fetched before anything else can clear it
        close();
        throw interrupt;
      }
    }
  }

  // Cancels a generation still running (after its current token) and waits for the worker.
  void close() {
    cancel_ = true;
    if (worker_.joinable()) {
      if (PyGILState_Check()) {
        nb::gil_scoped_release release;
        worker_.join();
      } else {
        worker_.join();
      }
    }
  }

  // The finished generation's text and statistics (None while it runs or after an error).
  std::optional<Completion> completion() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ ? completion_ : std::nullopt;
  }

  // Whether the generation still runs (holding the engine).
  bool running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !done_;
  }

 private:
  void join() {
    if (worker_.joinable()) {
      nb::gil_scoped_release release;
      worker_.join();
    }
  }

  PyEngine* engine_;  // kept alive by the stream's Python object (keep_alive)
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::string> pieces_;
  std::optional<Completion> completion_;
  std::exception_ptr error_;
  bool done_ = false;
  std::atomic<bool> cancel_{false};
};

}  // namespace


nb::list evaluate(PyEngine& e, const std::vector<std::string>& tasks, const std::vector<int>& lengths,
                  const std::vector<double>& depths, const PolicyList& policies, int samples, uint64_t seed,
                  const std::string& haystack, int correct_every, nb::object progress) {
  const ModelConfig& c = e.engine().config();
  LY_CHECK(!tasks.empty(), ErrorCode::kInvalidArgument, "tasks: no task given");
  LY_CHECK(!lengths.empty(), ErrorCode::kInvalidArgument, "lengths: no length given");
  LY_CHECK(!policies.empty(), ErrorCode::kInvalidArgument, "policies: no policy given");
  LY_CHECK(samples > 0, ErrorCode::kInvalidArgument, "samples must be positive, got {}", samples);
  LY_CHECK(haystack == "essays" || haystack == "synthetic", ErrorCode::kInvalidArgument,
           "haystack must be \"essays\" or \"synthetic\", got \"{}\"", haystack);
  EvalConfig config;
  for (const std::string& t : tasks) config.tasks.push_back(parse_task_name(t));
  config.lengths = lengths;
  config.depths = depths;
  config.samples = samples;
  config.seed = seed;
  config.synthetic_haystack = haystack == "synthetic";
  config.correct_every = correct_every;
  for (const auto& [settings, roles] : policies) config.policies.push_back(policy_options(settings, roles, c));
  std::vector<EvalRecord> records;
  e.check_idle();
  {
    nb::gil_scoped_release release;
    // Progress lines reach Python with the GIL held; an exception there (KeyboardInterrupt from
    // the signal check included) unwinds the evaluation and is raised to the caller.
    records = e.evaluate(config, [&progress](const std::string& line) {
      nb::gil_scoped_acquire acquire;
      if (!progress.is_none()) progress(utf8_str(line));
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    });
  }
  nb::list out;
  for (const EvalRecord& r : records) {
    nb::dict d;
    d["task"] = r.task;
    d["length"] = r.length;
    d["depth"] = r.depth;
    d["seed"] = r.seed;
    d["policy"] = r.policy;
    d["policy_label"] = r.policy_label;
    d["budget"] = r.budget;
    d["score"] = r.score;
    d["kv_bytes_read"] = r.kv_bytes_read;
    d["kv_bytes_dense"] = r.kv_bytes_dense;
    d["decode_steps"] = r.decode_steps;
    d["prompt_tokens"] = r.prompt_tokens;
    d["output"] = utf8_str(r.output);
    out.append(d);
  }
  return out;
}

void bind_engine(nb::module_& m) {
  nb::class_<PolicySettings>(m, "PolicySettings",
                             "An attention policy by name and options, as the CLI's --policy flags (lychee.policy builds these)")
      .def(nb::init<>())
      .def_rw("policy", &PolicySettings::policy)
      .def_rw("budget", &PolicySettings::budget)
      .def_rw("block_size", &PolicySettings::block_size)
      .def_rw("select", &PolicySettings::select)
      .def_rw("select_value", &PolicySettings::select_value)
      .def_rw("sink", &PolicySettings::sink)
      .def_rw("recent", &PolicySettings::recent)
      .def_rw("heads", &PolicySettings::heads)
      .def_rw("tidal_layers", &PolicySettings::tidal_layers)
      .def_rw("quest_page", &PolicySettings::quest_page)
      .def_rw("duo_sink", &PolicySettings::duo_sink)
      .def_rw("duo_recent", &PolicySettings::duo_recent);

  nb::class_<Request>(m, "Request",
                      "One generation request in the engine's terms (lychee.SamplingParams builds these)")
      .def(nb::init<>())
      .def_rw("prompt", &Request::prompt, "the prompt's token ids")
      .def_rw("max_tokens", &Request::max_tokens)
      .def_prop_rw("temperature", [](const Request& r) { return r.sampling.temperature; },
                   [](Request& r, float v) { r.sampling.temperature = v; })
      .def_prop_rw("top_p", [](const Request& r) { return r.sampling.top_p; },
                   [](Request& r, float v) { r.sampling.top_p = v; })
      .def_prop_rw("top_k", [](const Request& r) { return r.sampling.top_k; },
                   [](Request& r, int v) { r.sampling.top_k = v; })
      .def_prop_rw("seed", [](const Request& r) { return r.sampling.seed; },
                   [](Request& r, uint64_t v) { r.sampling.seed = v; })
      .def_rw("stop", &Request::stop)
      .def_rw("ignore_eos", &Request::ignore_eos)
      .def_rw("correct_every", &Request::correct_every)
      .def_rw("speculate", &Request::speculate)
      .def_rw("logprobs", &Request::logprobs, "-1: off; n >= 0: each token's log-probability and the n likeliest")
      .def_rw("chat", &Request::chat, "a chat reply (its OpenAI form is a chat.completion)")
      .def_rw("policy", &Request::policy)
      .def_rw("roles", &Request::roles, "head roles overriding the policy's file");

  nb::class_<Completion>(m, "Completion",
                         "A finished generation: its text, tokens and statistics.\n\n"
                         "to_openai() gives the OpenAI response object (a dict) the server would send.")
      .def_prop_ro("text_bytes", [](const Completion& c) { return nb::bytes(c.text.data(), c.text.size()); },
                   "The text as UTF-8 bytes (a token may end inside a character).")
      .def_prop_ro("text", [](const Completion& c) { return utf8_str(c.text); },
                   "The generated text (stop strings and special tokens left out).")
      .def_ro("tokens", &Completion::tokens, "Every generated token id (a stop token included).")
      .def_ro("finish_reason", &Completion::finish_reason,
              "\"stop\" (a stop token or string), \"length\" (max_tokens) or \"cancelled\".")
      .def_ro("policy", &Completion::policy, "The attention policy's label.")
      .def_ro("model", &Completion::model, "The model's name (a GGUF file's stem, a directory's name).")
      .def_ro("seed", &Completion::seed, "The sampler's seed (drawn at random when none was given).")
      .def_ro("prompt_tokens", &Completion::prompt_tokens, "Tokens in the prompt.")
      .def_prop_ro("completion_tokens", [](const Completion& c) { return c.tokens.size(); },
                   "Tokens generated (len(tokens)).")
      .def_ro("ttft", &Completion::ttft, "Seconds from the call to the first token.")
      .def_ro("tpot", &Completion::tpot, "Mean seconds per output token after the first.")
      .def_ro("prefill_seconds", &Completion::prefill_seconds, "Seconds from the prompt's prefill to its first token (on the GPU the queued prefill work included).")
      .def_ro("decode_seconds", &Completion::decode_seconds, "Seconds from the first token to the last.")
      .def_ro("kv_bytes_read", &Completion::kv_bytes_read, "K and V bytes the decode steps read (bf16 pages, or FP8 codes and scales with kv_cache_dtype=\"fp8\").")
      .def_ro("kv_bytes_dense", &Completion::kv_bytes_dense, "What full attention would have read.")
      .def_ro("decode_steps", &Completion::decode_steps, "Decode steps run (one per token after the first).")
      .def_ro("drafted", &Completion::drafted, "Speculative decoding: tokens the draft policy proposed (0 without speculate).")
      .def_ro("accepted", &Completion::accepted, "Speculative decoding: of the drafted tokens, those Full's verification accepted.")
      .def_prop_ro("logprobs",
                   [](const Completion& c) -> nb::object {
                     if (!c.with_logprobs) return nb::none();
                     nb::list out;
                     for (const server::TokenLogprob& t : c.logprobs) {
                       nb::list top;
                       for (const server::TopLogprob& a : t.top) {
                         nb::dict d;
                         d["token"] = utf8_str(a.token);
                         d["logprob"] = a.logprob;
                         top.append(d);
                       }
                       nb::dict d;
                       d["token"] = utf8_str(t.token);
                       d["logprob"] = t.logprob;
                       d["top_logprobs"] = top;
                       out.append(d);
                     }
                     return out;
                   },
                   "With SamplingParams.logprobs = n: per token {\"token\", \"logprob\", \"top_logprobs\": the n "
                   "likeliest as {\"token\", \"logprob\"}} (natural log); None otherwise.")
      .def("to_openai", [](const Completion& c) { return json_to_python(c.openai()); },
           "The OpenAI response object as a dict, as lychee serve sends it: a chat.completion for chat() (choices[0]\n"
           ".message {role, content}), a text_completion for generate() (choices[0].text); id, created, model,\n"
           "finish_reason, usage {prompt_tokens, completion_tokens, total_tokens}, logprobs when asked for.")
      .def("__repr__", [](const Completion& c) {
        return nb::str("Completion(tokens={}, finish_reason={!r}, ttft={:.4f}, tpot={:.4f}, kv_bytes_read={}, text={!r})")
            .format(c.tokens.size(), c.finish_reason, c.ttft, c.tpot, c.kv_bytes_read, utf8_str(c.text));
      });

  nb::class_<Stream>(m, "Stream",
                     "Iterator over the text pieces of a generation running on a worker thread.\n\n"
                     "While it generates, the engine takes no other request (EngineBusyError): read it to its end,\n"
                     "close() it, or use it in a with block.")
      .def("__iter__", [](nb::handle self) { return self; }, "The stream itself.")
      .def("__next__", &Stream::next, "The next piece of text (StopIteration at the end).")
      .def("close", &Stream::close, "Cancels the generation (after its current token) and waits for it.")
      .def("__enter__", [](nb::handle self) { return self; }, "The stream itself.")
      .def("__exit__", [](Stream& s, nb::args) { s.close(); }, "close().")
      .def_prop_ro("running", &Stream::running, "Whether the generation still runs (and holds the engine).")
      .def_prop_ro("completion", &Stream::completion,
                   "The finished generation's Completion (None until the generation has ended).");

  nb::class_<PyEngine>(m, "Engine", "A loaded model on a device (use lychee.Engine)")
      .def("__init__",
           [](PyEngine* self, const std::string& model, const std::string& device, double kv_memory, int max_context,
              int threads, int tensor_parallel, const std::string& weights, const std::string& cpu_weights,
              const PolicyList& policies, int max_batch, const std::string& kv_cache_dtype) {
             nb::gil_scoped_release release;
             new (self) PyEngine(model, device, kv_memory, max_context, threads, tensor_parallel, weights, cpu_weights,
                                 policies, max_batch, kv_cache_dtype);
           },
           nb::arg("model") = "", nb::arg("device") = "auto", nb::arg("kv_memory") = 0.0, nb::arg("max_context") = 0,
           nb::arg("threads") = 0, nb::arg("tensor_parallel") = 1, nb::arg("weights") = "bf16",
           nb::arg("cpu_weights") = "native", nb::arg("policies") = PolicyList{}, nb::arg("max_batch") = 8,
           nb::arg("kv_cache_dtype") = "bf16")
      .def_prop_ro("device", [](const PyEngine& e) { return e.engine().device(); }, "\"cpu\" or \"cuda\"")
      .def_prop_ro("model_path", [](const PyEngine& e) { return e.engine().checkpoint().path(); },
                   "the model's file or directory")
      .def_prop_ro("model_name", &PyEngine::model_name, "the model's name, as the server reports it")
      .def_prop_ro("fp8_kept_layers", [](const PyEngine& e) { return e.engine().fp8_kept_qkv_layers(); },
                   "FP8 weights: the layers whose Q/K/V stay unrounded (the policies at load select there)")
      .def_prop_ro("weights", &PyEngine::weights,
                   "the weight format in use: bf16 or fp8 on the GPU; f32, native, fp8 or bf16 on the CPU")
      .def_prop_ro("kv_cache_dtype", [](const PyEngine& e) { return kv_cache_dtype_name(e.engine().kv_cache_dtype()); },
                   "how the KV cache holds K/V: \"bf16\" or \"fp8\" (e4m3, a scale per token and KV head)")
      .def_prop_ro("context", &PyEngine::context, "the longest sequence (prompt + generated tokens)")
      .def_prop_ro("max_batch", &PyEngine::max_batch, "the most sequences a batch runs at once")
      .def_prop_ro("kv_tokens", &PyEngine::kv_tokens, "the KV budget of a batch in tokens")
      .def_prop_ro("config",
                   [](const PyEngine& e) {
                     const ModelConfig& c = e.engine().config();
                     nb::dict d;
                     d["name"] = c.name;
                     d["architecture"] = c.arch_label;
                     d["n_layers"] = c.n_layers;
                     d["d_model"] = c.d_model;
                     d["n_heads"] = c.n_heads;
                     d["n_kv_heads"] = c.n_kv_heads;
                     d["head_dim"] = c.head_dim;
                     d["d_ff"] = c.d_ff;
                     d["vocab_size"] = c.vocab_size;
                     d["max_context"] = c.max_context;
                     d["rms_eps"] = c.rms_eps;
                     d["rope_theta"] = c.rope_theta;
                     d["tie_embeddings"] = c.tie_embeddings;
                     return d;
                   },
                   "the model's configuration")
      .def_prop_ro("stop_ids", [](const PyEngine& e) { return e.engine().tokenizer().stop_ids(); },
                   "the token ids that end a generation")
      .def_prop_ro("add_bos", [](const PyEngine& e) { return e.engine().tokenizer().add_bos_default(); },
                   "whether a prompt starts with BOS by default")
      .def("tokenize",
           [](const PyEngine& e, const std::string& text, bool add_bos, bool parse_special) {
             return e.engine().tokenizer().encode(text, add_bos, parse_special);
           },
           nb::arg("text"), nb::arg("add_bos"), nb::arg("parse_special") = true, "Token ids of text")
      .def("detokenize",
           [](const PyEngine& e, const std::vector<int32_t>& ids, bool skip_special) {
             return utf8_str(e.engine().tokenizer().decode(ids, skip_special));
           },
           nb::arg("ids"), nb::arg("skip_special") = false, "The text of token ids")
      .def("encode_chat", &PyEngine::encode_chat, nb::arg("messages"), nb::arg("add_generation_prompt") = true,
           "The token ids of (role, content) messages in the model's chat template")
      .def("default_head_roles", [](const PyEngine& e) { return default_head_roles(e.engine().config()); },
           "The TidalDecode-matched stand-in the policies use when no head-role file is given")
      .def("load_head_roles",
           [](const PyEngine& e, const std::string& path) { return load_head_roles(path, e.engine().config()); },
           nb::arg("path"), "A head-role file, validated against this model")
      .def("evaluate", &evaluate, nb::arg("tasks"), nb::arg("lengths"), nb::arg("depths"), nb::arg("policies"),
           nb::arg("samples"), nb::arg("seed"), nb::arg("haystack"), nb::arg("correct_every"), nb::arg("progress").none(),
           "Retrieval accuracy and KV bytes read of each policy (eval/runner.h): one record per (sample, policy)")
      .def("generate", &generate_one, nb::arg("request"), nb::arg("on_text").none(),
           "One generation on the calling thread; on_text gets each piece of text")
      .def("generate_batch", &generate_batch, nb::arg("requests"),
           "Generations by continuous batching (max_batch at once), one Completion per request, in order")
      .def("stream",
           [](PyEngine& e, Request request) {
             e.check_idle();
             return new Stream(&e, std::move(request));
           },
           nb::arg("request"), "One generation on a worker thread: a Stream of its pieces of text",
           nb::rv_policy::take_ownership, nb::keep_alive<0, 1>());  // the stream keeps the engine alive
}

}  // namespace lychee::py
