// The CPU's quantised-weight products (cpu/quant_dot.h, cpu/weight_linear.h) against
// dequantise-then-f32 on random blocks of every GGUF block type, scalar and AVX2 alike.
#include <gtest/gtest.h>

#include <cstdlib>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu/decode_attention.h"
#include "cpu/ops.h"
#include "cpu/quant_dot.h"
#include "cpu/weight_linear.h"
#include "quant_blocks.h"

namespace lychee::cpu {
namespace {

using test::random_activations;
using test::random_blocks;

const DType kTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K,
                        DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

std::vector<QuantIsa> isas() {
  std::vector<QuantIsa> v = {QuantIsa::kScalar};
  if (detected_quant_isa() == QuantIsa::kAvx2) v.push_back(QuantIsa::kAvx2);
  return v;
}

std::vector<float> dequantised(const std::vector<Q8Block>& q) {
  std::vector<float> x;
  for (const Q8Block& b : q)
    for (int i = 0; i < 32; ++i) x.push_back(b.d * float(b.q[i]));
  return x;
}

TEST(QuantizeRowQ8, RoundsToNearestWithinHalfAStepAndKeepsSums) {
  std::mt19937 rng(7);
  std::vector<float> x = random_activations(32 * 9, rng);
  for (int i = 64; i < 96; ++i) x[size_t(i)] = 0.0f;  // an all-zero block
  std::vector<Q8Block> q(9);
  quantize_row_q8(x.data(), int64_t(x.size()), q.data());
  EXPECT_EQ(q[2].d, 0.0f);
  for (int b = 0; b < 9; ++b) {
    int sums[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      const float xi = x[size_t(32 * b + i)];
      EXPECT_GE(q[b].q[i], -127);
      // x * (1/d) is rounded once before rounding to an integer: half a step plus f32 rounding.
      EXPECT_LE(std::fabs(xi - q[b].d * q[b].q[i]), q[b].d * (0.5f + 1e-5f)) << "block " << b << " element " << i;
      sums[i / 16] += q[b].q[i];
    }
    EXPECT_EQ(q[b].sum[0], sums[0]);
    EXPECT_EQ(q[b].sum[1], sums[1]);
  }
  // The largest element of a block gets the full code.
  for (int b : {0, 1, 3}) {
    int qmax = 0;
    for (int i = 0; i < 32; ++i) qmax = std::max(qmax, std::abs(int(q[b].q[i])));
    EXPECT_EQ(qmax, 127);
  }
}

// quantize_row_q8 takes the AVX2 loop where the CPU has it: the same blocks as the scalar loop
// bit for bit, on random rows (an all-zero block and outliers among them) and on rows of exact
// half-step ties (x * (1 / d) = k + 0.5, rounded to even by both).
TEST(QuantizeRowQ8, Avx2EqualsTheScalarLoopBitForBit) {
  std::mt19937 rng(29);
  for (int64_t n : {32, 96, 576, 1536}) {
    std::vector<float> x = random_activations(n, rng);
    for (int i = 0; i < 32 && n > 64; ++i) x[size_t(32 + i)] = 0.0f;
    std::vector<float> ties(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ties[size_t(i)] = i % 32 == 0 ? 127.0f : float(i % 7 - 3) + 0.5f;
    for (const std::vector<float>* row : {&x, &ties}) {
      std::vector<Q8Block> got(size_t(n / 32)), want(size_t(n / 32));
      quantize_row_q8(row->data(), n, got.data());
      quantize_row_q8_scalar(row->data(), n, want.data());
      for (int64_t b = 0; b < n / 32; ++b)
        ASSERT_EQ(std::memcmp(&got[size_t(b)], &want[size_t(b)], sizeof(Q8Block)), 0) << "n " << n << " block " << b;
    }
  }
  if (detected_quant_isa() != QuantIsa::kAvx2) GTEST_SKIP() << "no AVX2 here: both are the scalar loop";
}

// The kernels' f32 rounding: each of the n/32 block terms (an exact integer sum times an f32
// scale product) and its accumulation add at most a few ulps of the term, so the error is within
// (n/256 + 12) * 2^-24 of Σ|terms|: ~1.3e-6 of it at n = 4128, the largest size here. The terms
// (codes times scale, and the offset or min part apart) can cancel; for the blocks above (mins at
// most the codes' range) Σ|terms| <= 3 Σ|ŵ||â|. 1e-5 Σ|ŵ||â| covers both with 2x to spare.
double rounding_tol(const std::vector<float>& w, const std::vector<float>& a) {
  double m = 0;
  for (size_t i = 0; i < w.size(); ++i) m += std::fabs(double(w[i]) * a[i]);
  return 1e-5 * m;
}

struct DotCase {
  DType t;
  int64_t n;
  int fill;  // -1: random codes; else every code byte
};

std::vector<DotCase> dot_cases() {
  std::vector<DotCase> v;
  for (DType t : kTypes) {
    const bool k = dtype_block_elems(t) == 256;
    for (int64_t n : k ? std::vector<int64_t>{256, 768, 2816, 4096} : std::vector<int64_t>{32, 96, 576, 1536, 4128}) {
      v.push_back({t, n, -1});
    }
    for (int fill : {0x0f, 0xff, 0x80}) v.push_back({t, k ? 512 : 64, fill});
  }
  return v;
}

class QuantDot : public ::testing::TestWithParam<DotCase> {};

// Against the f32 dot of the dequantised weights: with the quantised activation â within
// rounding (the kernel's integer sums are exact), with the activation a itself within the
// activation's quantisation error Σ|ŵ_i| |a_i - â_i| (computed from the blocks) plus rounding.
TEST_P(QuantDot, MatchesDequantiseThenDot) {
  const DotCase& p = GetParam();
  std::mt19937 rng(uint32_t(p.n * 31 + int(p.t) * 7 + p.fill + 1));
  const std::vector<uint8_t> w = random_blocks(p.t, p.n / dtype_block_elems(p.t), rng, p.fill);
  std::vector<float> a = random_activations(p.n, rng);
  if (p.fill >= 0)  // extreme codes against full-scale activations: the widest integer sums
    for (size_t i = 0; i < a.size(); ++i) a[i] = (i % 3 == 0) ? -1.0f : 1.0f;
  std::vector<Q8Block> q(static_cast<size_t>(p.n / 32));
  quantize_row_q8(a.data(), p.n, q.data());
  const std::vector<float> ah = dequantised(q);
  std::vector<float> wh(static_cast<size_t>(p.n));
  convert_to_f32(p.t, w.data(), p.n, wh.data());
  double ref_q = 0, ref = 0, quant_err = 0;
  for (size_t i = 0; i < wh.size(); ++i) {
    ref_q += double(wh[i]) * ah[i];
    ref += double(wh[i]) * a[i];
    quant_err += std::fabs(double(wh[i])) * std::fabs(double(a[i]) - ah[i]);
  }
  const double tol = rounding_tol(wh, ah);
  ASSERT_GT(tol, 0.0);
  std::vector<float> got;
  for (QuantIsa isa : isas()) {
    const float g = quant_dot_fn(p.t, isa)(w.data(), q.data(), p.n);
    got.push_back(g);
    const std::string where = fmt::format("{} n={} fill={} {}", dtype_name(p.t), p.n, p.fill, quant_isa_name(isa));
    EXPECT_NEAR(g, ref_q, tol) << where << " against the dequantised activation";
    EXPECT_NEAR(g, ref, quant_err + tol) << where << " against the f32 activation";
  }
  if (got.size() == 2) {
    EXPECT_NEAR(got[0], got[1], 2 * tol) << dtype_name(p.t) << " scalar vs avx2";
  }
  // The bound is not vacuous: the activation's quantisation error is a small part of the product.
  if (p.fill < 0) {
    EXPECT_LT(quant_err, 0.1 * rounding_tol(wh, a) / 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantDot, ::testing::ValuesIn(dot_cases()), [](const auto& info) {
  const DotCase& c = info.param;
  return fmt::format("{}_n{}{}", dtype_name(c.t), c.n, c.fill < 0 ? "" : fmt::format("_fill{:02x}", c.fill));
});

// The AVX-VNNI build of the kernels (quant_dot_vnni.cpp) sums the same integers as the AVX2
// build, so every result is the same bit for bit, one row or four, on random and extreme codes.
TEST(QuantDotVnni, EqualsTheAvx2KernelsBitForBit) {
  if (detected_quant_isa() != QuantIsa::kAvx2 || !__builtin_cpu_supports("avxvnni"))
    GTEST_SKIP() << "this CPU has no AVX-VNNI: the AVX-VNNI kernels are not run here";
  struct Pair {
    DType t;
    QuantDotFn a, v;
  };
  const Pair pairs[] = {{DType::kQ8_0, cpu::avx2::dot_q8_0, cpu::avx2vnni::dot_q8_0},
                        {DType::kQ4_0, cpu::avx2::dot_q4_0, cpu::avx2vnni::dot_q4_0},
                        {DType::kQ4_1, cpu::avx2::dot_q4_1, cpu::avx2vnni::dot_q4_1},
                        {DType::kQ4_K, cpu::avx2::dot_q4_k, cpu::avx2vnni::dot_q4_k},
                        {DType::kQ5_K, cpu::avx2::dot_q5_k, cpu::avx2vnni::dot_q5_k},
                        {DType::kQ6_K, cpu::avx2::dot_q6_k, cpu::avx2vnni::dot_q6_k},
                        {DType::kQ8_K, cpu::avx2::dot_q8_k, cpu::avx2vnni::dot_q8_k}};
  std::mt19937 rng(11);
  constexpr int64_t n = 1536, rows = 4;
  for (const Pair& p : pairs)
    for (const int fill : {-1, 0x00, 0xff, 0x80, 0x7f}) {
      const std::vector<uint8_t> w = random_blocks(p.t, n / dtype_block_elems(p.t), rng, fill);
      std::vector<float> a = random_activations(n * rows, rng);
      if (fill >= 0)
        for (size_t i = 0; i < a.size(); ++i) a[i] = (i % 3 == 0) ? -1.0f : 1.0f;
      std::vector<Q8Block> q(size_t(n * rows / 32));
      for (int64_t r = 0; r < rows; ++r) quantize_row_q8(a.data() + r * n, n, q.data() + r * (n / 32));
      for (int64_t r = 0; r < rows; ++r) {
        const Q8Block* qr = q.data() + r * (n / 32);
        EXPECT_EQ(p.a(w.data(), qr, n), p.v(w.data(), qr, n)) << dtype_name(p.t) << " fill " << fill;
      }
      if (p.t == DType::kQ4_1) {
        float x[4], y[4];
        cpu::avx2::dot4_q4_1(w.data(), q.data(), n / 32, n, x);
        cpu::avx2vnni::dot4_q4_1(w.data(), q.data(), n / 32, n, y);
        for (int r = 0; r < 4; ++r) EXPECT_EQ(x[r], y[r]) << "four rows, row " << r << " fill " << fill;
      }
    }
  EXPECT_TRUE(quant_vnni() || std::getenv("LYCHEE_QUANT_VNNI") != nullptr) << "the CPU has AVX-VNNI, so kAvx2 uses it";
}

// The AVX2 dequantisers (the dequantised sgemm's tiles) give convert_to_f32's values bit for bit,
// on random and extreme codes; other types and kScalar go through convert_to_f32 itself.
TEST(DequantizeRow, Avx2EqualsConvertToF32BitForBit) {
  std::mt19937 rng(23);
  constexpr int64_t n = 1536;
  for (const DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K})
    for (const int fill : {-1, 0x00, 0xff, 0x80, 0x7f}) {
      const std::vector<uint8_t> w = random_blocks(t, n / dtype_block_elems(t), rng, fill);
      std::vector<float> want(static_cast<size_t>(n)), scalar(static_cast<size_t>(n), -1.0f);
      convert_to_f32(t, w.data(), n, want.data());
      dequantize_row(t, w.data(), n, scalar.data(), QuantIsa::kScalar);
      ASSERT_EQ(scalar, want) << dtype_name(t);
      if (detected_quant_isa() != QuantIsa::kAvx2) continue;
      std::vector<float> got(static_cast<size_t>(n), -1.0f);
      dequantize_row(t, w.data(), n, got.data(), QuantIsa::kAvx2);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i)]), std::bit_cast<uint32_t>(want[size_t(i)]))
            << dtype_name(t) << " fill " << fill << " element " << i;
    }
  if (detected_quant_isa() != QuantIsa::kAvx2) GTEST_SKIP() << "no AVX2 here: only the scalar path was checked";
}

