// Random GGUF blocks and activations for the CPU's quantised-product tests (test_cpu_quant.cpp,
// test_cpu_quant_pack.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace lychee::test {

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// n_blocks random blocks of type t: random code bytes (or every code byte `fill` when fill >= 0,
// the extreme codes), scales of a realistic range and mins no larger than the codes' range, as
// quantisers write them (a min is about the block's minimum value).
inline std::vector<uint8_t> random_blocks(DType t, int64_t n_blocks, std::mt19937& rng, int fill = -1) {
  const int64_t bb = dtype_block_bytes(t);
  std::vector<uint8_t> out(size_t(n_blocks * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f), unit(0.0f, 1.0f);
  for (auto& b : out) b = uint8_t(fill >= 0 ? fill : byte(rng));
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* b = out.data() + i * bb;
    const float d = scale(rng) * (unit(rng) < 0.5f ? -1.0f : 1.0f);
    switch (t) {
      case DType::kQ8_0:
      case DType::kQ4_0: put_f16(b, d); break;
      case DType::kQ4_1:
        put_f16(b, std::fabs(d));
        put_f16(b + 2, -15.0f * std::fabs(d) * unit(rng));
        break;
      case DType::kQ4_K:
      case DType::kQ5_K:
        put_f16(b, std::fabs(d) / 16);  // times 6-bit sub-block scales
        put_f16(b + 2, std::fabs(d) * unit(rng) / 4);
        break;
      case DType::kQ6_K: put_f16(b + 208, d / 64); break;  // times int8 sub-block scales
      case DType::kQ8_K: std::memcpy(b, &d, 4); break;
      default: ADD_FAILURE() << "not a block type";
    }
  }
  return out;
}

// Activations: mostly uniform in [-1, 1] with a few large outliers, as hidden states have.
inline std::vector<float> random_activations(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pick(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = pick(rng) < 0.01f ? 20.0f * u(rng) : u(rng);
  return x;
}

}  // namespace lychee::test
