// The CPU reference of the FP8 KV cache (--kv-cache-dtype fp8, core/kv_dtype.h): the cache holds
// what an independent e4m3 quantise/dequantise of each token's K (after RoPE) and V per KV head
// gives; every policy runs on it and keeps its equalities; the default model's distributions
// move, within the perplexity target; and the KV budget --kv-memory gives doubles on the
// GPU's FP8 pages (the CPU's f32 cache saves nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "attention/policies.h"
#include "attention/spec_policy.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/kv_dtype.h"
#include "cpu/model.h"
#include "eval/perplexity.h"
#include "model/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "test_util.h"

namespace lychee {
namespace {

struct TinyModel {
  Checkpoint ck;
  cpu::Model model;
  explicit TinyModel(const std::string& name)
      : ck(Checkpoint::open(test::golden_dir() + "/models/" + name)), model(ck.config(), HostWeights::load(ck)) {}
};

std::vector<int32_t> ids_of(int n, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 37 + 11) % vocab);
  return v;
}

// A prompt prefilled in two chunks, then decode steps: rows written by every path that appends.
void feed_all(Session& s, const std::vector<int32_t>& ids, int prefill) {
  s.feed(std::span<const int32_t>(ids).first(size_t(prefill / 2)));
  s.feed(std::span<const int32_t>(ids).subspan(size_t(prefill / 2), size_t(prefill - prefill / 2)));
  for (size_t i = size_t(prefill); i < ids.size(); ++i) s.feed(std::span<const int32_t>(&ids[i], 1));
}

// One [head_dim] row quantised and dequantised with core/fp8.h directly: s = max|x| / 448,
// x -> s * e4m3(x / s).
std::vector<float> e4m3_row(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
  std::vector<float> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = s * e4m3_to_f32(f32_to_e4m3(x[i] / s));
  return out;
}

// Layer 0's K (after RoPE) and V depend only on the token and its position, so the FP8 session's
// rows there are the f32 session's quantised; later layers read an FP8 cache below them, so their
// rows differ from the f32 session's, but each is still a row of e4m3 values times its scale (a
// second rounding moves nothing but the scale's last bit).
TEST(KvFp8, CacheHoldsTheRoundedValues) {
  TinyModel t("llama31_untied_bf16_sharded");
  const ModelConfig& c = t.model.config();
  const std::vector<int32_t> ids = ids_of(40, c.vocab_size);
  CpuSession ref(t.model, 64), fp8(t.model, 64, KvCacheDtype::kFp8);
  feed_all(ref, ids, 30);
  feed_all(fp8, ids, 30);
  ASSERT_EQ(fp8.kv().dtype(), KvCacheDtype::kFp8);
  ASSERT_EQ(fp8.length(), 40);
  const int hd = c.head_dim;
  int rows_changed = 0;
  for (int h = 0; h < c.n_kv_heads; ++h)
    for (int pos = 0; pos < fp8.length(); ++pos)
      for (const bool is_k : {true, false}) {
        const float* x = (is_k ? ref.kv().k(0, h) : ref.kv().v(0, h)) + size_t(pos) * hd;
        const float* got = (is_k ? fp8.kv().k(0, h) : fp8.kv().v(0, h)) + size_t(pos) * hd;
        const std::vector<float> want = e4m3_row(x, hd);
        for (int i = 0; i < hd; ++i)
          ASSERT_EQ(got[i], want[size_t(i)]) << (is_k ? "K" : "V") << " layer 0 head " << h << " pos " << pos << " [" << i << "]";
        rows_changed += !std::equal(x, x + hd, got);
      }
  EXPECT_GT(rows_changed, c.n_kv_heads * fp8.length()) << "FP8 rounding changes most rows";
  for (int l = 1; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int pos = 0; pos < fp8.length(); ++pos)
        for (const float* row : {fp8.kv().k(l, h) + size_t(pos) * hd, fp8.kv().v(l, h) + size_t(pos) * hd}) {
          const std::vector<float> again = e4m3_row(row, hd);
          for (int i = 0; i < hd; ++i)  // 2^-20: far below e4m3's 2^-4 steps, above one f32 ulp of the scale
            ASSERT_NEAR(again[size_t(i)], row[i], std::fabs(row[i]) * 0x1p-20f)
                << "layer " << l << " head " << h << " pos " << pos << " [" << i << "] is not an e4m3 value x scale";
        }
}

// The f32 reference (kBf16 on the CPU) keeps K/V unrounded, and a prefix copies only between caches of one dtype.
TEST(KvFp8, ReferenceIsUnroundedAndPrefixCopyNeedsTheSameDtype) {
  TinyModel t("llama_tied_f32");
  const ModelConfig& c = t.model.config();
  const std::vector<int32_t> ids = ids_of(20, c.vocab_size);
  CpuSession ref(t.model, 32), fp8(t.model, 32, KvCacheDtype::kFp8), into(t.model, 32);
  ref.feed(ids);
  fp8.feed(ids);
  int differ = 0;
  for (int i = 0; i < 20 * c.head_dim; ++i) differ += ref.kv().k(0, 0)[i] != fp8.kv().k(0, 0)[i];
  EXPECT_GT(differ, 0);
  test::expect_error([&] { into.copy_prefix(fp8, 10); }, ErrorCode::kInvalidArgument, {"fp8 cache", "bf16 cache"});
  CpuSession fp8_into(t.model, 32, KvCacheDtype::kFp8);
  fp8_into.copy_prefix(fp8, 10);
  EXPECT_EQ(fp8_into.length(), 10);
}

