// Tokenizer::from_gguf: llama.cpp's tokenizer metadata, "gpt2" (byte-level BPE) and "llama"
// (SentencePiece BPE: tokens, scores, token types, <0xHH> byte tokens).
#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace lychee {

namespace {

// llama.cpp's token types (a fact of the GGUF format).
enum GgufTokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// GGUF merges are "a b"; the split is at the first space after the first byte.
std::vector<std::pair<std::string, std::string>> split_gguf_merges(
    const std::vector<std::string_view>& text, const std::string& path) {
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(text.size());
  for (size_t k = 0; k < text.size(); ++k) {
    const std::string_view m = text[k];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    LY_CHECK(sp != std::string_view::npos, ErrorCode::kInvalidFile,
             "{}: tokenizer.ggml.merges[{}] = '{}' is not \"a b\"", path, k, m);
    merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
  }
  return merges;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& g) {
  const std::string& path = g.path();
  const std::string_view model = g.get_string("tokenizer.ggml.model");
  LY_CHECK(model == "gpt2" || model == "llama", ErrorCode::kUnsupported,
           "{}: tokenizer.ggml.model = '{}' is not supported (lychee reads 'gpt2', byte-level BPE, "
           "and 'llama', SentencePiece BPE)", path, model);
  const bool sentencepiece = model == "llama";
  const auto& tokens = g.get_string_array("tokenizer.ggml.tokens");
  std::vector<int64_t> types(tokens.size(), kNormal);
  if (g.has("tokenizer.ggml.token_type")) {
    types = g.get_int_array("tokenizer.ggml.token_type");
    LY_CHECK(types.size() == tokens.size(), ErrorCode::kInvalidFile,
             "{}: tokenizer.ggml.token_type has {} entries, expected {} (one per token)", path,
             types.size(), tokens.size());
  }
  const auto token_id = [&](const char* key) -> int32_t {
    const auto v = g.get_uint_opt(key);
    if (!v) return -1;
    LY_CHECK(*v < tokens.size(), ErrorCode::kInvalidFile,
             "{}: {} = {} is outside the vocabulary ({} tokens)", path, key, *v, tokens.size());
    return int32_t(*v);
  };
  // transformers' GGUF loader builds the BPE model with byte_fallback and fuse_unk: a byte with
  // no symbol (SmolLM2 lacks 21, e.g. 0x04 and 0xFF) becomes <0xHH> or else one fused unk.
  BpeOptions options;
  options.byte_fallback = true;
  options.fuse_unk = true;
  options.unk_id = token_id("tokenizer.ggml.unknown_token_id");
  std::vector<std::string> token_text(tokens.begin(), tokens.end());

  Tokenizer t;
  if (sentencepiece) {
    // transformers' GGUF loader: LlamaTokenizer over the vocabulary with merges derived from the
    // scores; Metaspace(prepend_scheme "first", no split) and Llama's decoder. llama.cpp honours
    // tokenizer.ggml.add_space_prefix = false (no dummy prefix); transformers ignores the key.
    const std::vector<double>& scores = g.get_float_array("tokenizer.ggml.scores");
    options.byte_level = false;
    t.bpe_ = BpeModel::from_scores(std::move(token_text), scores, options,
                                   path + ": tokenizer.ggml");
    const bool prefix = g.get_bool_opt("tokenizer.ggml.add_space_prefix").value_or(true);
    t.pre_ = PreTokenizer::metaspace(prefix ? MetaspacePrepend::kFirst : MetaspacePrepend::kNever,
                                     false);
    t.decoder_ = Decoder::sentencepiece(prefix);
  } else {
    const std::string pre(g.get_string_opt("tokenizer.ggml.pre").value_or("default"));
    PreTokenizerPreset preset = preset_for_gguf_pre(pre, path, "tokenizer.ggml.pre");
    const auto merges = split_gguf_merges(g.get_string_array("tokenizer.ggml.merges"), path);
    options.ignore_merges = preset.ignore_merges;
    t.bpe_ = BpeModel::build(std::move(token_text), merges, options, path + ": tokenizer.ggml");
    t.pre_ = std::move(preset.pre);
    if (preset.normal_form) t.normalizer_.add_unicode(*preset.normal_form);
    t.decoder_ = Decoder::byte_level();
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    // Control tokens are special added tokens, user-defined ones plain added tokens. In a
    // SentencePiece vocabulary transformers also registers the unknown token (<unk>) as special.
    const bool special = types[i] == kControl || (sentencepiece && types[i] == kUnknown);
    if ((!special && types[i] != kUserDefined) || tokens[i].empty()) continue;
    AddedToken a;
    a.content = std::string(tokens[i]);
    a.id = int32_t(i);
    a.special = special;
    t.added_.push_back(std::move(a));
  }
  t.bos_id_ = token_id("tokenizer.ggml.bos_token_id");
  t.eos_id_ = token_id("tokenizer.ggml.eos_token_id");
  // llama.cpp and transformers add BOS for a SentencePiece vocabulary that does not say.
  t.add_bos_ = g.get_bool_opt("tokenizer.ggml.add_bos_token").value_or(sentencepiece);
  t.add_eos_ = g.get_bool_opt("tokenizer.ggml.add_eos_token").value_or(false);
  t.chat_template_ = std::string(g.get_string_opt("tokenizer.chat_template").value_or(""));
  t.finish(path);
  return t;
}

}  // namespace lychee
