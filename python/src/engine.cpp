// lychee._lychee.Engine: a loaded model that generates, streams, tokenizes and renders chats.
// Generation is the runtime's generate() (runtime/generate.h) on a fresh session per call, with
// the policy compiled from PolicySettings (runtime/policy_settings.h) and stop strings cut by the
// server's TextStream (server/text_stream.h), so the CLI, the server and Python produce the same
// tokens and text.
//
// The GIL: released while the engine runs. generate() runs on the calling thread and takes the
// GIL back once per token to call the on_text callback and PyErr_CheckSignals (Ctrl-C stops the
// generation after the current token and raises KeyboardInterrupt; the engine stays usable).
// stream() runs the generation on a worker thread that never touches Python; the iterator waits
// for pieces with the GIL released and checks signals between waits. One generation runs at a
// time per engine (a mutex; a second caller waits with the GIL released), and a new request
// (generate, stream, chat, evaluate) cancels a stream that is still running: a stream whose
// consumer left it (a KeyboardInterrupt raised in the loop body, a break) cannot hold the engine.
#include <Python.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
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
#include "runtime/threads.h"
#include "server/text_stream.h"

namespace lychee::py {

namespace {

// What one generation asks for (the Python wrapper fills it from keyword arguments).
struct Request {
  std::vector<int32_t> prompt;
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;   // stop strings (cut from the text)
  bool ignore_eos = false;         // keep generating past the model's stop tokens
  int correct_every = 0;
  PolicySettings policy;
  std::optional<HeadRoles> roles;  // overrides policy.heads (a file) when set
};

struct Completion {
  std::string text;                 // UTF-8 bytes; stop strings and special tokens left out
  std::vector<int32_t> tokens;      // every generated token (a stop token included)
  std::string finish_reason;        // "stop" (stop token or string), "length", "cancelled"
  std::string policy;               // the policy's label
  int prompt_tokens = 0;
  double ttft = 0.0;                // seconds from the call to the first token (prefill + sampling)
  double tpot = 0.0;                // mean seconds per token after the first
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  uint64_t kv_bytes_read = 0;       // K and V bytes decode steps read (bf16 cache, as the CLI's --stats)
  uint64_t kv_bytes_dense = 0;      // what full attention would have read
  uint64_t decode_steps = 0;
};

// Called once per generated token with the text that became final (possibly ""); false stops.
using StepFn = std::function<bool(const std::string& piece)>;

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

class PyEngine {
 public:
  PyEngine(const std::string& model, const std::string& device, double kv_memory, int max_context, int threads,
           int tensor_parallel, const std::string& weights, const std::string& cpu_weights, const PolicyList& policies)
      : engine_(options(model, device, kv_memory, max_context, threads, tensor_parallel, weights, cpu_weights,
                        policies)),
        context_(max_context > 0 ? std::min(max_context, engine_.config().max_context) : engine_.config().max_context),
        weights_(engine_.device() == "cuda" ? weights : cpu_weights) {}

  const Engine& engine() const { return engine_; }
  int context() const { return context_; }
  // The weight format of the device in use: `weights` on the GPU, `cpu_weights` on the CPU.
  const std::string& weights() const { return weights_; }

  // Numbers requests in call order; a stream stops when a later request has begun.
  uint64_t begin_request() { return ++requests_; }
  bool superseded(uint64_t request) const { return requests_.load() != request; }

