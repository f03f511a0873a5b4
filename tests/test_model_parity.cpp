// Whole-model parity with Hugging Face transformers: logits of fixed prompts and greedy tokens,
// against golden files written by scripts/goldens/make_model_goldens.py.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>

#include "cpu/model.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "runtime/sampler.h"
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

}  // namespace
}  // namespace lychee
