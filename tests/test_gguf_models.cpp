// GGUF checkpoints of every architecture (llama, mistral-as-llama, qwen2, qwen3), plain and
// quantised, against the same tiny models loaded from their safetensors directories. The GGUF
// files are written by scripts/goldens/make_gguf_goldens.py from tests/golden/models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "cpu/model.h"
#include "model/chat_template.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "runtime/sampler.h"
#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

struct GgufCase {
  const char* gguf;   // tests/golden/gguf/<gguf>.gguf
  const char* hf;     // tests/golden/models/<hf>
  const char* arch;   // general.architecture
  // 0: every weight converts to the same f32 values as the safetensors one, so logits are equal
  // bit for bit. Otherwise the relative L2 error of the logits allowed.
  double logit_tol;
};

// The quantised files quantise attn_output only (the one matrix with rows of whole blocks). The
// tiny random models (weights of std 0.15) roughly double the weights' relative error in their
// logits: measured 0.009-0.011 for Q8_0 (weights 0.5%) and 0.15-0.17 for the Q4_K/Q5_K/Q6_K mix
// (weights 7.9%, 3.8%, 1.9%); the bounds leave about 2x. A misplaced row or block gives more
// than 1. The exact checks are per weight (below) and per block (test_quant_goldens.cpp).
const GgufCase kCases[] = {
    {"llama_f32", "llama_tied_f32", "llama", 0.0},
    {"mistral_f32", "mistral_f32", "llama", 0.0},
    {"qwen2_f16", "qwen2_untied_f16", "qwen2", 0.0},
    {"qwen2_q8_0", "qwen2_untied_f16", "qwen2", 0.025},
    {"qwen3_bf16", "qwen3_tied_bf16", "qwen3", 0.0},
    {"qwen3_q4_k_m", "qwen3_tied_bf16", "qwen3", 0.35},
};

std::string gguf_path(const GgufCase& c) { return test::golden_dir() + "/gguf/" + c.gguf + ".gguf"; }
std::string hf_path(const GgufCase& c) { return test::golden_dir() + "/models/" + c.hf; }

// Bits of the quantisation of a GGUF weight type, 0 for plain types.
int quant_bits(DType t) {
  switch (t) {
    case DType::kQ8_0: return 8;
    case DType::kQ4_K: return 4;
    case DType::kQ5_K: return 5;
    case DType::kQ6_K: return 6;
    default: return 0;
  }
}

class GgufModel : public ::testing::TestWithParam<GgufCase> {};

TEST_P(GgufModel, ConfigMatchesTheHuggingFaceConfig) {
  const Checkpoint g = Checkpoint::open(gguf_path(GetParam()));
  const Checkpoint h = Checkpoint::open(hf_path(GetParam()));
  const ModelConfig& a = g.config();
  const ModelConfig& b = h.config();
  EXPECT_EQ(a.arch_label, GetParam().arch);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
}

// Every weight, in HF layout after loading: plain types equal bit for bit (the Q/K interleave of
// llama files undone), quantised ones within their quantisation error.
TEST_P(GgufModel, WeightsMatchTheSafetensorsWeights) {
  const Checkpoint g = Checkpoint::open(gguf_path(GetParam()));
  const Checkpoint h = Checkpoint::open(hf_path(GetParam()));
  const ModelConfig& c = g.config();
  const HostWeights wg = HostWeights::load(g);
  const HostWeights wh = HostWeights::load(h);
  int n_quantised = 0;
  for (const WeightSpec& spec : weight_table()) {
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const RawWeight* raw = g.weight(spec.id, layer);
      const std::string name = weight_gguf_name(spec, layer);
      ASSERT_EQ(raw == nullptr, h.weight(spec.id, layer) == nullptr) << name;
      if (raw == nullptr) continue;
      const size_t n = size_t(weight_numel(spec, c));
      const std::span<const float> a(wg.get(spec.id, layer), n), b(wh.get(spec.id, layer), n);
      const int bits = quant_bits(raw->dtype);
      if (bits == 0) {
        EXPECT_EQ(std::memcmp(a.data(), b.data(), n * 4), 0) << name << " (" << dtype_name(raw->dtype) << ")";
        continue;
      }
      ++n_quantised;
      const test::Deviation d = test::deviation(a, b);
      // A b-bit code spans the block's range in 2^b - 1 steps: half a step at most, plus the
      // rounding of the scales to 6 bits / f16.
      EXPECT_LE(d.relative(), std::ldexp(1.0, 1 - bits))
          << name << " (" << dtype_name(raw->dtype) << ") worst at " << d.worst;
      EXPECT_GT(d.max_abs, 0.0) << name << " was not quantised";
    }
  }
  EXPECT_EQ(n_quantised > 0, GetParam().logit_tol > 0);
}

