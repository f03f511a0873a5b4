// Whole-model parity with Hugging Face transformers: logits of fixed prompts and greedy tokens,
// against golden files written by scripts/goldens/make_model_goldens.py.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>

#include "core/dtype.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "runtime/sampler.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace lychee {
namespace {

constexpr double kRelTol = 1e-4;  // max abs error <= 1e-4 x the logits' max abs value

std::vector<std::string> golden_models() {
  std::vector<std::string> names;
  const auto dir = std::filesystem::path(test::golden_dir()) / "models";
  if (std::filesystem::exists(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

std::span<const float> f32_view(const SafetensorsTensor* t) {
  return {reinterpret_cast<const float*>(t->data), size_t(t->n_elems())};
}

// Greedy decoding through the KV cache: prefill, then one token at a time.
std::vector<int32_t> greedy_incremental(cpu::Model& model, const std::vector<int32_t>& prompt, int n) {
  cpu::KvCache kv(model.config(), int(prompt.size()) + n);
  std::vector<float> logits;
  model.forward(prompt, kv, logits);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(argmax(logits));
    if (i + 1 < n) model.forward(std::span<const int32_t>(&out.back(), 1), kv, logits);
  }
  return out;
}

class TinyModelParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyModelParity, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = test::golden_dir() + "/models/" + GetParam();
  const nlohmann::json ref = test::read_json(dir + "/reference.json");
  const SafetensorsFile logits_file = SafetensorsFile::open(dir + "/reference.safetensors");
  const Checkpoint ck = Checkpoint::open(dir);
  cpu::Model model(ck.config(), HostWeights::load(ck));
  const int vocab = ck.config().vocab_size;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const auto& prompt = ref["prompts"][p];
    const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    cpu::KvCache kv(ck.config(), int(ids.size()));
    std::vector<float> logits;
    model.forward(ids, kv, logits, /*all_logits=*/true);
    const SafetensorsTensor* want = logits_file.find(fmt::format("prompt{}.logits", p));
    ASSERT_NE(want, nullptr);
    ASSERT_EQ(want->n_elems(), int64_t(ids.size()) * vocab);
    ASSERT_EQ(logits.size(), size_t(want->n_elems())) << GetParam() << " prompt " << p;
    const test::Deviation d = test::deviation(logits, f32_view(want));
    EXPECT_LE(d.max_abs, kRelTol * d.ref_max)
        << GetParam() << " prompt " << p << ": worst at position " << d.worst / vocab << " token "
        << d.worst % vocab << ": " << logits[d.worst] << " vs " << f32_view(want)[d.worst];
    const auto want_greedy = prompt["greedy"].get<std::vector<int32_t>>();
    EXPECT_EQ(greedy_incremental(model, ids, int(want_greedy.size())), want_greedy)
        << GetParam() << " prompt " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, TinyModelParity, ::testing::ValuesIn(golden_models()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TinyModelParity);

TEST(TinyModelParity, GoldenModelsArePresent) {
  EXPECT_GE(golden_models().size(), 5u) << "run scripts/goldens/make_model_goldens.py";
}

// The default model (SmolLM2-135M-Instruct, Q4_1/Q8_0 GGUF) against transformers loading the
// same file: last-position logits, the top-5 logits of every position, and greedy tokens.
TEST(DefaultModelParity, MatchesTransformersOnTheSameGguf) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const std::string dir = test::golden_dir() + "/smollm2";
  const nlohmann::json ref = test::read_json(dir + "/reference.json");
  const SafetensorsFile st = SafetensorsFile::open(dir + "/reference.safetensors");
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model model(ck.config(), HostWeights::load(ck));
  const int vocab = ck.config().vocab_size;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const auto ids = ref["prompts"][p]["ids"].get<std::vector<int32_t>>();
    cpu::KvCache kv(ck.config(), int(ids.size()));
    std::vector<float> logits;
    model.forward(ids, kv, logits, /*all_logits=*/true);
    const auto last = f32_view(st.find(fmt::format("prompt{}.last_logits", p)));
    const auto ours_last = std::span<const float>(logits).subspan(logits.size() - size_t(vocab));
    ASSERT_EQ(ours_last.size(), last.size()) << "prompt " << p;
    const test::Deviation d = test::deviation(ours_last, last);
    EXPECT_LE(d.max_abs, kRelTol * d.ref_max) << "prompt " << p << " token " << d.worst << ": "
                                              << ours_last[d.worst] << " vs " << last[d.worst];
    // Every position: our logits at transformers' top-5 tokens equal its top-5 values.
    const SafetensorsTensor* top_v = st.find(fmt::format("prompt{}.top5_values", p));
    const SafetensorsTensor* top_i = st.find(fmt::format("prompt{}.top5_ids", p));
    ASSERT_TRUE(top_v && top_i && top_i->dtype == DType::kI32);
    const auto* tid = reinterpret_cast<const int32_t*>(top_i->data);
    const auto tv = f32_view(top_v);
    for (size_t t = 0; t < ids.size(); ++t)
      for (int k = 0; k < 5; ++k) {
        const float ours = logits[t * vocab + size_t(tid[t * 5 + k])];
        EXPECT_NEAR(ours, tv[t * 5 + k], kRelTol * d.ref_max) << "prompt " << p << " position " << t;
      }
    auto want = ref["prompts"][p]["greedy"].get<std::vector<int32_t>>();
    want.resize(16);
    EXPECT_EQ(greedy_incremental(model, ids, 16), want) << "prompt " << p;
  }
}

// --cpu-weights bf16: every matrix holds its values rounded to bf16 (what the GPU's bf16 weights
// stand for), every vector the f32 reference's.
TEST(Bf16Weights, MatricesAreRoundedAndVectorsUntouched) {
  const Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/qwen2_untied_f16");
  const HostWeights ref = HostWeights::load(ck, WeightFormat::kF32);
  const HostWeights b16 = HostWeights::load(ck, WeightFormat::kBf16);
  EXPECT_EQ(b16.format(), WeightFormat::kBf16);
  EXPECT_STREQ(weight_format_name(WeightFormat::kBf16), "bf16");
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kNative, WeightFormat::kFp8, WeightFormat::kBf16})
    EXPECT_EQ(weight_format_from_name(weight_format_name(f)), f);
  for (GpuWeightFormat f : {GpuWeightFormat::kBf16, GpuWeightFormat::kFp8})
    EXPECT_EQ(gpu_weight_format_from_name(gpu_weight_format_name(f)), f);
  EXPECT_EQ(weight_format_from_name("int4"), std::nullopt);
  EXPECT_EQ(gpu_weight_format_from_name("f32"), std::nullopt);
  const auto values = [](const HostWeights& w, WeightId id, int layer) { return test::weight_values(w, id, layer); };
  for (int layer = 0; layer < ck.config().n_layers; ++layer)
    for (WeightId id : {WeightId::kWq, WeightId::kWk, WeightId::kWv, WeightId::kWo, WeightId::kWGate, WeightId::kWUp,
                        WeightId::kWDown}) {
      std::vector<float> want = values(ref, id, layer);
      for (float& x : want) x = bf16_to_f32(f32_to_bf16(x));
      EXPECT_EQ(values(b16, id, layer), want) << int(id) << " layer " << layer;
      EXPECT_NE(want, values(ref, id, layer)) << "rounding changed nothing";
    }
  for (WeightId id : {WeightId::kTokEmbd, WeightId::kOutput}) {
    std::vector<float> want = values(ref, id, 0);
    for (float& x : want) x = bf16_to_f32(f32_to_bf16(x));
    EXPECT_EQ(values(b16, id, 0), want) << int(id);
  }
  for (WeightId id : {WeightId::kAttnNorm, WeightId::kBq, WeightId::kOutputNorm})
    EXPECT_EQ(values(b16, id, 0), values(ref, id, 0)) << int(id);
}