// Decode-step logits with the fed tokens fixed.
std::vector<std::vector<float>> decode_logits(cpu::Model& m, KvCacheDtype dtype, AttentionPolicy* policy) {
  const std::vector<int32_t> ids = ids_of(46, m.config().vocab_size);
  CpuSession s(m, 64, dtype);
  s.set_policy(policy);
  s.feed(std::span<const int32_t>(ids).first(40));
  std::vector<std::vector<float>> out;
  for (size_t i = 40; i < ids.size(); ++i) {
    const auto l = s.forward(std::span<const int32_t>(&ids[i], 1));
    for (float v : l) EXPECT_TRUE(std::isfinite(v)) << policy->name();
    out.emplace_back(l.begin(), l.end());
  }
  return out;
}

// Every policy runs on the FP8 cache and keeps test_policies' equalities there (reading every
// token == full attention on the same rounded cache); a sparse one differs from itself on f32.
TEST(KvFp8, EveryPolicyRunsAndEqualsFullWhenItReadsEverything) {
  TinyModel t("qwen3_tied_bf16");
  const ModelConfig& c = t.model.config();
  SpecPolicy full(full_spec(c));
  const auto want = decode_logits(t.model, KvCacheDtype::kFp8, &full);
  EXPECT_NE(want, decode_logits(t.model, KvCacheDtype::kBf16, &full)) << "the rounding reaches the logits";
  SelectParams big;
  big.budget = 64;  // >= the 46 tokens of the sequence
  HeadRoles all = make_head_roles(c);
  std::fill(all.retrieval.begin(), all.retrieval.end(), 1);
  SelectParams small;
  small.budget = 3;
  std::vector<std::pair<std::string, DecodeSpec>> covering = {
      {"lychee, every head retrieval", lychee_spec(c, all, 1, small)},
      {"lychee tokens, budget >= length", lychee_spec(c, head_roles_from_layers(c, {0}), 1, big)},
      {"lychee blocks, budget >= length", lychee_spec(c, head_roles_from_layers(c, {0}), 16, big)},
      {"tidal, budget >= length", tidal_spec(c, 64, default_tidal_layers(c.n_layers), 2)},
      {"quest, every page", quest_spec(c, 64, 16, 2)},
      {"duo, sink + recent >= length", duo_spec(c, head_roles_from_layers(c, {0}), 8, 40)}};
  for (auto& [what, spec] : covering) {
    SpecPolicy p(spec);
    EXPECT_EQ(decode_logits(t.model, KvCacheDtype::kFp8, &p), want) << what;
  }
  SelectParams eight;
  eight.budget = 8;
  std::vector<std::pair<std::string, DecodeSpec>> sparse = {
      {"lychee", lychee_spec(c, head_roles_from_layers(c, {0}), 1, eight)},
      {"tidal", tidal_spec(c, 8, {1}, 1)},  // layer 1 selects for layer 2 (of 3)
      {"quest", quest_spec(c, 16, 8, 1)},
      {"duo", duo_spec(c, head_roles_from_layers(c, {0}), 2, 6)}};
  for (auto& [what, spec] : sparse) {
    SpecPolicy p(spec);
    const auto got = decode_logits(t.model, KvCacheDtype::kFp8, &p);
    EXPECT_NE(got, want) << what << " reads less than every token";
    EXPECT_NE(got, decode_logits(t.model, KvCacheDtype::kBf16, &p)) << what << " on the FP8 cache";
  }
}

// The default model, FP8 KV against the f32 cache under full attention: the next-token
// distributions move (KL > 0) and the perplexity stays within the target of +1% (the
// bound is the target, not a measured value). The CPU backend (Engine, cpu_weights f32) as
// `lychee perplexity --kv-cache-dtype fp8 --base-kv-cache-dtype bf16` runs it.
TEST(KvFp8, DefaultModelPerplexityWithinOnePercent) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  EngineOptions ro{path, "cpu"};
  ro.cpu_weights = WeightFormat::kF32;  // the reference weights (the default is native)
  Engine ref(ro);
  EngineOptions o = ro;
  o.kv_cache_dtype = KvCacheDtype::kFp8;
  Engine fp8(o);
  EXPECT_EQ(fp8.kv_cache_dtype(), KvCacheDtype::kFp8);
  const std::vector<int32_t> ids = ref.tokenizer().encode(
      "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
      "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
      "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
      "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
      "other way. In short, the period was so far like the present period, that some of its noisiest authorities "
      "insisted on its being received, for good or for evil, in the superlative degree of comparison only.",
      ref.tokenizer().add_bos_default(), false);
  ASSERT_GE(ids.size(), 128u);
  auto base = ref.new_session(128), test = fp8.new_session(128);
  const PerplexityResult r = compare_perplexity(*base, *test, ids, 128, 1);
  EXPECT_EQ(r.scored, 64);
  EXPECT_GT(r.mean_kl, 0.0) << "FP8 K/V move the distributions";
  EXPECT_LE(r.test_ppl, r.base_ppl * 1.01) << "perplexity " << r.base_ppl << " -> " << r.test_ppl;
  EXPECT_GE(r.test_ppl, r.base_ppl * 0.99) << "perplexity " << r.base_ppl << " -> " << r.test_ppl;
}