TEST(QuantDot, RefusesPlainTypes) {
  EXPECT_THROW(quant_dot_fn(DType::kF32, QuantIsa::kScalar), Error);
  EXPECT_THROW(quant_dot_fn(DType::kBF16, QuantIsa::kScalar), Error);
}

// linear() on a quantised WeightView against ops.h's f32 linear on the dequantised matrix, at
// awkward row counts (across the 16-row tiles): every row through the integer products, within
// each output's activation error plus rounding; and every row bit for bit what that row gives
// alone (the native path is chunk-invariant).
TEST(WeightLinear, QuantisedMatchesF32OnTheDequantisedWeights) {
  std::mt19937 rng(11);
  for (DType t : {DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t k = dtype_block_elems(t) == 256 ? 512 : 96;
    for (int64_t m : {1, 3, 19, 99}) {
      const std::vector<uint8_t> blocks = random_blocks(t, m * k / dtype_block_elems(t), rng);
      WeightView v{t, blocks.data(), m, k, dtype_bytes(t, k)};
      std::vector<float> wf(static_cast<size_t>(m * k));
      convert_to_f32(t, blocks.data(), m * k, wf.data());
      std::vector<float> bias(static_cast<size_t>(m));
      for (float& b : bias) b = std::uniform_real_distribution<float>(-1, 1)(rng);
      for (int n : {1, 2, 4, 7, 17, 33}) {
        const std::vector<float> x = random_activations(n * k, rng);
        std::vector<float> want(size_t(n * m)), got(size_t(n * m));
        linear(x.data(), wf.data(), bias.data(), want.data(), n, int(k), int(m));
        for (QuantIsa isa : isas()) {
          LinearScratch s;
          linear(x.data(), v, bias.data(), got.data(), n, isa, s);
          for (int i = 0; i < n; ++i) {
            std::vector<float> alone(static_cast<size_t>(m));
            linear(x.data() + i * k, v, bias.data(), alone.data(), 1, isa, s);
            ASSERT_EQ(std::vector<float>(got.begin() + i * m, got.begin() + (i + 1) * m), alone)
                << dtype_name(t) << " m=" << m << " n=" << n << " row " << i << " " << quant_isa_name(isa);
            std::vector<Q8Block> q(static_cast<size_t>(k / 32));
            quantize_row_q8(x.data() + i * k, k, q.data());
            const std::vector<float> ah = dequantised(q);
            for (int64_t j = 0; j < m; ++j) {
              const std::vector<float> wj(wf.begin() + j * k, wf.begin() + (j + 1) * k);
              const std::vector<float> xi(x.begin() + i * k, x.begin() + (i + 1) * k);
              double err = 0;
              for (int64_t c = 0; c < k; ++c) err += std::fabs(double(wj[size_t(c)])) * std::fabs(double(xi[size_t(c)]) - ah[size_t(c)]);
              const double tol = err + rounding_tol(wj, ah);
              ASSERT_NEAR(got[size_t(i * m + j)], want[size_t(i * m + j)], tol)
                  << dtype_name(t) << " m=" << m << " n=" << n << " row " << i << " col " << j << " "
                  << quant_isa_name(isa);
            }
          }
        }
      }
    }
  }
}

// The product per row count: the integer products below min_gemm_rows, dequantised sgemm from
// it on, never sgemm with kNoGemm; the shipped crossover lets decode steps and short chunks keep
// the integer products.
TEST(WeightLinear, ChoosesTheProductByTheRowCount) {
  EXPECT_EQ(choose_product(1, 32), LinearProduct::kQuantDot);
  EXPECT_EQ(choose_product(31, 32), LinearProduct::kQuantDot);
  EXPECT_EQ(choose_product(32, 32), LinearProduct::kDequantGemm);
  EXPECT_EQ(choose_product(512, 32), LinearProduct::kDequantGemm);
  EXPECT_EQ(choose_product(2, 2), LinearProduct::kDequantGemm);
  EXPECT_EQ(choose_product(1, 1), LinearProduct::kDequantGemm);
  for (int64_t n : {1, 2, 33, 4096}) EXPECT_EQ(choose_product(n, kNoGemm), LinearProduct::kQuantDot) << n;
  EXPECT_EQ(choose_product(1, kDefaultGemmRows), LinearProduct::kQuantDot) << "a decode step";
  EXPECT_EQ(choose_product(8, kDefaultGemmRows), LinearProduct::kQuantDot) << "a short chunk";
  EXPECT_EQ(choose_product(512, kDefaultGemmRows), LinearProduct::kDequantGemm) << "a long prompt chunk";
}

// kDequantGemm is sgemm on the dequantised matrix: for several rows the same sgemm call on the
// same f32 values as ops.h's linear, so the same result bit for bit, bias included; a matrix past
// kDequantTileBytes (k = 4096, 640 rows: 10 MiB in f32, two tiles) gives what one sgemm on the
// whole dequantised matrix gives up to the order of each element's sum.
TEST(WeightLinear, DequantGemmIsSgemmOnTheDequantisedWeights) {
  std::mt19937 rng(17);
  struct Shape {
    DType t;
    int64_t m, k;
  };
  for (const Shape sh : {Shape{DType::kQ4_1, 99, 96}, Shape{DType::kQ8_0, 19, 96}, Shape{DType::kQ6_K, 3, 512},
                         Shape{DType::kQ4_K, 640, 4096}}) {
    const int64_t m = sh.m, k = sh.k;
    ASSERT_EQ(m * k * 4 > kDequantTileBytes, m == 640);
    const std::vector<uint8_t> blocks = random_blocks(sh.t, m * k / dtype_block_elems(sh.t), rng);
    const WeightView v{sh.t, blocks.data(), m, k, dtype_bytes(sh.t, k)};
    std::vector<float> wf(size_t(m * k)), bias(static_cast<size_t>(m));
    convert_to_f32(sh.t, blocks.data(), m * k, wf.data());
    for (float& b : bias) b = std::uniform_real_distribution<float>(-1, 1)(rng);
    for (int n : {2, 7, 33}) {
      const std::vector<float> x = random_activations(n * k, rng);
      std::vector<float> want(size_t(n * m)), got(size_t(n * m), -1.0f);
      linear(x.data(), wf.data(), bias.data(), want.data(), n, int(k), int(m));
      LinearScratch s;
      linear(x.data(), v, bias.data(), got.data(), n, QuantIsa::kScalar, s, LinearProduct::kDequantGemm);
      if (m * k * 4 <= kDequantTileBytes) {
        ASSERT_EQ(got, want) << dtype_name(sh.t) << " m=" << m << " k=" << k << " n=" << n;
      } else {
        // Two sgemm calls over column ranges of y: OpenBLAS may then sum an element in another
        // order (measured: equal at n = 2 and 7, not at 33), so each element within the bound
        // of any order of its k products, 2 (k - 1) u Σ|w x| (u = 2^-24).
        for (int i = 0; i < n; ++i)
          for (int64_t j = 0; j < m; ++j) {
            double mag = 0;
            for (int64_t c = 0; c < k; ++c) mag += std::fabs(double(wf[size_t(j * k + c)]) * x[size_t(i * k + c)]);
            ASSERT_NEAR(got[size_t(i * m + j)], want[size_t(i * m + j)], 2.0 * double(k - 1) * 0x1p-24 * mag)
                << dtype_name(sh.t) << " n=" << n << " row " << i << " col " << j;
          }
      }
      EXPECT_LE(s.wf.size() * sizeof(float), size_t(kDequantTileBytes)) << "the scratch holds one tile";
      // A product group takes the same path per product.
      std::vector<float> g1(size_t(n * m)), g2(size_t(n * m));
      const LinearOut outs[] = {{v, bias.data(), g1.data()}, {v, nullptr, g2.data()}};
      linear_group(x.data(), outs, n, QuantIsa::kScalar, s, LinearProduct::kDequantGemm);
      EXPECT_EQ(g1, got);
      for (size_t i = 0; i < g2.size(); ++i) ASSERT_EQ(g2[i] + bias[i % size_t(m)], got[i]) << i;
    }
  }
}

TEST(WeightLinear, EmbeddingRowsAreTheDequantisedRows) {
  std::mt19937 rng(5);
  const DType t = DType::kQ8_0;
  const std::vector<uint8_t> blocks = random_blocks(t, 7 * 3, rng);
  const WeightView v{t, blocks.data(), 7, 96, dtype_bytes(t, 96)};
  std::vector<float> all(7 * 96), row(96);
  convert_to_f32(t, blocks.data(), 7 * 96, all.data());
  for (int r = 0; r < 7; ++r) {
    weight_row_f32(v, r, row.data());
    EXPECT_EQ(std::memcmp(row.data(), all.data() + r * 96, 96 * 4), 0) << "row " << r;
  }
}

// The native path's decode attention against the reference's attend_causal (one query row) on
// random inputs at awkward lengths: both f32, they differ by summation order only.
TEST(DecodeAttention, MatchesAttendCausal) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int n_heads = 6, group = 3, n_kv = 2, hd = 64, capacity = 1300;
  for (int n_ctx : {1, 3, 19, 99, 1177}) {
    std::vector<float> q(size_t(n_heads * hd)), k(size_t(n_kv * capacity * hd)), v(k.size());
    for (float& x : q) x = 2.0f * g(rng);
    for (float& x : k) x = g(rng);
    for (float& x : v) x = g(rng);
    std::vector<float> want(q.size()), got(q.size());
    const float scale = 0.125f;
    for (int h = 0; h < n_kv; ++h)
      attend_causal(q.data() + h * group * hd, 1, group, hd, n_heads * hd, k.data() + int64_t(h) * capacity * hd,
                    v.data() + int64_t(h) * capacity * hd, n_ctx - 1, scale, want.data() + h * group * hd, n_heads * hd);
    attend_rows(q.data(), 1, n_heads, group, hd, k.data(), v.data(), int64_t(capacity) * hd, n_ctx - 1, scale, got.data());
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::fabs(double(got[i]) - want[i]) > worst) worst = std::fabs(double(got[i]) - want[i]), at = i;
    // Outputs are convex combinations of V rows (|v| < ~5): f32 sums of n_ctx terms agree to
    // well under 1e-5 absolute.
    EXPECT_LT(worst, 1e-5) << "n_ctx " << n_ctx << " worst at " << at << ": " << got[at] << " vs " << want[at];
  }
}

}  // namespace
}  // namespace lychee::cpu
