#include "model/chat_template.h"

#include "core/error.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace lychee {

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatML: return "ChatML";
    case ChatFormat::kLlama3: return "Llama-3";
  }
  return "?";
}

ChatFormat detect_chat_format(const Tokenizer& tokenizer) {
  const std::string& source = tokenizer.chat_template_source();
  if (!source.empty()) {
    if (source.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatML;
    if (source.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
    fail(ErrorCode::kUnsupported,
         "chat template is neither ChatML (no <|im_start|>) nor Llama-3 (no <|start_header_id|>); "
         "it starts: {}", source.substr(0, 120));
  }
  if (tokenizer.find_token("<|im_start|>")) return ChatFormat::kChatML;
  if (tokenizer.find_token("<|start_header_id|>")) return ChatFormat::kLlama3;
  fail(ErrorCode::kUnsupported,
       "the model has no chat template and its vocabulary has neither <|im_start|> (ChatML) nor "
       "<|start_header_id|> (Llama-3)");
}

namespace {

void append_chatml(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
}

// Llama-3 templates strip each message with Jinja's `trim` (Python str.strip()).
void append_llama3(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|start_header_id|>").append(role).append("<|end_header_id|>\n\n");
  out.append(unicode::python_strip(content)).append("<|eot_id|>");
}

}  // namespace

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view default_system) {
  const bool add_default =
      !default_system.empty() && !messages.empty() && messages.front().role != "system";
  std::string out;
  if (format == ChatFormat::kChatML) {
    if (add_default) append_chatml(out, "system", default_system);
    for (const ChatMessage& m : messages) append_chatml(out, m.role, m.content);
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  if (!messages.empty()) out += "<|begin_of_text|>";
  if (add_default) append_llama3(out, "system", default_system);
  for (const ChatMessage& m : messages) append_llama3(out, m.role, m.content);
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

namespace {

// The body of a Jinja string literal delimited by `quote`, unescaped; nullopt when the body holds
// an unescaped quote (the literal ended there: the text that follows is an expression).
std::optional<std::string> unescape_literal(std::string_view body, char quote) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == quote) return std::nullopt;
    if (c != '\\' || i + 1 == body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      default: out += e; break;  // \\, \', \"
    }
  }
  return out;
}

}  // namespace

std::string extract_default_system_prompt(std::string_view source) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t pos = source.find(kOpen); pos != std::string_view::npos;
       pos = source.find(kOpen, pos + 1)) {
    // The literal's quote is the nearest quote before the marker.
    const size_t q = source.find_last_of("'\"", pos);
    if (q == std::string_view::npos) continue;
    std::string_view rest = source.substr(pos + kOpen.size());
    // The newline after "system": a real one (JSON-decoded) or the escape \n in the literal.
    if (rest.starts_with("\\n")) rest.remove_prefix(2);
    else if (rest.starts_with("\n")) rest.remove_prefix(1);
    else continue;
    const size_t end = rest.find(kClose);
    if (end == std::string_view::npos) continue;
    if (auto text = unescape_literal(rest.substr(0, end), source[q]); text && !text->empty())
      return *text;
  }
  return "";
}

std::string default_system_prompt(const Tokenizer& tokenizer) {
  return extract_default_system_prompt(tokenizer.chat_template_source());
}

}  // namespace lychee
