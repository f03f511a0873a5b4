#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace lychee {
namespace {

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), uint16_t(h)) << "half 0x" << std::hex << h;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);            // rounds to infinity
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(DType, BF16RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  for (int i = 0; i < 10000; ++i) {
    const float f = dist(rng);
    const float r = bf16_to_f32(f32_to_bf16(f));
    // The nearest bf16 is within half a unit in the last place (8 bits of mantissa).
    EXPECT_LE(std::fabs(r - f), std::ldexp(std::fabs(f), -8)) << f;
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // The bound above holds for both neighbours at an exact tie (low 16 bits 0x8000): ties go to
  // the even neighbour (last kept bit 0), checked bit for bit.
  auto bits_to_f32 = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const struct {
    uint32_t f32;
    uint16_t bf16;
  } cases[] = {
      {0x3f808000u, 0x3f80},  // 1 + half an ulp: down to the even 0x3f80
      {0x3f818000u, 0x3f82},  // odd 0x3f81 + half: up to the even 0x3f82
      {0xbf808000u, 0xbf80},  // the same with the sign set
      {0xbf818000u, 0xbf82},
      {0x3fff8000u, 0x4000},  // the tie carries into the exponent
      {0x00018000u, 0x0002},  // subnormal: odd + half rounds up
      {0x00008000u, 0x0000},  // subnormal: zero + half rounds down to zero
      {0x3f808001u, 0x3f81},  // just above the tie: up
      {0x3f817fffu, 0x3f81},  // just below the tie: down
  };
  for (const auto& c : cases)
    EXPECT_EQ(f32_to_bf16(bits_to_f32(c.f32)), c.bf16) << std::hex << "f32 bits 0x" << c.f32;
}

// Blocks built by hand: scale d, min m and nibbles chosen so the expected values are exact.
TEST(DType, DequantQ4_1MatchesDefinition) {
  std::vector<uint8_t> block(20);
  const uint16_t d = f32_to_f16(0.5f), m = f32_to_f16(-3.0f);
  std::memcpy(block.data(), &d, 2);
  std::memcpy(block.data() + 2, &m, 2);
  for (int j = 0; j < 16; ++j) block[4 + j] = uint8_t((j & 0xf) | ((15 - j) << 4));
  float out[32];
  convert_to_f32(DType::kQ4_1, block.data(), 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 3.0f);
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 3.0f);
  }
}

TEST(DType, DequantQ4_0AndQ8_0MatchDefinition) {
  std::vector<uint8_t> q4(18), q8(34);
  const uint16_t d = f32_to_f16(0.25f);
  std::memcpy(q4.data(), &d, 2);
  std::memcpy(q8.data(), &d, 2);
  for (int j = 0; j < 16; ++j) q4[2 + j] = uint8_t(j | ((j ^ 5) << 4));
  for (int j = 0; j < 32; ++j) q8[2 + j] = uint8_t(int8_t(j * 7 - 100));
  float o4[32], o8[32];
  convert_to_f32(DType::kQ4_0, q4.data(), 32, o4);
  convert_to_f32(DType::kQ8_0, q8.data(), 32, o8);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(o4[j], 0.25f * (j - 8));
    EXPECT_EQ(o4[j + 16], 0.25f * ((j ^ 5) - 8));
  }
  for (int j = 0; j < 32; ++j) EXPECT_EQ(o8[j], 0.25f * float(j * 7 - 100));
}

}  // namespace
}  // namespace lychee