// What bf16 weights alone cost each tiny checkpoint: CPU logits with --cpu-weights bf16 against
// the f32 reference over CudaTinyParity's sequence (a 30-token prefill, then 10 decode steps, one
// token at a time). Nothing for a bf16 file (rounding is the identity there); for f32 and f16
// files within kBf16LogitsTol, whose derivation counts the weights' rounding among the GPU's
// (gpu_test_util.h). CudaTinyParity compares the GPU with the bf16-weight CPU (its arithmetic),
// this test bounds what the format adds on top (the correctness chain: GPU ~ CPU bf16 ~ CPU f32 ~
// transformers).
class Bf16WeightsCost : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16WeightsCost, PerDecodeStep) {
  const Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/" + GetParam());
  cpu::Model exact(ck.config(), HostWeights::load(ck, WeightFormat::kF32));
  cpu::Model rounded(ck.config(), HostWeights::load(ck, WeightFormat::kBf16));
  const int vocab = ck.config().vocab_size;
  const std::vector<int32_t> ids = test::parity_sequence(vocab);
  cpu::KvCache kv_e(ck.config(), int(ids.size())), kv_r(ck.config(), int(ids.size()));
  std::vector<float> le, lr;
  exact.forward(std::span<const int32_t>(ids).first(test::kParityPrefill), kv_e, le);
  rounded.forward(std::span<const int32_t>(ids).first(test::kParityPrefill), kv_r, lr);
  double worst = 0.0;
  std::string steps;
  for (size_t n = test::kParityPrefill; n <= ids.size(); ++n) {
    const double e = test::rel_error(lr, le);
    worst = std::max(worst, e);
    steps += fmt::format(" {:.1e}", e);
    if (n < ids.size()) {
      exact.forward(std::span<const int32_t>(&ids[n], 1), kv_e, le);
      rounded.forward(std::span<const int32_t>(&ids[n], 1), kv_r, lr);
    }
  }
  if (ck.weight(WeightId::kWq, 0)->dtype == DType::kBF16)
    EXPECT_EQ(worst, 0.0) << GetParam() << ": a bf16 file's values changed";
  else
    EXPECT_GT(worst, 0.0) << GetParam() << ": rounding the matrices to bf16 changed no logit";
  EXPECT_LT(worst, test::kBf16LogitsTol) << GetParam();
  std::printf("[ bf16 weights vs f32 ] %s: worst rel. L2 over 11 steps %.2e; per step%s\n", GetParam().c_str(),
              worst, steps.c_str());
}

INSTANTIATE_TEST_SUITE_P(Golden, Bf16WeightsCost,
                         ::testing::Values("llama_tied_f32", "llama31_untied_bf16_sharded", "llama_bias_f16",
                                           "qwen2_untied_f16", "qwen3_tied_bf16", "mistral_f32"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lychee
