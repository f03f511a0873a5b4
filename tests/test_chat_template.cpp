// Built-in chat formats against transformers' apply_chat_template goldens
// (scripts/goldens/make_tokenizer_goldens.py).
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tokenizer_test_util.h"

namespace lychee {
namespace {

using nlohmann::json;

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) out.push_back({m["role"], m["content"]});
  return out;
}

// Each case renders byte for byte and encodes (add_bos = false) to the golden ids.
void check_chat_cases(const Tokenizer& tok, const json& cases, ChatFormat expected_format) {
  const ChatFormat format = detect_chat_format(tok);
  EXPECT_EQ(format, expected_format);
  const std::string system = default_system_prompt(tok);
  ASSERT_FALSE(cases.empty());
  for (const json& c : cases) {
    SCOPED_TRACE(c["messages"].dump() + " gen=" + c["add_generation_prompt"].dump());
    const std::string rendered =
        render_chat(format, messages_of(c["messages"]), c["add_generation_prompt"], system);
    EXPECT_EQ(rendered, c["rendered"].get<std::string>());
    EXPECT_EQ(tok.encode(rendered, false), c["ids"].get<std::vector<int32_t>>());
  }
}

Tokenizer tiny(const char* style) {
  return Tokenizer::from_hf_dir(test::golden_path(std::string("tokenizers/") + style));
}

TEST(ChatTemplate, Llama3MatchesTransformers) {
  const Tokenizer tok = tiny("llama3");
  EXPECT_EQ(default_system_prompt(tok), "");
  check_chat_cases(tok, test::read_json(test::golden_path("tokenizers/llama3/chat_cases.json"))["cases"],
                   ChatFormat::kLlama3);
}

TEST(ChatTemplate, ChatMLWithDefaultSystemMatchesTransformers) {
  const Tokenizer tok = tiny("qwen2");
  EXPECT_EQ(default_system_prompt(tok), "You are a tiny test model.");
  check_chat_cases(tok, test::read_json(test::golden_path("tokenizers/qwen2/chat_cases.json"))["cases"],
                   ChatFormat::kChatML);
}

TEST(ChatTemplate, SmolLM2MatchesTransformers) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(path));
  const json g = test::read_json(test::golden_path("smollm2/tokenizer_cases.json"));
  EXPECT_EQ(default_system_prompt(tok), g["default_system_prompt"].get<std::string>());
  check_chat_cases(tok, g["chat_cases"], ChatFormat::kChatML);
}

TEST(ChatTemplate, DetectFromVocabularyWithoutTemplate) {
  const Tokenizer gpt2 = tiny("gpt2");  // no template; has <|im_start|>
  ASSERT_TRUE(gpt2.chat_template_source().empty());
  EXPECT_EQ(detect_chat_format(gpt2), ChatFormat::kChatML);
  EXPECT_EQ(default_system_prompt(gpt2), "");

  // A GGUF without a template whose vocabulary has only Llama-3 markers, then one with neither.
  for (const bool llama : {true, false}) {
    test::GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    std::vector<std::string> tokens = {"a", "b"};
    if (llama) tokens.push_back("<|start_header_id|>");
    w.add_strings("tokenizer.ggml.tokens", tokens);
    w.add_strings("tokenizer.ggml.merges", {});
    const auto bytes = w.bytes();
    const Tokenizer tok = Tokenizer::from_gguf(GgufFile::parse(bytes, "t.gguf"));
    if (llama) {
      EXPECT_EQ(detect_chat_format(tok), ChatFormat::kLlama3);
    } else {
      EXPECT_THROW(detect_chat_format(tok), Error);
    }
  }
}

TEST(ChatTemplate, ExtractDefaultSystemPrompt) {
  // SmolLM2's shape, with a real newline (as JSON decodes it) or the Jinja escape.
  EXPECT_EQ(extract_default_system_prompt(
                "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
                "You are X<|im_end|>\n' }}{% endif %}"),
            "You are X");
  EXPECT_EQ(extract_default_system_prompt(
                R"({{ "<|im_start|>system\nIt's \"quoted\"\tand\\ok<|im_end|>\n" }})"),
            "It's \"quoted\"\tand\\ok");
  // Qwen2's shape: the first match is the system message itself, the default comes later.
  EXPECT_EQ(extract_default_system_prompt(
                "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
                "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- "
                "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"),
            "You are a helpful assistant.");
  EXPECT_EQ(extract_default_system_prompt("{{ '<|im_start|>' + m['role'] + '\\n' }}"), "");
  EXPECT_EQ(extract_default_system_prompt(""), "");
}

TEST(ChatTemplate, RenderEdgeCases) {
  EXPECT_EQ(render_chat(ChatFormat::kChatML, {}, true, "sys"), "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFormat::kLlama3, {}, false, ""), "");
  EXPECT_EQ(render_chat(ChatFormat::kLlama3, {{"user", " \x1c\u00a0hi\n\u3000"}}, false, "Be brief."),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
  EXPECT_EQ(render_chat(ChatFormat::kChatML, {{"system", "s"}, {"user", "u"}}, false, "dflt"),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n");
}

}  // namespace
}  // namespace lychee
