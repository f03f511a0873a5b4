// FP8 E4M3 conversion (core/fp8.h): every code round-trips, every f32 rounds to the nearest code
// with ties to even (checked against a brute-force search over all codes at each pair's value,
// midpoint and the f32 neighbours of the midpoint), saturation at 448, and the per-row scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace lychee {
namespace {

// The nearest finite non-negative code to a >= 0 by exhaustive search; ties to the even code.
uint8_t nearest_code(float a) {
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(double(e4m3_to_f32(uint8_t(c))) - double(a));
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  return uint8_t(best);
}

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(uint8_t(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(f32_to_e4m3(v), uint8_t(c)) << "code " << c << " value " << v;
  }
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.0f);
}

TEST(Fp8E4m3, RoundsToNearestTiesToEvenLikeABruteForceSearch) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_f32(uint8_t(c)), hi = e4m3_to_f32(uint8_t(c + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: both are short binary fractions
    std::vector<float> xs = {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), hi};
    for (int i = 0; i < 8; ++i) xs.push_back(lo + (hi - lo) * std::uniform_real_distribution<float>(0, 1)(rng));
    for (const float x : xs) {
      const uint8_t want = nearest_code(x);
      EXPECT_EQ(f32_to_e4m3(x), want) << "x = " << x << " between codes " << c << " and " << c + 1;
      EXPECT_EQ(f32_to_e4m3(-x), uint8_t(want | 0x80)) << "x = " << -x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1500);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // halfway to the smallest subnormal: even (0)
  EXPECT_EQ(f32_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // halfway between 1 and 2 (x 2^-9): even
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0x00);
}

TEST(Fp8E4m3, SaturatesAndKeepsNaN) {
  for (const float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e9f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(f32_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(f32_to_e4m3(-x), 0xFE) << -x;
  }
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

TEST(Fp8E4m3, RowsScaleToTheirLargestValue) {
  const std::vector<float> w = {0.5f, -2.0f, 0.001f, 1.0f,   // row 0: max |w| = 2
                                0.0f, 0.0f, 0.0f, 0.0f};     // row 1: zeros
  std::vector<uint8_t> codes(8);
  std::vector<float> scales(2);
  quantize_rows_e4m3(w.data(), 2, 4, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 2.0f / 448.0f);
  EXPECT_EQ(codes[1], 0xFE);  // -2 / s = -448
  EXPECT_EQ(scales[1], 1.0f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(codes[size_t(i)], 0x00);
  // The round trip stands within half a step: 2^-4 relative in the normal range, half the
  // smallest subnormal step (2^-10 s) below it.
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> m(64 * 96);
  for (float& v : m) v = dist(rng);
  m[5] = 0.3f;  // an outlier channel
  std::vector<float> r = m;
  round_rows_through_e4m3(r.data(), 64, 96);
  for (int row = 0; row < 64; ++row) {
    const float s = e4m3_row_scale(&m[size_t(row) * 96], 96);
    for (int i = 0; i < 96; ++i) {
      const size_t k = size_t(row) * 96 + size_t(i);
      EXPECT_LE(std::fabs(r[k] - m[k]), std::fmax(std::fabs(m[k]) / 16, s * std::ldexp(1.0f, -10)) * 1.0001f)
          << "row " << row << " col " << i;
      EXPECT_EQ(r[k], e4m3_to_f32(f32_to_e4m3(m[k] / s)) * s);
    }
  }
}

// --cpu-weights fp8: the seven linear matrices hold their rows rounded through e4m3 (per-row
// scale), everything else is the f32 reference's.
TEST(Fp8Weights, LinearMatricesAreRoundedAndTheRestIsUntouched) {
  const Checkpoint ck = Checkpoint::open(test::golden_dir() + "/gguf/qwen2_q8_0.gguf");
  const HostWeights ref = HostWeights::load(ck, WeightFormat::kF32);
  const HostWeights fp8 = HostWeights::load(ck, WeightFormat::kFp8);
  EXPECT_EQ(fp8.format(), WeightFormat::kFp8);
  for (int layer = 0; layer < ck.config().n_layers; ++layer)
    for (WeightId id : {WeightId::kWq, WeightId::kWk, WeightId::kWv, WeightId::kWo, WeightId::kWGate, WeightId::kWUp,
                        WeightId::kWDown}) {
      const WeightView& v = ref.view(id, layer);
      std::vector<float> want(v.f32(), v.f32() + v.rows * v.cols);
      round_rows_through_e4m3(want.data(), v.rows, v.cols);
      const float* got = fp8.get(id, layer);
      ASSERT_EQ(std::vector<float>(got, got + v.rows * v.cols), want) << int(id) << " layer " << layer;
      EXPECT_NE(want, std::vector<float>(v.f32(), v.f32() + v.rows * v.cols)) << "rounding changed nothing";
    }
  for (WeightId id : {WeightId::kTokEmbd, WeightId::kAttnNorm, WeightId::kBq, WeightId::kOutputNorm}) {
    const WeightView& v = ref.view(id, 0);
    ASSERT_NE(v.data, nullptr) << int(id);
    EXPECT_EQ(std::vector<float>(fp8.get(id, 0), fp8.get(id, 0) + v.rows * v.cols),
              std::vector<float>(v.f32(), v.f32() + v.rows * v.cols)) << int(id);
  }
  EXPECT_STREQ(weight_format_name(WeightFormat::kFp8), "fp8");
}

// Fp8Keep: the kept layers' Q, K and V stay the f32 reference's, their O and MLP matrices and every
// other layer's linear matrices are rounded as without it; kF32 ignores it.
TEST(Fp8Weights, KeptLayersHoldTheirQkvUnrounded) {
  const Checkpoint ck = Checkpoint::open(test::golden_dir() + "/gguf/qwen2_q8_0.gguf");
  ASSERT_GE(ck.config().n_layers, 2);
  const Fp8Keep keep{{1}};
  EXPECT_TRUE(keep.keeps_qkv(1));
  EXPECT_FALSE(keep.keeps_qkv(0));
  EXPECT_TRUE(keep.keeps(WeightId::kWk, 1));
  EXPECT_FALSE(keep.keeps(WeightId::kWo, 1));
  const HostWeights ref = HostWeights::load(ck, WeightFormat::kF32);
  const HostWeights all = HostWeights::load(ck, WeightFormat::kFp8);
  const HostWeights kept = HostWeights::load(ck, WeightFormat::kFp8, keep);
  const auto values = [](const HostWeights& w, WeightId id, int layer) { return test::weight_values(w, id, layer); };
  for (int layer = 0; layer < ck.config().n_layers; ++layer)
    for (WeightId id : {WeightId::kWq, WeightId::kWk, WeightId::kWv, WeightId::kWo, WeightId::kWGate, WeightId::kWUp,
                        WeightId::kWDown}) {
      const bool unrounded = layer == 1 && (id == WeightId::kWq || id == WeightId::kWk || id == WeightId::kWv);
      EXPECT_EQ(values(kept, id, layer), values(unrounded ? ref : all, id, layer)) << int(id) << " layer " << layer;
    }
  const HostWeights f32_kept = HostWeights::load(ck, WeightFormat::kF32, keep);
  EXPECT_EQ(values(f32_kept, WeightId::kWo, 0), values(ref, WeightId::kWo, 0));
}

}  // namespace
}  // namespace lychee