  // Runs one generation; called without the GIL. Special tokens add no text.
  Completion run(const Request& r, const StepFn& on_step) {
    std::lock_guard<std::mutex> lock(mutex_);
    Timer timer;  // TTFT counts the session and policy set-up too, as a caller sees it
    const Tokenizer& tok = engine_.tokenizer();
    const ModelConfig& c = engine_.config();
    LY_CHECK(!r.prompt.empty(), ErrorCode::kInvalidArgument, "the prompt is empty (no tokens)");
    for (size_t i = 0; i < r.prompt.size(); ++i)
      LY_CHECK(r.prompt[i] >= 0 && r.prompt[i] < tok.vocab_size(), ErrorCode::kInvalidArgument,
               "prompt token {} at index {} is outside the vocabulary [0, {})", r.prompt[i], i, tok.vocab_size());
    LY_CHECK(r.max_tokens >= 0, ErrorCode::kInvalidArgument, "max_tokens must be >= 0, got {}", r.max_tokens);
    for (const std::string& s : r.stop)
      LY_CHECK(!s.empty(), ErrorCode::kInvalidArgument, "stop: an empty stop string would end every generation");
    check_prompt_fits(int64_t(r.prompt.size()), context_);
    GenerateOptions options;
    options.max_new_tokens = r.max_tokens;
    options.sampling = r.sampling;
    options.sampling.validate();
    if (!r.ignore_eos) options.stop_ids = tok.stop_ids();
    options.correct_every = r.correct_every;
    const PolicyOptions po = policy_options(r.policy, r.roles, c);
    std::unique_ptr<AttentionPolicy> policy = make_policy(po, c);
    const int capacity = std::min(context_, int(r.prompt.size()) + std::max(r.max_tokens, 1));
    std::unique_ptr<Session> session = engine_.new_session(capacity);
    session->set_policy(policy.get());

    Completion out;
    out.policy = po.label();
    server::TextStream text(r.stop);
    bool cancelled = false;
    double t_first = 0.0, t_last = 0.0;
    const GenerateResult g = generate(*session, r.prompt, options, [&](int32_t token) {
      t_last = timer.seconds();
      if (out.tokens.empty()) t_first = t_last;
      out.tokens.push_back(token);
      const std::string piece = text.push(tok.is_special(token) ? std::string() : tok.token_piece(token));
      out.text += piece;
      if (!on_step(piece)) {
        cancelled = true;
        return false;
      }
      return !text.stopped();
    });
    if (!text.stopped() && !cancelled) {
      const std::string tail = text.finish();
      out.text += tail;
      if (!tail.empty()) on_step(tail);
    }
    out.finish_reason = cancelled ? "cancelled" : text.stopped() ? "stop" : g.finish_reason;
    out.prompt_tokens = g.n_prompt > 0 ? g.n_prompt : int(r.prompt.size());
    out.ttft = t_first;
    out.tpot = out.tokens.size() > 1 ? (t_last - t_first) / double(out.tokens.size() - 1) : 0.0;
    out.prefill_seconds = g.prefill_seconds;
    out.decode_seconds = g.decode_seconds;
    const KvReadStats& s = session->stats();
    out.kv_bytes_read = s.kv_bytes(c.head_dim);
    out.kv_bytes_dense = s.dense_kv_bytes(c.head_dim);
    out.decode_steps = s.decode_steps;
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
    const Tokenizer& tok = engine_.tokenizer();
    return tok.encode(render_chat(detect_chat_format(tok), chat, add_generation_prompt, default_system_prompt(tok)),
                      false, true);
  }

