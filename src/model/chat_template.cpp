#include "model/chat_template.h"

#include <jinja/lexer.h>
#include <jinja/parser.h>
#include <jinja/runtime.h>
#include <jinja/value.h>

#include "core/error.h"
#include "model/tokenizer.h"

namespace lychee {

const std::string_view kChatMLTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

struct ChatTemplate::Program {
  jinja::program program;
};

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {
  program_ = std::make_unique<Program>();
  try {
    jinja::lexer lexer;
    program_->program = jinja::parse_from_tokens(lexer.tokenize(source_));
  } catch (const std::exception& e) {
    fail(ErrorCode::kInvalidFile, "chat template: cannot parse it as Jinja: {}", e.what());
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate ChatTemplate::of(const Tokenizer& tok) {
  const auto piece = [&](int32_t id) { return id >= 0 ? tok.token_piece(id) : std::string(); };
  if (!tok.chat_template_source().empty())
    return ChatTemplate(tok.chat_template_source(), piece(tok.bos_id()), piece(tok.eos_id()));
  LY_CHECK(tok.find_token("<|im_start|>").has_value(), ErrorCode::kUnsupported,
           "the model has no chat template and its vocabulary has no <|im_start|> for the ChatML "
           "fallback; give it a template (chat_template in tokenizer_config.json or a "
           "chat_template.jinja beside it)");
  ChatTemplate t(std::string(kChatMLTemplate), piece(tok.bos_id()), piece(tok.eos_id()));
  t.fallback_ = true;
  return t;
}

namespace {

// A JSON value as a Jinja value; strings marked as user input when `input`.
jinja::value to_value(const nlohmann::ordered_json& j, bool input) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return jinja::mk_val<jinja::value_none>();
    case nlohmann::json::value_t::boolean: return jinja::mk_val<jinja::value_bool>(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return jinja::mk_val<jinja::value_int>(j.get<int64_t>());
    case nlohmann::json::value_t::number_float: return jinja::mk_val<jinja::value_float>(j.get<double>());
    case nlohmann::json::value_t::string: {
      auto s = jinja::mk_val<jinja::value_string>(j.get<std::string>());
      if (input) s->mark_input();
      return s;
    }
    case nlohmann::json::value_t::array: {
      auto a = jinja::mk_val<jinja::value_array>();
      for (const nlohmann::ordered_json& e : j) a->push_back(to_value(e, input));
      return a;
    }
    case nlohmann::json::value_t::object: {
      auto o = jinja::mk_val<jinja::value_object>();
      for (auto it = j.begin(); it != j.end(); ++it) o->insert(it.key(), to_value(it.value(), input));
      return o;
    }
    default: fail(ErrorCode::kInvalidArgument, "chat template variable: unsupported JSON value {}", j.dump());
  }
}

}  // namespace

RenderedChat ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatOptions& options) const {
  LY_CHECK(options.variables.is_object(), ErrorCode::kInvalidArgument,
           "chat template variables must be a JSON object, got {}", options.variables.dump());
  jinja::context ctx(source_);
  if (options.now) ctx.current_time = *options.now;
  // The roles stay template text (Phi-3 builds its role tokens as '<|' + role + '|>'); only the
  // content is the user's.
  auto list = jinja::mk_val<jinja::value_array>();
  for (const ChatMessage& m : messages) {
    auto msg = jinja::mk_val<jinja::value_object>();
    msg->insert("role", jinja::mk_val<jinja::value_string>(m.role));
    auto content = jinja::mk_val<jinja::value_string>(m.content);
    content->mark_input();
    msg->insert("content", content);
    list->push_back(msg);
  }
  ctx.set_val("messages", list);
  ctx.set_val("add_generation_prompt", jinja::mk_val<jinja::value_bool>(options.add_generation_prompt));
  ctx.set_val("bos_token", jinja::mk_val<jinja::value_string>(bos_token_));
  ctx.set_val("eos_token", jinja::mk_val<jinja::value_string>(eos_token_));
  ctx.set_val("tools", jinja::mk_val<jinja::value_none>());
  ctx.set_val("documents", jinja::mk_val<jinja::value_none>());
  for (auto it = options.variables.begin(); it != options.variables.end(); ++it)
    ctx.set_val(it.key(), to_value(it.value(), true));

  RenderedChat out;
  try {
    jinja::runtime runtime(ctx);
    const jinja::value_string parts = jinja::runtime::gather_string_parts(runtime.execute(program_->program));
    for (const jinja::string_part& p : parts->val_str.parts) {
      if (p.is_input && !p.val.empty()) out.content_spans.emplace_back(out.text.size(), out.text.size() + p.val.size());
      out.text += p.val;
    }
  } catch (const std::exception& e) {
    fail(ErrorCode::kInvalidArgument, "chat template: rendering {} message(s) failed: {}", messages.size(),
         e.what());
  }
  return out;
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, const RenderedChat& chat) {
  return tok.encode(chat.text, false, chat.content_spans);
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return encode_chat(tok, ChatTemplate::of(tok).render(messages, options));
}

std::string render_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return ChatTemplate::of(tok).render(messages, options).text;
}

}  // namespace lychee
