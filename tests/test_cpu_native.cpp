// The CPU model with native (block-quantised) weights against the same file with f32 weights,
// the oracle: the committed quantised GGUF goldens and the default model (Q4_1 + Q8_0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "attention/policies.h"
#include "runtime/sampler.h"
#include "runtime/threads.h"
#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

using cpu::QuantIsa;

std::vector<QuantIsa> isas() {
  std::vector<QuantIsa> v = {QuantIsa::kScalar};
  if (cpu::detected_quant_isa() == QuantIsa::kAvx2) v.push_back(QuantIsa::kAvx2);
  return v;
}

// Logits of every position of `ids` (a fresh cache), fed one token at a time (decode steps) or all
// at once (one prefill; the native path gives the same logits both ways).
std::vector<float> logits_of(cpu::Model& m, const std::vector<int32_t>& ids, bool one_by_one) {
  cpu::KvCache kv(m.config(), int(ids.size()));
  std::vector<float> all, step;
  if (!one_by_one) {
    m.forward(ids, kv, all, /*all_logits=*/true);
    return all;
  }
  for (int32_t t : ids) {
    m.forward(std::span<const int32_t>(&t, 1), kv, step);
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

struct NativeCase {
  const char* gguf;  // tests/golden/gguf/<gguf>.gguf
  // Relative L2 error of native decode logits against the f32 model on the same file: the
  // activations' int8 rounding (half a step of max|x|/127 per block of 32, ~0.5% of a Gaussian
  // block's rms) through the quantised matrices, which the tiny random models roughly double
  // (test_gguf_models.cpp): measured 0.0083-0.0106 (qwen2_q8_0), 0.0099-0.0118 (qwen3_q4_k_m)
  // over the prompts; the bound leaves 1.7x. A wrong block, scale or row gives more than 0.3.
  double tol;
};

class NativeGolden : public ::testing::TestWithParam<NativeCase> {};

TEST_P(NativeGolden, LogitsMatchTheF32ModelOnTheSameFile) {
  const std::string path = test::golden_dir() + "/gguf/" + GetParam().gguf + ".gguf";
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model ref(ck.config(), HostWeights::load(ck, WeightFormat::kF32));
  cpu::Model native(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  native.set_min_gemm_rows(cpu::kNoGemm);  // every prompt row through the integer products
  EXPECT_TRUE(native.weights().view(WeightId::kWo, 0).quantized());
  EXPECT_LT(native.weights().n_bytes(), ref.weights().n_bytes());
  const nlohmann::json prompts = test::read_json(
      test::golden_dir() + "/models/" + (std::string(GetParam().gguf).starts_with("qwen2") ? "qwen2_untied_f16" : "qwen3_tied_bf16") +
      "/reference.json")["prompts"];
  for (const auto& pr : prompts) {
    const auto ids = pr["ids"].get<std::vector<int32_t>>();
    const std::vector<float> want = logits_of(ref, ids, false);  // the oracle, prefilled
    std::vector<float> by_isa;
    for (QuantIsa isa : isas()) {
      native.set_quant_isa(isa);
      const std::vector<float> got = logits_of(native, ids, true);
      const double rel = test::rel_error(got, want);
      EXPECT_LE(rel, GetParam().tol) << GetParam().gguf << " " << cpu::quant_isa_name(isa);
      EXPECT_GT(rel, 0.0) << "the quantised products were not used";
      if (!by_isa.empty()) {
        // The kernels differ by f32 rounding only (test_cpu_quant.cpp), but a difference at the
        // half-way point of an int8 rounding moves that activation by a whole step in the next
        // product: measured 1.5e-4.
        EXPECT_LE(test::rel_error(got, by_isa), 1e-3) << "scalar vs avx2";
      }
      by_isa = got;
    }
    // Prefill goes through the same integer products and per-row attention as decode steps:
    // the prompt at once gives the token-by-token logits bit for bit (chunk invariance).
    EXPECT_EQ(logits_of(native, ids, false), by_isa) << GetParam().gguf;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, NativeGolden,
                         ::testing::Values(NativeCase{"qwen2_q8_0", 0.02}, NativeCase{"qwen3_q4_k_m", 0.02}),
                         [](const auto& info) { return std::string(info.param.gguf); });

// The default model: logits of the reference prompts, and greedy tokens. Relative L2 error of
// the logits measured 0.039 and 0.025 (30 layers; SmolLM2's large activations in a few channels
// coarsen the int8 step of the blocks that hold them); the bound leaves 1.5x. Greedy: both models
// follow the f32 model's greedy tokens for 32 steps (teacher forcing, so one close call does not
// end the comparison), and at every step where the f32 top-1 margin exceeds kMargin the native
// model picks the same token. kMargin is twice the largest change of the top-2 difference that
// native weights caused over the steps measured (0.17 logits).
TEST(NativeDefaultModel, MatchesTheF32ModelAndItsGreedyTokens) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  constexpr double kMargin = 0.35;
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model ref(ck.config(), HostWeights::load(ck, WeightFormat::kF32));
  cpu::Model native(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  EXPECT_EQ(native.weights().view(WeightId::kWq, 0).dtype, DType::kQ4_1);
  EXPECT_EQ(native.weights().view(WeightId::kOutput).dtype, DType::kQ8_0);  // tied: the Q8_0 embedding
  const nlohmann::json prompts = test::read_json(test::golden_dir() + "/smollm2/reference.json")["prompts"];
  int checked = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto ids = prompts[p]["ids"].get<std::vector<int32_t>>();
    EXPECT_LE(test::rel_error(logits_of(native, ids, true), logits_of(ref, ids, false)), 0.06) << "prompt " << p;
    cpu::KvCache kr(ck.config(), int(ids.size()) + 32), kn(ck.config(), int(ids.size()) + 32);
    std::vector<float> lr, ln;
    ref.forward(ids, kr, lr);
    native.forward(ids, kn, ln);
    for (int step = 0; step < 32; ++step) {
      std::vector<float> top(lr);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
      const int32_t tr = argmax(lr);
      if (top[0] - top[1] > kMargin) {
        EXPECT_EQ(argmax(ln), tr) << "prompt " << p << " step " << step << ": f32 margin " << top[0] - top[1];
        ++checked;
      }
      ref.forward(std::span<const int32_t>(&tr, 1), kr, lr);
      native.forward(std::span<const int32_t>(&tr, 1), kn, ln);
    }
  }
  EXPECT_GE(checked, 16) << "too few greedy steps had a clear margin";
}

// The native path without dequantised sgemm (kNoGemm) is chunk-invariant: a prompt prefilled at
// once, in chunks of 3 and 7, or token by token gives every position the same logits bit for bit
// (every row through the same integer products and the same per-row attention), so a server's
// answer does not depend on how its prefill was cut or on prefix reuse.
TEST(NativeDefaultModel, LogitsDoNotDependOnHowThePromptIsChunked) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model native(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  native.set_min_gemm_rows(cpu::kNoGemm);
  const nlohmann::json prompts = test::read_json(test::golden_dir() + "/smollm2/reference.json")["prompts"];
  const auto ids = prompts[0]["ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 8u);
  const std::vector<float> whole = logits_of(native, ids, false);
  EXPECT_EQ(logits_of(native, ids, true), whole);
  for (const size_t chunk : {size_t(3), size_t(7)}) {
    cpu::KvCache kv(native.config(), int(ids.size()));
    std::vector<float> all, part;
    for (size_t i = 0; i < ids.size(); i += chunk) {
      const size_t n = std::min(chunk, ids.size() - i);
      native.forward(std::span<const int32_t>(ids).subspan(i, n), kv, part, /*all_logits=*/true);
      all.insert(all.end(), part.begin(), part.end());
    }
    EXPECT_EQ(all, whole) << "chunks of " << chunk;
  }
}

// The default: chunks of at least min_gemm_rows rows go through sgemm on the dequantised matrices
// and the reference's BLAS attention, so such a chunk computes what the f32 model computes on the
// same file, up to f32 rounding (the f32 model's LM head on one row is a matrix-vector loop, not
// sgemm); shorter chunks and decode steps keep the integer products (measured rel. error 0.025-
// 0.039 against f32, MatchesTheF32ModelAndItsGreedyTokens), which the bound tells apart by 1000x.
// The prompt at once and in chunks of at least the threshold agree to the same bound.
TEST(NativeDefaultModel, LongChunksComputeWhatTheF32ModelComputes) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model ref(ck.config(), HostWeights::load(ck, WeightFormat::kF32));
  cpu::Model native(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  EXPECT_EQ(native.min_gemm_rows(), cpu::kDefaultGemmRows);
  constexpr int64_t kRows = 5;
  native.set_min_gemm_rows(kRows);
  const nlohmann::json prompts = test::read_json(test::golden_dir() + "/smollm2/reference.json")["prompts"];
  const auto ids = prompts[0]["ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), size_t(3 * kRows));
  const std::vector<float> want = logits_of(ref, ids, false);
  EXPECT_LE(test::rel_error(logits_of(native, ids, false), want), 2e-5);
  // Chunks of kRows, the remainder joined to the last one so that every chunk takes sgemm.
  cpu::KvCache kv(native.config(), int(ids.size()));
  std::vector<float> all, part;
  for (size_t i = 0; i < ids.size();) {
    const size_t n = ids.size() - i < size_t(2 * kRows) ? ids.size() - i : size_t(kRows);
    native.forward(std::span<const int32_t>(ids).subspan(i, n), kv, part, /*all_logits=*/true);
    all.insert(all.end(), part.begin(), part.end());
    i += n;
  }
  EXPECT_LE(test::rel_error(all, want), 2e-5);
  // Below the threshold the integer products run: a clearly different result.
  native.set_min_gemm_rows(cpu::kNoGemm);
  EXPECT_GT(test::rel_error(logits_of(native, ids, false), want), 2e-3);
}

// A decode step's attention through a policy's read lists (every head dense: Full) runs the same
// per-head routine as a step without a policy, so both give the same logits bit for bit; and the
// products split rows among threads without changing any element, so one compute thread and two
// give the same logits too.
TEST(NativeDefaultModel, DecodeStepsDoNotDependOnThePolicyPathOrTheThreadCount) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model native(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  const nlohmann::json prompts = test::read_json(test::golden_dir() + "/smollm2/reference.json")["prompts"];
  const auto ids = prompts[0]["ids"].get<std::vector<int32_t>>();
  constexpr int kSteps = 12;
  auto decode = [&](AttentionPolicy* policy, int threads) {
    const int before = compute_threads();
    set_compute_threads(threads);
    cpu::KvCache kv(native.config(), int(ids.size()) + kSteps);
    std::vector<float> logits, all;
    native.forward(ids, kv, logits);
    if (policy != nullptr) policy->reset();
    for (int step = 0; step < kSteps; ++step) {
      const int32_t t = argmax(logits);
      if (policy != nullptr) policy->begin_step(kv.length() + 1);
      native.forward(std::span<const int32_t>(&t, 1), kv, logits, false, policy);
      all.insert(all.end(), logits.begin(), logits.end());
    }
    set_compute_threads(before);
    return all;
  };
  const std::vector<float> plain = decode(nullptr, 1);
  const auto full = make_policy(PolicyOptions{}, native.config());
  EXPECT_EQ(decode(full.get(), 1), plain);
  EXPECT_EQ(decode(nullptr, 2), plain);
  EXPECT_EQ(decode(full.get(), 2), plain);
}

// Where the CPU has AVX2 the native model re-lays its Q4_1 and Q8_0 matrices out in eight-row
// groups (cpu/quant_pack.h) whose products equal the scalar one-row kernel's bit for bit, so a
// model whose quantised matrices all have that layout gives the scalar kernels' logits exactly,
// decode steps and prefill alike; LYCHEE_CPU_PACK=0 keeps the file's rows and the AVX2 one-row
// kernels, which differ from the scalar ones by f32 rounding.
void expect_packed_equals_scalar(const std::string& path, const std::string& golden_prompts) {
  const Checkpoint ck = Checkpoint::open(path);
  cpu::Model packed(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  ASSERT_EQ(setenv("LYCHEE_CPU_PACK", "0", 1), 0);
  cpu::Model rows(ck.config(), HostWeights::load(ck, WeightFormat::kNative));
  ASSERT_EQ(setenv("LYCHEE_CPU_PACK", "2", 1), 0);
  test::expect_error([&] { cpu::Model(ck.config(), HostWeights::load(ck, WeightFormat::kNative)); },
                     ErrorCode::kInvalidArgument, {"LYCHEE_CPU_PACK must be 0 or 1", "\"2\""});
  ASSERT_EQ(unsetenv("LYCHEE_CPU_PACK"), 0);
  int n_packed = 0;  // every quantised matrix (all Q4_1 or Q8_0 here) is packed
  for (int layer = 0; layer < ck.config().n_layers; ++layer)
    for (WeightId id : {WeightId::kWq, WeightId::kWk, WeightId::kWv, WeightId::kWo, WeightId::kWGate,
                        WeightId::kWUp, WeightId::kWDown, WeightId::kOutput}) {
      const WeightView& v = packed.weights().view(id, layer);
      if (!v.quantized() || (id == WeightId::kOutput && layer > 0)) continue;
      ASSERT_EQ(v.row_group, cpu::kPackRows) << path << " " << weight_gguf_name(weight_spec(id), layer);
      ASSERT_EQ(rows.weights().view(id, layer).row_group, 1);
      ++n_packed;
    }
  EXPECT_GT(n_packed, 0) << path;
  packed.set_min_gemm_rows(cpu::kNoGemm);
  rows.set_min_gemm_rows(cpu::kNoGemm);
  const auto ids = test::read_json(golden_prompts)["prompts"][0]["ids"].get<std::vector<int32_t>>();
  rows.set_quant_isa(QuantIsa::kScalar);
  const std::vector<float> want = logits_of(rows, ids, true);
  EXPECT_EQ(logits_of(packed, ids, true), want) << path << ": packed avx2 decode vs scalar";
  EXPECT_EQ(logits_of(packed, ids, false), want) << path << ": packed avx2 prefill vs scalar";
  packed.set_quant_isa(QuantIsa::kScalar);
  EXPECT_EQ(logits_of(packed, ids, true), want) << path << ": packed scalar vs scalar";
  rows.set_quant_isa(QuantIsa::kAvx2);
  const double rel = test::rel_error(logits_of(rows, ids, true), want);
  // The one-row AVX2 kernels round differently; through 30 layers' int8 roundings that moves the
  // default model's logits by 0.037 (relative), as far as native weights move them from f32.
  EXPECT_GT(rel, 0.0) << path << ": the one-row AVX2 kernels round differently";
  EXPECT_LT(rel, 0.06) << path;
}

TEST(NativeWeights, PackedProductsGiveTheScalarKernelsLogits) {
  if (cpu::detected_quant_isa() != QuantIsa::kAvx2) GTEST_SKIP() << "no AVX2 here: matrices keep the file's layout";
  expect_packed_equals_scalar(test::golden_dir() + "/gguf/qwen2_q8_0.gguf",
                              test::golden_dir() + "/models/qwen2_untied_f16/reference.json");
  LY_REQUIRE_DEFAULT_MODEL(path);
  expect_packed_equals_scalar(path, test::golden_dir() + "/smollm2/reference.json");
}

// Malformed quantised tensors are refused at open with the loader's messages, before either
// weight format is built.
TEST(NativeWeights, BadQuantisedTensorsAreRefusedWithTheLoadersMessage) {
  const std::string dir = test::temp_dir("native_bad");
  auto with_q8 = [&](const std::string& name, std::vector<uint64_t> ne) {
    test::GgufBuilder g = test::tiny_gguf("llama", {.drop = name});
    const uint64_t n = ne[0] * ne[1];
    std::vector<uint8_t> bytes(size_t(n / 32 * 34), 0);
    g.tensor({name, ne, 8 /* Q8_0 */, bytes});
    return test::write_bytes(dir + "/bad.gguf", g.build());
  };
  for (WeightFormat f : {WeightFormat::kNative, WeightFormat::kF32}) {
    // The tiny model's attn_output is [16, 16]; a Q8_0 one of [16, 32] (ggml order [32, 16]).
    test::expect_error([&] { HostWeights::load(Checkpoint::open(with_q8("blk.0.attn_output.weight", {32, 16})), f); },
                       ErrorCode::kInvalidFile,
                       {"tensor 'blk.0.attn_output.weight' has wrong shape; expected [16, 16], got [16, 32]"});
    // Rows of 48 elements are not whole Q8_0 blocks.
    test::expect_error([&] { HostWeights::load(Checkpoint::open(with_q8("blk.0.attn_output.weight", {48, 16})), f); },
                       ErrorCode::kInvalidFile, {"row length 48, not a multiple of the Q8_0 block size 32"});
  }
  std::filesystem::remove_all(dir);
}

TEST(NativeWeights, QuantisedWeightsAreNotReadAsF32) {
  const Checkpoint ck = Checkpoint::open(test::golden_dir() + "/gguf/qwen2_q8_0.gguf");
  const HostWeights native = HostWeights::load(ck, WeightFormat::kNative);
  EXPECT_EQ(native.view(WeightId::kWo, 1).dtype, DType::kQ8_0);
  EXPECT_EQ(native.view(WeightId::kWo, 1).row_bytes, dtype_bytes(DType::kQ8_0, native.view(WeightId::kWo, 1).cols));
  test::expect_error([&] { native.get(WeightId::kWo, 1); }, ErrorCode::kInternal,
                     {"blk.1.attn_output.weight", "Q8_0"});
  EXPECT_NE(native.get(WeightId::kWq, 1), nullptr);  // a plain weight of the same file is f32
}

}  // namespace
}  // namespace lychee