// --kv-memory's token budget: the GPU's FP8 pages take head_dim + 4 bytes per token and KV head
// against bf16's 2 x head_dim, so the same memory admits 2 head_dim / (head_dim + 4) times the
// tokens (1.88x at head_dim 64, 1.94x at 128); the CPU caches f32 either way.
TEST(KvFp8, KvMemoryAdmitsTwiceTheTokensOnTheGpu) {
  for (const char* shape : {"smollm2-135m", "llama3-8b"}) {
    const ModelConfig c = model_shape(shape);
    const int64_t bf16 = kv_tokens_for_memory(8.0, c, "cuda", KvCacheDtype::kBf16);
    const int64_t fp8 = kv_tokens_for_memory(8.0, c, "cuda", KvCacheDtype::kFp8);
    const int64_t layer_heads = int64_t(c.n_layers) * c.n_kv_heads;
    EXPECT_EQ(kv_cache_bytes_per_token(c, "cuda", KvCacheDtype::kBf16), layer_heads * 2 * 2 * c.head_dim) << shape;
    EXPECT_EQ(kv_cache_bytes_per_token(c, "cuda", KvCacheDtype::kFp8), layer_heads * 2 * (c.head_dim + 4)) << shape;
    EXPECT_EQ(fp8, (int64_t(8) << 30) / (layer_heads * 2 * (c.head_dim + 4))) << shape;
    const double want = 2.0 * c.head_dim / (c.head_dim + 4);
    EXPECT_NEAR(double(fp8) / double(bf16), want, 1e-3) << shape;
    EXPECT_GE(double(fp8) / double(bf16), 1.88) << shape;
    EXPECT_EQ(kv_tokens_for_memory(8.0, c, "cpu", KvCacheDtype::kFp8), kv_tokens_for_memory(8.0, c, "cpu", KvCacheDtype::kBf16))
        << "the CPU's cache is f32 either way";
    EXPECT_EQ(kv_cache_bytes_per_token(c, "cpu", KvCacheDtype::kFp8), layer_heads * 2 * 4 * c.head_dim) << shape;
  }
  test::expect_error([] { kv_tokens_for_memory(-1.0, model_shape("smollm2-135m"), "cuda", KvCacheDtype::kFp8); },
                     ErrorCode::kInvalidArgument, {"--kv-memory", "-1"});
}

// A decode step's read bytes as FP8 pages hold them: head_dim + 4 per token and KV head for K and V each.
TEST(KvFp8, ReadStatsCountFp8Bytes) {
  KvReadStats s;
  s.token_reads = 10;
  s.correction_token_reads = 2;
  s.dense_token_reads = 20;
  s.metadata_bytes = 7;
  EXPECT_EQ(s.kv_bytes_at(kv_bytes_per_token_head(KvCacheDtype::kFp8, 64)), 12u * 68 * 2 + 7);
  EXPECT_EQ(s.dense_kv_bytes_at(kv_bytes_per_token_head(KvCacheDtype::kFp8, 64)), 20u * 68 * 2);
  EXPECT_EQ(s.kv_bytes_at(kv_bytes_per_token_head(KvCacheDtype::kBf16, 64)), s.kv_bytes(64));
  EXPECT_EQ(s.dense_kv_bytes_at(kv_bytes_per_token_head(KvCacheDtype::kBf16, 64)), s.dense_kv_bytes(64));
}

TEST(KvFp8, OptionNamesAreVllms) {
  EXPECT_EQ(kv_cache_dtype_from_name("auto"), KvCacheDtype::kBf16);
  EXPECT_EQ(kv_cache_dtype_from_name("bf16"), KvCacheDtype::kBf16);
  EXPECT_EQ(kv_cache_dtype_from_name("fp8"), KvCacheDtype::kFp8);
  EXPECT_EQ(kv_cache_dtype_from_name("fp8_e4m3"), KvCacheDtype::kFp8);
  EXPECT_FALSE(kv_cache_dtype_from_name("fp8_e5m2").has_value());
  EXPECT_FALSE(kv_cache_dtype_from_name("int8").has_value());
}

}  // namespace
}  // namespace lychee
