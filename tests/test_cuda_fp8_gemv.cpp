// FP8 (e4m3) weight GEMV (cuda/kernels/fp8_gemv.h) against a double-precision host reference over
// the same codes and scales (core/fp8.h's quantiser) and bf16 x: awkward and Llama-3-8B shapes for
// n = 1, 3, 8; every code exactly (one-hot x); repeats bit for bit; rows independent of m (so of
// the tile width the launcher picks); the f32 output against the bf16 one; CUDA graph replay. The
// argument checks need no GPU and run everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/fp8_gemv.h"

namespace lychee {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

// A product's inputs on the host.
struct Problem {
  int n = 0, k = 0, m = 0;
  std::vector<uint16_t> x;     // [n][k] bf16 bits
  std::vector<uint8_t> codes;  // [m][k] e4m3
  std::vector<float> scales;   // [m]
};

// Random f32 weights through the host quantiser: row magnitudes 2^-6 .. 2^6 (varied scales), exact
// zeros (t % 97 == 5) and values 10^-4 of the row's size (t % 89 == 7: mostly subnormal codes);
// x ~ N(0, 1) rounded to bf16.
Problem make_problem(int n, int k, int m, uint32_t seed) {
  Problem p{n, k, m, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(size_t(m) * k);
  for (int j = 0; j < m; ++j) {
    const float mag = std::ldexp(1.0f, j % 13 - 6);
    for (int t = 0; t < k; ++t) {
      const float v = mag * normal(rng);
      w[size_t(j) * k + t] = t % 97 == 5 ? 0.0f : t % 89 == 7 ? 1e-4f * v : v;
    }
  }
  p.codes.resize(w.size());
  p.scales.resize(size_t(m));
  quantize_rows_e4m3(w.data(), m, k, p.codes.data(), p.scales.data());
  p.x.resize(size_t(n) * k);
  for (auto& e : p.x) e = f32_to_bf16(normal(rng));
  return p;
}

// [n][m]: the exact product (double sums of exact f32 products) and Σ|terms|, which bounds the
// f32 accumulation error.
struct Reference {
  std::vector<double> y, abs_sum;
};

Reference reference(const Problem& p) {
  float value[256];
  for (int c = 0; c < 256; ++c) value[c] = e4m3_to_f32(uint8_t(c));
  Reference r{std::vector<double>(size_t(p.n) * p.m), std::vector<double>(size_t(p.n) * p.m)};
  for (int i = 0; i < p.n; ++i)
    for (int j = 0; j < p.m; ++j) {
      const uint16_t* x = &p.x[size_t(i) * p.k];
      const uint8_t* w = &p.codes[size_t(j) * p.k];
      double s = 0.0, a = 0.0;
      for (int t = 0; t < p.k; ++t) {
        const double v = double(value[w[t]]) * double(bf16_to_f32(x[t]));
        s += v;
        a += std::fabs(v);
      }
      r.y[size_t(i) * p.m + j] = double(p.scales[size_t(j)]) * s;
      r.abs_sum[size_t(i) * p.m + j] = std::fabs(double(p.scales[size_t(j)])) * a;
    }
  return r;
}

struct DeviceProblem {
  DeviceBuffer<bf16> x, y;
  DeviceBuffer<uint8_t> w;
  DeviceBuffer<float> scales, y_f32;
};

DeviceProblem upload(const Problem& p) {
  DeviceProblem d;
  d.x = test::to_device_bf16_bits(p.x);
  d.w = test::to_device(p.codes);
  d.scales = test::to_device(p.scales);
  d.y = DeviceBuffer<bf16>(size_t(p.n) * p.m);
  d.y_f32 = DeviceBuffer<float>(size_t(p.n) * p.m);
  return d;
}

// y as floats: the bf16 output widened (f32_out false) or the f32 output. m may be less than the
// uploaded rows (a prefix of w).
std::vector<float> run(DeviceProblem& d, int n, int k, int m, bool f32_out, cudaStream_t stream = nullptr,
                       cuda::Fp8GemvVariant variant = {}) {
  if (f32_out) {
    LY_CUDA_CHECK(cudaMemset(d.y_f32.data(), 0xFF, d.y_f32.bytes()));  // NaN: unwritten outputs show
    cuda::fp8_gemv_f32_out(d.x.data(), d.w.data(), d.scales.data(), d.y_f32.data(), n, k, m, stream, variant);
    LY_CUDA_CHECK(cudaStreamSynchronize(stream));
    return test::to_host(d.y_f32, size_t(n) * m);
  }
  LY_CUDA_CHECK(cudaMemset(d.y.data(), 0xFF, d.y.bytes()));
  cuda::fp8_gemv(d.x.data(), d.w.data(), d.scales.data(), d.y.data(), n, k, m, stream, variant);
  LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> y = test::to_host_bf16(d.y);
  y.resize(size_t(n) * m);
  return y;
}

// Tolerance per element. The products are exact (e4m3 and bf16 are exact in bf16, their product in
// f32); each f32 addition after them errs by at most 2^-23 of the running sum (round to nearest,
// or truncation inside the tensor core), and a product passes through at most k/16 + 16 of them
// (the chain of mma steps over k, the mma's internal adds, the 8 warps' partial sums, the scale),
// each bounded by Σ|terms|. The bf16 output keeps 8 significant bits: rounding to nearest errs by
// at most 2^-8 of the f32 value, that is 2^-8 |y| plus 2^-8 of the sum's error (the sum's bound is
// doubled for it). The f32 output only adds the scale's rounding (2^-24, taken as 2^-22).
void expect_close(const std::vector<float>& got, const Reference& ref, const Problem& p, bool f32_out) {
  ASSERT_EQ(got.size(), ref.y.size());
  const double acc = 2.0 * (p.k / 16 + 16) * std::ldexp(1.0, -23);
  const double rel = f32_out ? std::ldexp(1.0, -22) : std::ldexp(1.0, -8);
  double worst = -1.0;
  size_t worst_i = 0, n_bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const double err = std::fabs(double(got[e]) - ref.y[e]);
    const double ratio = err / (rel * std::fabs(ref.y[e]) + acc * ref.abs_sum[e] + 1e-30);
    if (!(ratio <= 1.0)) ++n_bad;  // NaN (an unwritten output) counts
    if (std::isnan(ratio) ? !std::isnan(worst) : ratio > worst) worst = ratio, worst_i = e;  // the first NaN sticks
  }
  EXPECT_EQ(n_bad, 0u) << n_bad << " of " << got.size() << " outputs off; worst y[" << worst_i / p.m << "]["
                       << worst_i % p.m << "] = " << got[worst_i] << ", want " << ref.y[worst_i]
                       << " (error / tolerance " << worst << ", Σ|terms| " << ref.abs_sum[worst_i] << ")";
}

// ------------------------------------------------------------------------------ shapes

using Shape = std::tuple<std::pair<int, int> /*k, m*/, int /*n*/>;
class Fp8Gemv : public ::testing::TestWithParam<Shape> {};

TEST_P(Fp8Gemv, MatchesTheReference) {
  LY_REQUIRE_GPU();
  const auto [km, n] = GetParam();
  const auto [k, m] = km;
  const Problem p = make_problem(n, k, m, uint32_t(7 * k + 13 * m + n));
  const Reference ref = reference(p);
  DeviceProblem d = upload(p);
  const std::vector<float> y = run(d, n, k, m, false);
  expect_close(y, ref, p, false);
  expect_close(run(d, n, k, m, true), ref, p, true);
  const std::vector<float> again = run(d, n, k, m, false);
  EXPECT_EQ(std::memcmp(y.data(), again.data(), y.size() * sizeof(float)), 0) << "results differ between runs";
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const auto [km, n] = info.param;
  const auto [k, m] = km;
  return "k" + std::to_string(k) + "_m" + std::to_string(m) + "_n" + std::to_string(n);
}

// (16, 1): one code row piece; (64, 7): a partial m16 tile; (1040, 19): k past the last 64-chunk's
// first lane; (576, 1536): a smallish model; (4096, 4096): Llama-3-8B's o_proj; (14336, 64): its
// down_proj's k.
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Gemv,
                         ::testing::Combine(::testing::Values(std::pair(16, 1), std::pair(64, 7), std::pair(1040, 19),
                                                              std::pair(576, 1536), std::pair(4096, 4096),
                                                              std::pair(14336, 64)),
                                            ::testing::Values(1, 3, 8)),
                         shape_name);