TEST_P(GgufModel, LogitsMatchTheSafetensorsModel) {
  const GgufCase& p = GetParam();
  const nlohmann::json ref = test::read_json(hf_path(p) + "/reference.json");
  const Checkpoint g = Checkpoint::open(gguf_path(p));
  const Checkpoint h = Checkpoint::open(hf_path(p));
  cpu::Model mg(g.config(), HostWeights::load(g));
  cpu::Model mh(h.config(), HostWeights::load(h));
  const int vocab = g.config().vocab_size;
  for (size_t k = 0; k < ref["prompts"].size(); ++k) {
    const auto ids = ref["prompts"][k]["ids"].get<std::vector<int32_t>>();
    std::vector<float> lg, lh;
    cpu::KvCache kg(g.config(), int(ids.size())), kh(h.config(), int(ids.size()));
    mg.forward(ids, kg, lg, /*all_logits=*/true);
    mh.forward(ids, kh, lh, /*all_logits=*/true);
    const test::Deviation d = test::deviation(lg, lh);
    const std::string where = fmt::format("{} prompt {}: worst at position {} token {}: {} vs {}",
                                          p.gguf, k, d.worst / vocab, d.worst % vocab,
                                          lg[d.worst], lh[d.worst]);
    if (p.logit_tol == 0) {
      EXPECT_EQ(d.max_abs, 0.0) << where;
      EXPECT_EQ(argmax(std::span<const float>(lg).last(size_t(vocab))),
                ref["prompts"][k]["greedy"][0].get<int32_t>())
          << where;
    } else {
      // ||a - b|| / ||b|| over every logit of the prompt.
      const double rel = test::rel_error(lg, lh);
      EXPECT_LE(rel, p.logit_tol) << where << "; relative L2 error " << rel;
      EXPECT_GT(d.max_abs, 0.0) << where;  // the quantised weights were used
    }
  }
}

TEST_P(GgufModel, TokenizerMatchesTheHuggingFaceTokenizer) {
  const GgufCase& p = GetParam();
  const Tokenizer tg = Tokenizer::from_gguf(GgufFile::open(gguf_path(p)));
  const Tokenizer th = Tokenizer::from_hf_dir(hf_path(p));
  const nlohmann::json ref = test::read_json(hf_path(p) + "/reference.json");
  EXPECT_EQ(tg.bos_id(), th.bos_id());
  EXPECT_EQ(tg.eos_id(), th.eos_id());
  EXPECT_EQ(tg.chat_template_source(), th.chat_template_source());
  std::vector<std::string> texts = {"", " hello  world\n\n\tfoo", "Héllo 123 4567 ÿ 你好 🎉",
                                    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>x"};
  for (const auto& pr : ref["prompts"]) texts.push_back(pr["text"].get<std::string>());
  for (const std::string& t : texts) {
    EXPECT_EQ(tg.encode(t, false), th.encode(t, false)) << p.gguf << ": '" << t << "'";
    EXPECT_EQ(tg.encode(t, true), th.encode(t, true)) << p.gguf << ": '" << t << "'";
  }
  for (const auto& pr : ref["prompts"])
    EXPECT_EQ(tg.encode(pr["text"].get<std::string>(), false), pr["ids"].get<std::vector<int32_t>>());
  if (!th.chat_template_source().empty()) {
    const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "hi"}};
    EXPECT_EQ(encode_chat(tg, chat), encode_chat(th, chat)) << p.gguf;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GgufModel, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.gguf); });

// The named shapes benchmarks run with random weights: SmolLM2-135M's is the default model's
// (every field that sizes a step), and an unknown name lists the known ones.
TEST(ModelShapes, Smollm2ShapeIsTheDefaultModels) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const ModelConfig want = Checkpoint::open(path).config(), got = model_shape("smollm2-135m");
  EXPECT_EQ(got.arch, want.arch);
  EXPECT_EQ(got.n_layers, want.n_layers);
  EXPECT_EQ(got.d_model, want.d_model);
  EXPECT_EQ(got.n_heads, want.n_heads);
  EXPECT_EQ(got.n_kv_heads, want.n_kv_heads);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.d_ff, want.d_ff);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.max_context, want.max_context);
  EXPECT_EQ(got.tie_embeddings, want.tie_embeddings);
  EXPECT_FLOAT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_FLOAT_EQ(got.rms_eps, want.rms_eps);
  EXPECT_EQ(got.n_params(), want.n_params());
}

