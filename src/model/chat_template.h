// The model's own chat template (Jinja), run by llama.cpp's Jinja engine
// (third_party/llama.cpp-jinja; why that engine: docs/chat-templates.md). The template comes from
// tokenizer_config.json's chat_template, chat_template.jinja or GGUF tokenizer.chat_template
// (Tokenizer::chat_template_source); a model without one gets ChatML. Rendering follows
// transformers' apply_chat_template(..., tokenize=False): trim_blocks and lstrip_blocks on, the
// variables messages, add_generation_prompt, bos_token, eos_token, tools (none) and documents
// (none), plus raise_exception and strftime_now (tests/data/chat_templates holds the goldens).
//
// The rendered text remembers which bytes came from the messages' content: encode_chat parses
// special tokens only outside them, so a user who types "<|im_start|>" gets that text, not the
// role token.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lychee {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // More template variables (tools, enable_thinking, date_string, ...): a JSON object whose keys
  // override the defaults. Its strings count as user content (no special tokens parsed in them).
  // Ordered: tojson writes keys in the order given, as Python's json.dumps does.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  // The time strftime_now formats (local time); nullopt = now.
  std::optional<std::time_t> now;
};

struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content_spans;  // [begin, end) bytes of text from the messages
};

class ChatTemplate {
 public:
  // Parses source once (Error(kInvalidFile) naming the line on a syntax error). bos_token and
  // eos_token are the texts the template's variables of those names hold.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);
  // The tokenizer's template, or ChatML when it has none (Error(kUnsupported) when it has none
  // and its vocabulary lacks <|im_start|>).
  static ChatTemplate of(const Tokenizer& tokenizer);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Throws Error(kInvalidArgument) with the template's message when it calls raise_exception
  // (e.g. a system message to a template without a system role) or fails on the input.
  // Thread-safe: the parsed template is read-only.
  RenderedChat render(const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) const;

  const std::string& source() const { return source_; }
  bool is_fallback() const { return fallback_; }  // ChatML stood in for a missing template

 private:
  struct Program;
  std::string source_, bos_token_, eos_token_;
  bool fallback_ = false;
  std::unique_ptr<Program> program_;
};

// The ChatML template used when a model has none.
extern const std::string_view kChatMLTemplate;

// Token ids of a rendered chat (no BOS added: templates write their own): special tokens are
// parsed in the template's text and never inside content_spans.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const RenderedChat& chat);

// ChatTemplate::of(tokenizer).render(...), then encode_chat: the prompt ids of a conversation.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt = true);
// The rendered text alone (for prompts that continue after the template's output).
std::string render_chat(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt = true);

}  // namespace lychee
