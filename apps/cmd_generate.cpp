// lychee generate: complete a prompt (raw, or wrapped in the model's chat template).
#include <cstdio>
#include <memory>

#include "app.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/chat_template.h"

namespace lychee::app {

namespace {

struct GenerateArgs {
  ModelArgs model;
  SamplingArgs sampling;
  PolicyArgs policy;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool chat = false;
  bool stats = false;
};

// The seed is printed so that a sampled run can be repeated with -s (llama.cpp prints its seed too).
void print_stats(const GenerateResult& r, uint64_t seed) {
  std::fprintf(stderr, "\n[prompt %d tokens in %.3f s (%.1f tok/s); generated %zu tokens in %.3f s (%.1f tok/s); %s; seed %llu]\n",
               r.n_prompt, r.prefill_seconds, r.n_prompt / std::max(r.prefill_seconds, 1e-9),
               r.tokens.size(), r.decode_seconds,
               r.tokens.size() > 1 ? (r.tokens.size() - 1) / std::max(r.decode_seconds, 1e-9) : 0.0,
               r.finish_reason.c_str(), static_cast<unsigned long long>(seed));
}

void run_generate(const GenerateArgs& a) {
  std::string text = a.prompt;
  if (!a.prompt_file.empty()) text = read_text_file(a.prompt_file);
  LY_CHECK(!text.empty(), ErrorCode::kInvalidArgument, "no prompt: pass -p TEXT or -f FILE");
  Engine engine(a.model.engine_options(&a.policy));
  const Tokenizer& tok = engine.tokenizer();
  std::vector<int32_t> ids;
  if (a.chat) {
    std::vector<ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", text});
    ids = encode_chat(tok, messages);
  } else {
    ids = tok.encode(text, tok.add_bos_default(), true);
  }
  GenerateOptions options = a.sampling.generate_options(engine);
  a.policy.apply(options);
  // Before any prefill: a prompt the context cannot hold fails at once, naming both lengths.
  const int ctx = a.model.max_context;
  check_prompt_fits(int64_t(ids.size()), ctx > 0 ? ctx : engine.config().max_context);
  const int capacity = ctx > 0 ? ctx : int(ids.size()) + options.max_new_tokens;
  std::unique_ptr<Session> session = engine.new_session(capacity);
  const PolicyKind kind = parse_policy_kind(a.policy.policy);
  std::unique_ptr<AttentionPolicy> policy = make_policy(a.policy.options(engine.config(), kind), engine.config());
  session->set_policy(policy.get());
  GenerateResult r = generate(*session, ids, options, print_tokens(tok));
  std::printf("\n");
  if (a.stats) {
    print_stats(r, options.sampling.seed);
    print_kv_stats(session->stats(), engine.config(), engine.kv_cache_dtype());
    print_speculation_stats(r);
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text")->group(kGroupInput);
  cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file")->check(CLI::ExistingFile)->group(kGroupInput);
  add_deprecated_alias(*cmd, "--prompt-file", args->prompt_file, "-f/--file")->check(CLI::ExistingFile);
  cmd->add_flag("--chat", args->chat, "Wrap the prompt as a user message in the model's chat template")->group(kGroupInput);
  cmd->add_option("--system", args->system, "System message (with --chat)")->group(kGroupInput);
  cmd->add_flag("--stats", args->stats, "Print timing and the seed to stderr")->group(kGroupInput);
  args->model.add(*cmd, "KV cache capacity in tokens (0 = prompt + max tokens)");
  add_deprecated_alias(*cmd, "--ctx", args->model.max_context, "-c/--ctx-size")->check(positive_int());
  args->sampling.add(*cmd);
  args->policy.add(*cmd);
  args->policy.add_speculate(*cmd);
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace lychee::app