TEST(ModelShapes, UnknownNamesAreAnErrorListingTheKnownOnes) {
  EXPECT_EQ(model_shape("llama3-8b").n_layers, 32);
  EXPECT_NO_THROW(model_shape("smollm2-135m").validate("smollm2-135m"));
  test::expect_error([] { model_shape("llama3-405b"); }, ErrorCode::kInvalidArgument,
                     {"unknown model shape 'llama3-405b'", "llama3-8b, llama3-70b, smollm2-135m"});
}

// Llama-3-70B's published shape (its config.json): 80 layers, 64 query / 8 KV heads of 128,
// d_model 8192, d_ff 28672, vocabulary 128256, RoPE theta 500000; context and norm as the 8B's.
TEST(ModelShapes, Llama3_70bHasThePublishedShape) {
  const ModelConfig c = model_shape("llama3-70b"), e = model_shape("llama3-8b");
  EXPECT_NO_THROW(c.validate("llama3-70b"));
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.n_layers, 80);
  EXPECT_EQ(c.d_model, 8192);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.group_size(), 8);
  EXPECT_EQ(c.d_ff, 28672);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(c.rms_eps, e.rms_eps);
  EXPECT_EQ(c.max_context, e.max_context);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  // 70.55 B parameters (Meta's model card: 70B): 80 x 855.6 M per layer + 2 x 1.05 G of embeddings.
  EXPECT_EQ(c.n_params(), 70553706496);
  EXPECT_NE(c.name.find("70B"), std::string::npos);
  // Splits over 2, 4 and 8 GPUs (8 KV heads; d_ff 28672 = 8 x 3584).
  for (int n : {2, 4, 8}) {
    EXPECT_EQ(c.n_kv_heads % n, 0);
    EXPECT_EQ(c.d_ff % n, 0);
  }
}

// The architectures' own tensors go through the weight table like every other: a missing Qwen2
// bias or a Qwen3 q-norm of the wrong shape fails at open, naming the file, tensor and shapes.
TEST(GgufArchitectures, NewTensorsAreValidatedThroughTheWeightTable) {
  const std::string dir = test::temp_dir("gguf_arch");
  auto open = [&](const std::string& arch, const test::TinyEdit& edit) {
    const std::string path = test::write_bytes(dir + "/" + arch + ".gguf", test::tiny_gguf(arch, edit).build());
    return Checkpoint::open(path);
  };
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3"}) {
    const Checkpoint ck = open(arch, {});
    EXPECT_EQ(ck.config().arch_label, arch);
    EXPECT_EQ(ck.config().qkv_bias, std::string(arch) == "qwen2") << arch;
    EXPECT_EQ(ck.config().qk_norm, std::string(arch) == "qwen3") << arch;
    // Only llama and mistral files interleave Q/K rows.
    const bool interleaved = std::string(arch) == "llama" || std::string(arch) == "mistral";
    EXPECT_EQ(ck.weight(WeightId::kWq, 0)->unpermute_heads, interleaved ? 2 : 0) << arch;
    EXPECT_EQ(ck.weight(WeightId::kWk, 0)->unpermute_heads, interleaved ? 1 : 0) << arch;
  }
  test::expect_error([&] { open("qwen2", {.drop = "blk.1.attn_k.bias"}); }, ErrorCode::kNotFound,
                     {"qwen2.gguf", "missing tensor 'blk.1.attn_k.bias'", "expected shape [8]"});
  test::expect_error([&] { open("qwen3", {.reshape = "blk.0.attn_q_norm.weight", .shape = {4}}); },
                     ErrorCode::kInvalidFile,
                     {"qwen3.gguf", "tensor 'blk.0.attn_q_norm.weight' has wrong shape; expected [8], got [4]"});
  test::expect_error([&] { open("qwen3", {.drop = "blk.1.attn_k_norm.weight"}); }, ErrorCode::kNotFound,
                     {"missing tensor 'blk.1.attn_k_norm.weight'"});
  test::expect_error(
      [&] {
        auto b = test::tiny_gguf("qwen3");
        const std::string path = test::write_bytes(dir + "/phi.gguf", [&] {
          auto bytes = b.build();
          // Rename the architecture in place: "qwen3" -> "phi_3" (same length).
          const std::string from = "qwen3", to = "phi_3";
          auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
          std::copy(to.begin(), to.end(), it);
          return bytes;
        }());
        Checkpoint::open(path);
      },
      ErrorCode::kUnsupported, {"GGUF architecture 'phi_3' is not supported (llama, mistral, qwen2, qwen3)"});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lychee