 private:
  static EngineOptions options(const std::string& model, const std::string& device, double kv_memory,
                               int max_context, int threads, int tensor_parallel, const std::string& weights,
                               const std::string& cpu_weights, const PolicyList& policies) {
    LY_CHECK(device == "auto" || device == "cpu" || device == "cuda", ErrorCode::kInvalidArgument,
             "device must be \"auto\", \"cpu\" or \"cuda\", got \"{}\"", device);
    LY_CHECK(kv_memory >= 0, ErrorCode::kInvalidArgument, "kv_memory must be >= 0 GiB, got {}", kv_memory);
    LY_CHECK(max_context >= 0, ErrorCode::kInvalidArgument, "max_context must be >= 0, got {}", max_context);
    LY_CHECK(threads >= 0, ErrorCode::kInvalidArgument, "threads must be >= 0, got {}", threads);
    LY_CHECK(tensor_parallel >= 1, ErrorCode::kInvalidArgument, "tensor_parallel must be >= 1, got {}",
             tensor_parallel);
    set_compute_threads(threads);
    EngineOptions o;
    o.model_path = model;
    o.device = device;
    o.kv_memory_gib = kv_memory;
    o.max_context = max_context;
    o.tensor_parallel = tensor_parallel;
    o.gpu_weights = gpu_format(weights);
    o.cpu_weights = cpu_format(cpu_weights);
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
  std::mutex mutex_;
  std::atomic<uint64_t> requests_{0};
};

// generate() on the calling thread: the GIL is taken back per token for on_text and the signal
// check; a Python exception from either stops the generation and is raised here.
Completion generate_blocking(PyEngine& e, const Request& r, nb::object on_text) {
  std::optional<nb::python_error> error;
  Completion c;
  e.begin_request();
  {
    nb::gil_scoped_release release;
    c = e.run(r, [&](const std::string& piece) {
      nb::gil_scoped_acquire acquire;
      try {
        if (!piece.empty() && on_text.is_valid() && !on_text.is_none()) on_text(utf8_str(piece));
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
      } catch (nb::python_error& err) {
        error.emplace(std::move(err));
        return false;
      }
      return true;
    });
  }
  if (error) throw std::move(*error);
  return c;
}

// stream(): the generation on a worker thread, its pieces handed over through a queue. The worker
// never touches Python; closing or dropping the stream cancels the generation and joins.
class Stream {
 public:
  Stream(PyEngine* engine, Request request) : engine_(engine), request_id_(engine->begin_request()) {
    worker_ = std::thread([this, r = std::move(request)] {
      try {
        Completion c = engine_->run(r, [this](const std::string& piece) {
          if (!piece.empty()) {
            std::lock_guard<std::mutex> lock(mutex_);
            pieces_.push_back(piece);
            ready_.notify_one();
          }
          return !cancel_.load() && !engine_->superseded(request_id_);
        });
        std::lock_guard<std::mutex> lock(mutex_);
        completion_ = std::move(c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
      }
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

 private:
  void join() {
    if (worker_.joinable()) {
      nb::gil_scoped_release release;
      worker_.join();
    }
  }

  PyEngine* engine_;  // kept alive by the stream's Python object (keep_alive)
  uint64_t request_id_;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::string> pieces_;
  std::optional<Completion> completion_;
  std::exception_ptr error_;
  bool done_ = false;
  std::atomic<bool> cancel_{false};
};

Request make_request(std::vector<int32_t> prompt, int max_tokens, float temperature, float top_p, int top_k,
                     uint64_t seed, std::vector<std::string> stop, bool ignore_eos, int correct_every,
                     const PolicySettings& policy, std::optional<HeadRoles> roles) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = SamplingParams{temperature, top_k, top_p, seed};
  r.stop = std::move(stop);
  r.ignore_eos = ignore_eos;
  r.correct_every = correct_every;
  r.policy = policy;
  r.roles = std::move(roles);
  return r;
}

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
  e.begin_request();
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

  nb::class_<Completion>(m, "Completion", "A finished generation: its text, tokens and statistics")
      .def_prop_ro("text_bytes", [](const Completion& c) { return nb::bytes(c.text.data(), c.text.size()); },
                   "the text as UTF-8 bytes (a token may end inside a character)")
      .def_prop_ro("text", [](const Completion& c) { return utf8_str(c.text); }, "the generated text")
      .def_ro("tokens", &Completion::tokens, "every generated token id (a stop token included)")
      .def_ro("finish_reason", &Completion::finish_reason, "\"stop\", \"length\" or \"cancelled\"")
      .def_ro("policy", &Completion::policy, "the attention policy's label")
      .def_ro("prompt_tokens", &Completion::prompt_tokens)
      .def_ro("ttft", &Completion::ttft, "seconds from the call to the first token")
      .def_ro("tpot", &Completion::tpot, "mean seconds per output token after the first")
      .def_ro("prefill_seconds", &Completion::prefill_seconds)
      .def_ro("decode_seconds", &Completion::decode_seconds)
      .def_ro("kv_bytes_read", &Completion::kv_bytes_read, "K and V bytes the decode steps read (bf16 cache)")
      .def_ro("kv_bytes_dense", &Completion::kv_bytes_dense, "what full attention would have read")
      .def_ro("decode_steps", &Completion::decode_steps)
      .def("__repr__", [](const Completion& c) {
        return nb::str("Completion(tokens={}, finish_reason={!r}, ttft={:.4f}, tpot={:.4f}, kv_bytes_read={}, text={!r})")
            .format(c.tokens.size(), c.finish_reason, c.ttft, c.tpot, c.kv_bytes_read, utf8_str(c.text));
      });

  nb::class_<Stream>(m, "Stream", "Iterator over the text pieces of a generation running on a worker thread")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &Stream::next)
      .def("close", &Stream::close, "Cancels the generation (after its current token) and waits for it")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](Stream& s, nb::args) { s.close(); })
      .def_prop_ro("completion", &Stream::completion,
                   "The finished generation's Completion (None until the iterator is exhausted)");

