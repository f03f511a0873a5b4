// lychee's dequantisers against the gguf Python package's reference on random blocks, bit for bit
// (goldens written by scripts/goldens/make_quant_goldens.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/dtype.h"
#include "test_util.h"

namespace lychee {
namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path << " (run scripts/goldens/make_quant_goldens.py)";
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class QuantGolden : public ::testing::TestWithParam<DType> {};

TEST_P(QuantGolden, DequantisesBitForBitLikeTheGgufPackage) {
  const DType t = GetParam();
  const std::string base = test::golden_dir() + "/quants/" + std::string(dtype_name(t));
  const std::vector<uint8_t> blocks = read_bytes(base + ".blocks");
  const std::vector<uint8_t> want_bytes = read_bytes(base + ".f32");
  ASSERT_FALSE(blocks.empty());
  ASSERT_EQ(blocks.size() % size_t(dtype_block_bytes(t)), 0u);
  const int64_t n = int64_t(blocks.size()) / dtype_block_bytes(t) * dtype_block_elems(t);
  ASSERT_EQ(want_bytes.size(), size_t(n) * 4);
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
  convert_to_f32(t, blocks.data(), n, got.data());
  int64_t n_bad = 0, first_bad = -1, n_nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    // NaN payloads depend on the hardware that multiplied; any NaN matches any NaN.
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    n_nan += both_nan;
    if (!both_nan && std::memcmp(&got[i], &want[i], 4) != 0) {
      if (first_bad < 0) first_bad = i;
      ++n_bad;
    }
  }
  EXPECT_EQ(n_bad, 0) << dtype_name(t) << ": " << n_bad << " of " << n
                      << " values differ; first at element " << first_bad << " (block "
                      << first_bad / dtype_block_elems(t) << "): " << got[size_t(first_bad)]
                      << " vs " << want[size_t(first_bad)];
  // The goldens hold one block with an infinite scale, except Q8_K (f32 scale, kept finite).
  if (t != DType::kQ8_K && t != DType::kQ8_0) {
    EXPECT_GT(n_nan, 0) << dtype_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Gguf, QuantGolden,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K,
                                           DType::kQ5_K, DType::kQ6_K, DType::kQ8_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(QuantGolden, KQuantBlockSizesMatchGgml) {
  // GGML_QUANT_SIZES: (256, 144), (256, 176), (256, 210), (256, 292).
  EXPECT_EQ(dtype_block_bytes(DType::kQ4_K), 144);
  EXPECT_EQ(dtype_block_bytes(DType::kQ5_K), 176);
  EXPECT_EQ(dtype_block_bytes(DType::kQ6_K), 210);
  EXPECT_EQ(dtype_block_bytes(DType::kQ8_K), 292);
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K})
    EXPECT_EQ(dtype_block_elems(t), 256) << dtype_name(t);
}

}  // namespace
}  // namespace lychee
