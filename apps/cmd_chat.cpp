// lychee chat: a conversation in the model's chat template; one-shot with -p, else interactive.
#include <cstdio>
#include <iostream>
#include <memory>

#include "app.h"
#include "core/error.h"
#include "model/chat_template.h"

namespace lychee::app {

namespace {

struct ChatArgs {
  ModelArgs model;
  SamplingArgs sampling;
  PolicyArgs policy;
  std::string prompt;
  std::string system;
  bool stats = false;
};

// Runs one assistant turn: renders the whole conversation, feeds what the session has not seen
// yet, streams the reply and appends it to the history.
void assistant_turn(Engine& engine, Session& session, std::vector<ChatMessage>& history,
                    std::vector<int32_t>& fed, const GenerateOptions& options, bool stats) {
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<int32_t> ids = encode_chat(tok, history);
  // Reuse the cached prefix the new rendering shares with what was fed before.
  size_t common = 0;
  while (common < fed.size() && common < ids.size() && fed[common] == ids[common]) ++common;
  if (common == ids.size()) --common;  // always feed at least one token
  session.truncate(int(common));
  std::vector<int32_t> todo(ids.begin() + long(common), ids.end());
  GenerateResult r = generate(session, todo, options, print_tokens(tok));
  std::printf("\n");
  if (stats) print_speculation_stats(r);
  std::vector<int32_t> reply = r.tokens;
  if (r.finish_reason == "stop" && !reply.empty()) reply.pop_back();
  history.push_back({"assistant", tok.decode(reply, true)});
  fed = ids;
  fed.insert(fed.end(), r.tokens.begin(), r.tokens.end());
  fed.resize(size_t(session.length()));
}

void run_chat(const ChatArgs& a) {
  Engine engine(a.model.engine_options(&a.policy));
  GenerateOptions options = a.sampling.generate_options(engine);
  a.policy.apply(options);
  const int ctx = a.model.max_context;
  std::unique_ptr<Session> session = engine.new_session(ctx > 0 ? ctx : std::min(engine.config().max_context, 8192));
  // The seed is printed so that a sampled conversation can be repeated with -s.
  if (a.stats) std::fprintf(stderr, "[seed %llu]\n", static_cast<unsigned long long>(options.sampling.seed));
  std::unique_ptr<AttentionPolicy> policy =
      make_policy(a.policy.options(engine.config(), parse_policy_kind(a.policy.policy)), engine.config());
  session->set_policy(policy.get());
  std::vector<ChatMessage> history;
  if (!a.system.empty()) history.push_back({"system", a.system});
  std::vector<int32_t> fed;
  if (!a.prompt.empty()) {
    history.push_back({"user", a.prompt});
    assistant_turn(engine, *session, history, fed, options, a.stats);
    return;
  }
  std::fprintf(stderr, "lychee chat: type a message, an empty line or Ctrl-D to quit\n");
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    history.push_back({"user", line});
    assistant_turn(engine, *session, history, fed, options, a.stats);
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat with the model (one turn with -p, else interactive)");
  cmd->add_option("-p,--prompt", args->prompt, "One user message; answer it and exit")->group(kGroupInput);
  cmd->add_option("--system", args->system, "System message")->group(kGroupInput);
  cmd->add_flag("--stats", args->stats, "Print the seed (and speculative decoding's counts) to stderr")->group(kGroupInput);
  args->model.add(*cmd, "KV cache capacity in tokens (0 = min(model's context, 8192))");
  add_deprecated_alias(*cmd, "--ctx", args->model.max_context, "-c/--ctx-size")->check(positive_int());
  args->sampling.add(*cmd);
  args->policy.add(*cmd);
  args->policy.add_speculate(*cmd);
  cmd->callback([args] { run_chat(*args); });
}

}  // namespace lychee::app