  nb::class_<PyEngine>(m, "Engine", "A loaded model on a device (use lychee.Engine)")
      .def("__init__",
           [](PyEngine* self, const std::string& model, const std::string& device, double kv_memory, int max_context,
              int threads, int tensor_parallel, const std::string& weights, const std::string& cpu_weights,
              const PolicyList& policies) {
             nb::gil_scoped_release release;
             new (self)
                 PyEngine(model, device, kv_memory, max_context, threads, tensor_parallel, weights, cpu_weights, policies);
           },
           nb::arg("model") = "", nb::arg("device") = "auto", nb::arg("kv_memory") = 0.0, nb::arg("max_context") = 0,
           nb::arg("threads") = 0, nb::arg("tensor_parallel") = 1, nb::arg("weights") = "bf16",
           nb::arg("cpu_weights") = "native", nb::arg("policies") = PolicyList{})
      .def_prop_ro("device", [](const PyEngine& e) { return e.engine().device(); })
      .def_prop_ro("model_path", [](const PyEngine& e) { return e.engine().checkpoint().path(); })
      .def_prop_ro("fp8_kept_layers", [](const PyEngine& e) { return e.engine().fp8_kept_qkv_layers(); },
                   "FP8 weights: the layers whose Q/K/V stay unrounded (the policies at load select there)")
      .def_prop_ro("weights", &PyEngine::weights,
                   "the weight format in use: bf16 or fp8 on the GPU; f32, native, fp8 or bf16 on the CPU")
      .def_prop_ro("context", &PyEngine::context, "the longest sequence (prompt + generated tokens)")
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
                   })
      .def_prop_ro("stop_ids", [](const PyEngine& e) { return e.engine().tokenizer().stop_ids(); })
      .def_prop_ro("add_bos", [](const PyEngine& e) { return e.engine().tokenizer().add_bos_default(); })
      .def("tokenize",
           [](const PyEngine& e, const std::string& text, bool add_bos, bool parse_special) {
             return e.engine().tokenizer().encode(text, add_bos, parse_special);
           },
           nb::arg("text"), nb::arg("add_bos"), nb::arg("parse_special") = true)
      .def("detokenize",
           [](const PyEngine& e, const std::vector<int32_t>& ids, bool skip_special) {
             return utf8_str(e.engine().tokenizer().decode(ids, skip_special));
           },
           nb::arg("ids"), nb::arg("skip_special") = false)
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
      .def("generate",
           [](PyEngine& e, std::vector<int32_t> prompt, int max_tokens, float temperature, float top_p, int top_k,
              uint64_t seed, std::vector<std::string> stop, bool ignore_eos, int correct_every,
              const PolicySettings& policy, std::optional<HeadRoles> roles, nb::object on_text) {
             return generate_blocking(e, make_request(std::move(prompt), max_tokens, temperature, top_p, top_k, seed,
                                                      std::move(stop), ignore_eos, correct_every, policy, std::move(roles)),
                                      on_text);
           },
           nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("temperature"), nb::arg("top_p"), nb::arg("top_k"),
           nb::arg("seed"), nb::arg("stop"), nb::arg("ignore_eos"), nb::arg("correct_every"), nb::arg("policy"),
           nb::arg("roles").none(), nb::arg("on_text").none())
      .def("stream",
           [](PyEngine& e, std::vector<int32_t> prompt, int max_tokens, float temperature, float top_p, int top_k,
              uint64_t seed, std::vector<std::string> stop, bool ignore_eos, int correct_every,
              const PolicySettings& policy, std::optional<HeadRoles> roles) {
             return new Stream(&e, make_request(std::move(prompt), max_tokens, temperature, top_p, top_k, seed,
                                                std::move(stop), ignore_eos, correct_every, policy, std::move(roles)));
           },
           nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("temperature"), nb::arg("top_p"), nb::arg("top_k"),
           nb::arg("seed"), nb::arg("stop"), nb::arg("ignore_eos"), nb::arg("correct_every"), nb::arg("policy"),
           nb::arg("roles").none(), nb::rv_policy::take_ownership,
           nb::keep_alive<0, 1>());  // the stream keeps the engine alive
}

}  // namespace lychee::py