// ------------------------------------------------------------------------------ exactness

// One-hot rows of x pick single weights, so every output is scale · e4m3(code) · x exactly (4
// significant bits, exact in bf16): the fragment layout and the conversion of every code (signs,
// subnormals, 448) checked bit for bit. Row j holds codes (t + 37 j) mod 256 (NaN codes -> 0), so
// each x row sees all 254 finite codes across the 259 rows; k = 2048 spreads the picks over all 8
// warps' slabs, lanes and bytes.
TEST(Fp8GemvExact, EveryCodeThroughOneHotRows) {
  LY_REQUIRE_GPU();
  Problem p{8, 2048, 259, {}, {}, {}};
  p.codes.resize(size_t(p.m) * p.k);
  p.scales.resize(size_t(p.m));
  for (int j = 0; j < p.m; ++j) {
    p.scales[size_t(j)] = std::ldexp(1.0f, j % 5 - 2);
    for (int t = 0; t < p.k; ++t) {
      const int c = (t + 37 * j) % 256;
      p.codes[size_t(j) * p.k + t] = uint8_t(c == 0x7F || c == 0xFF ? 0 : c);
    }
  }
  const int pos[8] = {0, 1, 5, 18, 63, 300, 1029, 2047};
  p.x.assign(size_t(p.n) * p.k, 0);
  for (int i = 0; i < p.n; ++i) p.x[size_t(i) * p.k + pos[i]] = f32_to_bf16(i % 2 == 0 ? 1.0f : -2.0f);
  DeviceProblem d = upload(p);
  for (const bool f32_out : {false, true}) {
    const std::vector<float> y = run(d, p.n, p.k, p.m, f32_out);
    int n_bad = 0;
    for (int i = 0; i < p.n; ++i)
      for (int j = 0; j < p.m; ++j) {
        const uint8_t code = p.codes[size_t(j) * p.k + pos[i]];
        const float want = p.scales[size_t(j)] * e4m3_to_f32(code) * (i % 2 == 0 ? 1.0f : -2.0f);
        const float got = y[size_t(i) * p.m + j];
        if (got != want && n_bad++ < 5)
          ADD_FAILURE() << (f32_out ? "f32" : "bf16") << " y[" << i << "][" << j << "] = " << got << ", want "
                        << want << " (code 0x" << std::hex << int(code) << std::dec << ")";
      }
    EXPECT_EQ(n_bad, 0);
  }
}

