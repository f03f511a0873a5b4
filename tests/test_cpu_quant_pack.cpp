// The eight-row layout of quantised matrices (cpu/quant_pack.h) and its kernels: packing keeps
// every row's bytes, and each row's product equals the scalar one-row kernel's on the file's
// row bit for bit, through the kernels alone and through linear() at awkward row counts.
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/quant_dot.h"
#include "cpu/quant_pack.h"
#include "cpu/weight_linear.h"
#include "quant_blocks.h"

namespace lychee::cpu {
namespace {

using test::random_activations;
using test::random_blocks;

const DType kPackTypes[] = {DType::kQ4_1, DType::kQ8_0};

// The eight-row kernels to check on this CPU: the scalar twin, and the AVX2 and AVX-VNNI builds
// where the CPU runs them.
struct Kernel {
  const char* name;
  QuantDot8Fn q4_1, q8_0;
};
std::vector<Kernel> kernels() {
  std::vector<Kernel> v = {{"scalar", quant_dot8_fn(DType::kQ4_1, QuantIsa::kScalar),
                            quant_dot8_fn(DType::kQ8_0, QuantIsa::kScalar)}};
#if defined(__x86_64__)
  if (detected_quant_isa() == QuantIsa::kAvx2) v.push_back({"avx2", avx2::dot8_q4_1, avx2::dot8_q8_0});
  if (detected_quant_isa() == QuantIsa::kAvx2 && __builtin_cpu_supports("avxvnni"))
    v.push_back({"avx2 + avx-vnni", avx2vnni::dot8_q4_1, avx2vnni::dot8_q8_0});
#endif
  return v;
}

std::vector<Q8Block> quantised(const std::vector<float>& x) {
  std::vector<Q8Block> q(x.size() / 32);
  quantize_row_q8(x.data(), int64_t(x.size()), q.data());
  return q;
}

TEST(PackRows8, EveryRowComesBackAsTheFileHasIt) {
  std::mt19937 rng(41);
  for (DType t : kPackTypes)
    for (int64_t cols : {32, 96, 576})
      for (int64_t rows : {1, 7, 8, 9, 19, 64, 99}) {
        const int64_t row_bytes = dtype_bytes(t, cols);
        const std::vector<uint8_t> file = random_blocks(t, rows * cols / 32, rng);
        std::vector<uint8_t> packed = file;
        pack_rows8(t, packed.data(), rows, cols);
        const int64_t grouped = rows / kPackRows * kPackRows;
        // The groups are reordered (not a copy) and the rows past them kept.
        if (grouped > 0) {
          EXPECT_FALSE(std::equal(packed.begin(), packed.begin() + grouped * row_bytes, file.begin()))
              << dtype_name(t) << " cols " << cols << " rows " << rows;
        }
        EXPECT_TRUE(std::equal(packed.begin() + grouped * row_bytes, packed.end(), file.begin() + grouped * row_bytes));
        std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
        for (int64_t r = 0; r < rows; ++r) {
          packed_row(t, packed.data(), rows, cols, r, row.data());
          ASSERT_TRUE(std::equal(row.begin(), row.end(), file.begin() + r * row_bytes))
              << dtype_name(t) << " cols " << cols << " rows " << rows << " row " << r;
        }
      }
  EXPECT_THROW(pack_rows8(DType::kQ4_K, nullptr, 8, 256), Error);
  EXPECT_THROW(quant_dot8_fn(DType::kQ6_K, QuantIsa::kScalar), Error);
}

// Each kernel's eight outputs against the scalar one-row kernel on the file's rows, bit for bit,
// on random codes and on the extreme codes against full-scale activations.
TEST(QuantDot8, EachRowEqualsTheScalarKernelBitForBit) {
  std::mt19937 rng(43);
  for (DType t : kPackTypes)
    for (int64_t n : {32, 96, 576, 1536})
      for (int fill : {-1, 0x00, 0x0f, 0xff, 0x80, 0x7f}) {
        const int64_t row_bytes = dtype_bytes(t, n);
        const std::vector<uint8_t> file = random_blocks(t, kPackRows * n / 32, rng, fill);
        std::vector<uint8_t> packed = file;
        pack_rows8(t, packed.data(), kPackRows, n);
        std::vector<float> a = random_activations(n, rng);
        if (fill >= 0)
          for (size_t i = 0; i < a.size(); ++i) a[i] = (i % 3 == 0) ? -1.0f : 1.0f;
        const std::vector<Q8Block> q = quantised(a);
        const QuantDotFn scalar = quant_dot_fn(t, QuantIsa::kScalar);
        for (const Kernel& k : kernels()) {
          float out[kPackRows];
          (t == DType::kQ4_1 ? k.q4_1 : k.q8_0)(packed.data(), q.data(), n, out);
          for (int r = 0; r < int(kPackRows); ++r) {
            const float want = scalar(file.data() + r * row_bytes, q.data(), n);
            ASSERT_EQ(std::bit_cast<uint32_t>(out[r]), std::bit_cast<uint32_t>(want))
                << k.name << " " << dtype_name(t) << " n " << n << " fill " << fill << " row " << r << ": " << out[r]
                << " vs " << want;
          }
        }
      }
}

// linear() on a packed view at awkward row counts (groups, the rows past them, several 64-row
// tiles) and activation row counts: every element what the scalar kernel gives on the file's
// row; the dequantised sgemm and an embedding row read the packed matrix as the file's.
TEST(QuantDot8, LinearOnAPackedMatrixEqualsTheScalarKernels) {
  std::mt19937 rng(47);
  for (DType t : kPackTypes)
    for (int64_t m : {1, 3, 8, 19, 99, 130}) {
      const int64_t k = 96, row_bytes = dtype_bytes(t, k);
      const std::vector<uint8_t> file = random_blocks(t, m * k / 32, rng);
      std::vector<uint8_t> packed = file;
      pack_rows8(t, packed.data(), m, k);
      const WeightView rows{t, file.data(), m, k, row_bytes};
      const WeightView groups{t, packed.data(), m, k, row_bytes, kPackRows};
      const QuantDotFn scalar = quant_dot_fn(t, QuantIsa::kScalar);
      for (int n : {1, 2, 17}) {
        const std::vector<float> x = random_activations(n * k, rng);
        const std::vector<Q8Block> q = quantised(x);
        for (QuantIsa isa : {QuantIsa::kScalar, detected_quant_isa()}) {
          LinearScratch s;
          std::vector<float> got(size_t(n * m));
          linear(x.data(), groups, nullptr, got.data(), n, isa, s);
          for (int i = 0; i < n; ++i)
            for (int64_t j = 0; j < m; ++j)
              ASSERT_EQ(got[size_t(i * m + j)], scalar(file.data() + j * row_bytes, q.data() + i * (k / 32), k))
                  << dtype_name(t) << " m " << m << " n " << n << " row " << i << " col " << j << " "
                  << quant_isa_name(isa);
          std::vector<float> want_gemm(size_t(n * m)), got_gemm(size_t(n * m));
          linear(x.data(), rows, nullptr, want_gemm.data(), n, isa, s, LinearProduct::kDequantGemm);
          linear(x.data(), groups, nullptr, got_gemm.data(), n, isa, s, LinearProduct::kDequantGemm);
          EXPECT_EQ(got_gemm, want_gemm) << dtype_name(t) << " m " << m << " n " << n;
        }
      }
      std::vector<float> want_row(static_cast<size_t>(k)), got_row(static_cast<size_t>(k));
      for (int64_t j = 0; j < m; ++j) {
        weight_row_f32(rows, j, want_row.data());
        weight_row_f32(groups, j, got_row.data());
        ASSERT_EQ(got_row, want_row) << dtype_name(t) << " m " << m << " row " << j;
      }
    }
}

}  // namespace
}  // namespace lychee::cpu
