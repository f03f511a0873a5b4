// Built-in chat formats (no Jinja engine): ChatML and Llama-3. Rendering is byte-identical to
// transformers' apply_chat_template(..., tokenize=False) for SmolLM2's template and for a
// Llama-3-Instruct-style template (tests/golden/*/chat_cases.json).
//
// The rendered text already holds the special tokens (and, for Llama-3, <|begin_of_text|>):
// encode it with add_bos = false and parse_special = true.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lychee {

class Tokenizer;

enum class ChatFormat { kChatML, kLlama3 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

std::string_view chat_format_name(ChatFormat format);

// From the model's template text (<|im_start|> -> ChatML, <|start_header_id|> -> Llama-3); with no
// template, from the vocabulary (the same tokens, in that order). Else Error(kUnsupported).
ChatFormat detect_chat_format(const Tokenizer& tokenizer);

// ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n"
// when add_generation_prompt. Llama-3: "<|begin_of_text|>" before the first message, then
// "<|start_header_id|>{role}<|end_header_id|>\n\n{content stripped}<|eot_id|>" per message, then
// the assistant header. A non-empty default_system is inserted as a system message when the
// first message is not one (SmolLM2's template does this).
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view default_system);

// The default system prompt a ChatML template inserts ("<|im_start|>system\n...<|im_end|>" as a
// string literal), unescaped; "" when the template has none.
std::string default_system_prompt(const Tokenizer& tokenizer);
std::string extract_default_system_prompt(std::string_view template_source);

}  // namespace lychee