// The f32 output is the bf16 output before its one rounding (same sums, same order).
TEST(Fp8GemvExact, F32OutRoundsToTheBf16Out) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(5, 4096, 300, 11);
  DeviceProblem d = upload(p);
  const std::vector<float> y16 = run(d, p.n, p.k, p.m, false), y32 = run(d, p.n, p.k, p.m, true);
  for (size_t e = 0; e < y16.size(); ++e)
    ASSERT_EQ(bf16_to_f32(f32_to_bf16(y32[e])), y16[e]) << "y[" << e / p.m << "][" << e % p.m << "]";
}

// ------------------------------------------------------------------------------ determinism

// Llama-3-8B's fused QKV at n = 8: two calls give the same bits, also with another product between.
TEST(Fp8GemvDeterminism, RepeatsBitForBit) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(8, 4096, 6144, 3);
  DeviceProblem d = upload(p);
  const std::vector<float> a = run(d, p.n, p.k, p.m, false);
  run(d, 3, 1024, 100, true);  // other shape, other kernel variant
  const std::vector<float> b = run(d, p.n, p.k, p.m, false);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "results differ between runs";
}

// A row's result depends only on its weights, x and k: the first 1536 rows of one matrix give the
// same bits with m = 28672, 4096 and 1536, which on 132 SMs run 4, 2 and 1 m16 tiles per block.
// Random codes (NaN codes excluded) and scales straight, no quantiser needed.
TEST(Fp8GemvDeterminism, RowsDoNotDependOnM) {
  LY_REQUIRE_GPU();
  Problem p{8, 1024, 28672, {}, {}, {}};
  std::mt19937 rng(5);
  p.codes.resize(size_t(p.m) * p.k);
  for (auto& c : p.codes) {
    c = uint8_t(rng());
    if ((c & 0x7F) == 0x7F) c = 0;
  }
  p.scales.resize(size_t(p.m));
  for (auto& s : p.scales) s = std::ldexp(1.0f, int(rng() % 9) - 12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x.resize(size_t(p.n) * p.k);
  for (auto& e : p.x) e = f32_to_bf16(normal(rng));
  DeviceProblem d = upload(p);
  std::vector<std::vector<float>> prefix;
  for (const int m : {28672, 4096, 1536}) {
    const std::vector<float> y = run(d, p.n, p.k, m, true);
    prefix.emplace_back();
    for (int i = 0; i < p.n; ++i) {
      const auto row = y.begin() + long(i) * m;
      prefix.back().insert(prefix.back().end(), row, row + 1536);
    }
  }
  for (size_t v = 1; v < prefix.size(); ++v)
    EXPECT_EQ(std::memcmp(prefix[0].data(), prefix[v].data(), prefix[0].size() * sizeof(float)), 0)
        << "m = 28672 and variant " << v << " differ";
}

// Captured once, replayed three times into a poisoned output: the same bits as a direct call.
// Every variant (1, 2, 4 m16 tiles per block; weights one step ahead in registers or through a
// shared-memory ring of 2, 3, 4 steps) gives the automatic choice's bits, and those are within the
// tolerance of the f64 reference: k = 1040 ends inside a chunk and inside a slab, m = 1000 inside
// a 64-row block, and n = 3 and 8 leave mma columns unused or not.
TEST(Fp8GemvDeterminism, EveryVariantGivesTheSameBits) {
  LY_REQUIRE_GPU();
  for (const int n : {3, 8}) {
    const Problem p = make_problem(n, 1040, 1000, 11 + uint32_t(n));
    DeviceProblem d = upload(p);
    const std::vector<float> automatic = run(d, p.n, p.k, p.m, true);
    expect_close(automatic, reference(p), p, true);
    for (const int tiles : {1, 2, 4})
      for (const int stages : {0, 2, 3, 4}) {
        const std::vector<float> y = run(d, p.n, p.k, p.m, true, nullptr, {tiles, stages});
        EXPECT_EQ(std::memcmp(automatic.data(), y.data(), y.size() * sizeof(float)), 0)
            << "n = " << n << ", tiles " << tiles << ", stages " << stages;
      }
  }
}

TEST(Fp8GemvGraph, ReplaysFromACudaGraph) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(8, 4096, 4096, 9);
  DeviceProblem d = upload(p);
  const std::vector<float> direct = run(d, p.n, p.k, p.m, false);
  cudaStream_t stream;
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::fp8_gemv(d.x.data(), d.w.data(), d.scales.data(), d.y.data(), p.n, p.k, p.m, stream);
  LY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LY_CUDA_CHECK(cudaMemset(d.y.data(), 0xFF, d.y.bytes()));
  for (int r = 0; r < 3; ++r) LY_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> replayed = test::to_host_bf16(d.y);
  EXPECT_EQ(std::memcmp(direct.data(), replayed.data(), direct.size() * sizeof(float)), 0);
  LY_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LY_CUDA_CHECK(cudaGraphDestroy(graph));
  LY_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------------------ argument checks

// The checks run before anything touches the device, so one aligned host buffer stands for every
// operand and no GPU is needed.
using test::expect_error;

TEST(Fp8GemvArgs, RejectsBadShapesAndPointers) {
  alignas(16) static uint8_t buf[64];
  const auto* x = reinterpret_cast<const bf16*>(buf);
  const uint8_t* w = buf;
  const auto* s = reinterpret_cast<const float*>(buf);
  auto* y = reinterpret_cast<bf16*>(buf);
  auto* y32 = reinterpret_cast<float*>(buf);
  using EC = ErrorCode;
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 0, 64, 4, nullptr); }, EC::kInvalidArgument, "n = 0");
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 9, 64, 4, nullptr); }, EC::kUnsupported, "n = 9");
  expect_error([&] { cuda::fp8_gemv_f32_out(x, w, s, y32, 9, 64, 4, nullptr); }, EC::kUnsupported, "n = 9");
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 1, 24, 4, nullptr); }, EC::kUnsupported, "k = 24");
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 1, 0, 4, nullptr); }, EC::kInvalidArgument, "k = 0");
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 1, 64, 0, nullptr); }, EC::kInvalidArgument, "m = 0");
  expect_error([&] { cuda::fp8_gemv(x, w + 8, s, y, 1, 64, 4, nullptr); }, EC::kInvalidArgument, "16-byte aligned");
  expect_error([&] { cuda::fp8_gemv(x + 4, w, s, y, 1, 64, 4, nullptr); }, EC::kInvalidArgument, "16-byte aligned");
  expect_error([&] { cuda::fp8_gemv(x, w, nullptr, y, 1, 64, 4, nullptr); }, EC::kInvalidArgument, "null pointer");
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 1, 64, 4, nullptr, {3, -1}); }, EC::kInvalidArgument, "tiles = 3");
  expect_error([&] { cuda::fp8_gemv(x, w, s, y, 1, 64, 4, nullptr, {0, 1}); }, EC::kInvalidArgument, "stages = 1");
  EXPECT_NO_THROW(cuda::check_fp8_gemv_args(x, w, s, y, 8, 64, 4));
  EXPECT_NO_THROW(cuda::check_fp8_gemv_args(x, w, s, y, 1, 16, 1));
}

}  // namespace
}  // namespace lychee

#else
TEST(Fp8Gemv, NotBuilt) { LY_CUDA_NOT_BUILT("the FP8 GEMV kernel tests"); }
#endif  // LYCHEE_HAS_CUDA
