// bf16 weight GEMV with its fused RMSNorm prologue and residual / SwiGLU epilogues
// (cuda/kernels/bf16_gemv.h) against a double-precision host reference: awkward and model shapes
// for n = 1, 3, 8, every output form with and without the norm; both weight stagings give the same
// bits, two calls give the same bits, rows do not depend on m, a CUDA graph replays them; the
// fused norm agrees with add_rmsnorm (kernels.h) to within their roundings. The argument checks
// need no GPU and run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
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
#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/bf16_gemv.h"
#include "cuda/kernels/kernels.h"

namespace lychee {
namespace {

using cuda::bf16;
using cuda::Bf16GemvArgs;
using cuda::DeviceBuffer;
using cuda::GemvOut;

constexpr float kEps = 1e-5f;

// A product's inputs on the host: x both as bf16 rows and as f32 residual rows (the norm's input).
struct Problem {
  int n = 0, k = 0, m = 0;
  std::vector<uint16_t> x16;  // [n][k] bf16 bits, ~N(0, 1)
  std::vector<float> x32;     // [n][k] f32, ~N(0, 4^i) (row scales apart, so r_i differs per row)
  std::vector<float> norm;    // [k] RMSNorm weights around 1
  std::vector<uint16_t> w;    // [m][k] bf16 bits, row magnitudes 2^-6 .. 2^6, exact zeros
  std::vector<float> bias;    // [m]
  std::vector<float> y0;      // [n][m] the residual the kAddF32 product adds to
};

Problem make_problem(int n, int k, int m, uint32_t seed) {
  Problem p;
  p.n = n, p.k = k, p.m = m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x16.resize(size_t(n) * k);
  for (auto& e : p.x16) e = f32_to_bf16(normal(rng));
  p.x32.resize(size_t(n) * k);
  for (int i = 0; i < n; ++i)
    for (int t = 0; t < k; ++t) p.x32[size_t(i) * k + t] = std::ldexp(normal(rng), 2 * i - 4);
  p.norm.resize(size_t(k));
  for (auto& e : p.norm) e = 1.0f + 0.25f * normal(rng);
  p.w.resize(size_t(m) * k);
  for (int j = 0; j < m; ++j) {
    const float mag = std::ldexp(1.0f, j % 13 - 6);
    for (int t = 0; t < k; ++t) p.w[size_t(j) * k + t] = t % 97 == 5 ? 0 : f32_to_bf16(mag * normal(rng));
  }
  p.bias.resize(size_t(m));
  for (auto& e : p.bias) e = normal(rng);
  p.y0.resize(size_t(n) * m);
  for (auto& e : p.y0) e = 8.0f * normal(rng);
  return p;
}

// x' per row in double: x (bf16) or norm · x · r with the exact r (the kernel rounds x' to bf16;
// its tolerance covers that).
std::vector<double> x_prime(const Problem& p, bool norm) {
  std::vector<double> xp(size_t(p.n) * p.k);
  for (int i = 0; i < p.n; ++i) {
    double ss = 0.0;
    for (int t = 0; t < p.k; ++t) ss += double(p.x32[size_t(i) * p.k + t]) * p.x32[size_t(i) * p.k + t];
    const double r = 1.0 / std::sqrt(ss / p.k + double(kEps));
    for (int t = 0; t < p.k; ++t) {
      const size_t e = size_t(i) * p.k + t;
      xp[e] = norm ? double(p.norm[size_t(t)]) * double(p.x32[e]) * r : double(bf16_to_f32(p.x16[e]));
    }
  }
  return xp;
}

// s[i][j] = Σ_t w[j][t] x'[i][t] and Σ|terms| (bounds the f32 accumulation error), [n][m].
struct Sums {
  std::vector<double> s, abs;
};

Sums sums(const Problem& p, bool norm) {
  const std::vector<double> xp = x_prime(p, norm);
  Sums r{std::vector<double>(size_t(p.n) * p.m), std::vector<double>(size_t(p.n) * p.m)};
  std::vector<double> wr(size_t(p.k));
  for (int j = 0; j < p.m; ++j) {
    for (int t = 0; t < p.k; ++t) wr[size_t(t)] = bf16_to_f32(p.w[size_t(j) * p.k + t]);
    for (int i = 0; i < p.n; ++i) {
      double s = 0.0, a = 0.0;
      for (int t = 0; t < p.k; ++t) {
        const double v = wr[size_t(t)] * xp[size_t(i) * p.k + t];
        s += v;
        a += std::fabs(v);
      }
      r.s[size_t(i) * p.m + j] = s;
      r.abs[size_t(i) * p.m + j] = a;
    }
  }
  return r;
}

// Error bound of one sum, as the FP8 GEMV's test argues it: each f32 addition errs by at most
// 2^-23 of Σ|terms| and a sum passes through at most k/16 + 16 of them (doubled). With the norm,
// each input norm·x is rounded to bf16 (2^-9 of each term) and r (rsqrtf, within 2 ulps) scales
// the sum: 2^-8 Σ|terms| covers both.
double sum_tolerance(const Problem& p, bool norm, double abs_sum) {
  const double acc = 2.0 * (p.k / 16 + 16) * std::ldexp(1.0, -23);
  return (acc + (norm ? std::ldexp(1.0, -8) : 0.0)) * abs_sum;
}

struct Device {
  DeviceBuffer<bf16> x16, w, y16;
  DeviceBuffer<float> x32, norm, bias, y32;
};

Device upload(const Problem& p) {
  Device d;
  d.x16 = test::to_device_bf16_bits(p.x16);
  d.x32 = test::to_device(p.x32);
  d.norm = test::to_device(p.norm);
  d.w = test::to_device_bf16_bits(p.w);
  d.bias = test::to_device(p.bias);
  d.y16 = DeviceBuffer<bf16>(size_t(p.n) * p.m);
  d.y32 = DeviceBuffer<float>(size_t(p.n) * p.m);
  return d;
}

Bf16GemvArgs args(Device& d, const Problem& p, GemvOut out, bool norm, int m, int stages = -1) {
  Bf16GemvArgs a;
  a.x = norm ? static_cast<const void*>(d.x32.data()) : static_cast<const void*>(d.x16.data());
  a.norm = norm ? d.norm.data() : nullptr;
  a.eps = norm ? kEps : 0.0f;
  a.w = d.w.data();
  a.out = out;
  const bool f32 = out == GemvOut::kF32 || out == GemvOut::kAddF32;
  a.y = f32 ? static_cast<void*>(d.y32.data()) : static_cast<void*>(d.y16.data());
  a.bias = out == GemvOut::kAddF32 || out == GemvOut::kSwiGlu ? d.bias.data() : nullptr;
  a.n = p.n, a.k = p.k, a.m = m, a.stages = stages;
  return a;
}

// Runs one product into a poisoned output (NaN: unwritten outputs show; kAddF32 starts from y0)
// and returns y as floats ([n][m], or [n][m / 2] for SwiGLU).
std::vector<float> run(Device& d, const Problem& p, const Bf16GemvArgs& a, cudaStream_t stream = nullptr) {
  const size_t count = size_t(p.n) * (a.out == GemvOut::kSwiGlu ? a.m / 2 : a.m);
  if (a.out == GemvOut::kAddF32) {
    std::vector<float> y0(count);
    for (int i = 0; i < p.n; ++i)
      std::copy_n(p.y0.begin() + long(i) * p.m, a.m, y0.begin() + long(i) * a.m);
    LY_CUDA_CHECK(cudaMemcpy(d.y32.data(), y0.data(), count * 4, cudaMemcpyHostToDevice));
  } else {
    LY_CUDA_CHECK(cudaMemset(d.y32.data(), 0xFF, d.y32.bytes()));
    LY_CUDA_CHECK(cudaMemset(d.y16.data(), 0xFF, d.y16.bytes()));
  }
  cuda::bf16_gemv(a, stream);
  LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (a.out == GemvOut::kF32 || a.out == GemvOut::kAddF32) return test::to_host(d.y32, count);
  std::vector<float> y = test::to_host_bf16(d.y16);
  y.resize(count);
  return y;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// got (the kernel's y for `out`) against the reference from the sums; every element within its bound.
void expect_close(const std::vector<float>& got, const Problem& p, const Sums& r, GemvOut out, bool norm,
                  const std::string& what) {
  const int cols = out == GemvOut::kSwiGlu ? p.m / 2 : p.m;
  ASSERT_EQ(got.size(), size_t(p.n) * cols) << what;
  size_t n_bad = 0;
  std::string first;
  for (int i = 0; i < p.n; ++i)
    for (int j = 0; j < cols; ++j) {
      const size_t e = size_t(i) * p.m + j;
      double want = 0.0, tol = 0.0;
      const double ts = sum_tolerance(p, norm, r.abs[e]);
      switch (out) {
        case GemvOut::kBf16: want = r.s[e], tol = std::ldexp(1.0, -8) * (std::fabs(want) + ts) + ts; break;
        case GemvOut::kF32: want = r.s[e], tol = ts + std::ldexp(1.0, -22) * std::fabs(want); break;
        case GemvOut::kAddF32:
          want = double(p.y0[e]) + r.s[e] + p.bias[size_t(j)];
          tol = ts + std::ldexp(1.0, -22) * (std::fabs(p.y0[e]) + std::fabs(r.s[e]) + std::fabs(p.bias[size_t(j)]));
          break;
        case GemvOut::kSwiGlu: {
          const size_t eu = size_t(i) * p.m + size_t(cols + j);
          const double gate = r.s[e] + p.bias[size_t(j)], up = r.s[eu] + p.bias[size_t(cols + j)];
          const double tg = ts, tu = sum_tolerance(p, norm, r.abs[eu]);
          want = silu(gate) * up;
          // |silu'| <= 1.1; __expf and the f32 arithmetic ~2^-20; the bf16 output 2^-8.
          tol = 1.1 * (std::fabs(up) + tu) * tg + (std::fabs(silu(gate)) + 1.1 * tg) * tu +
                (std::ldexp(1.0, -8) + std::ldexp(1.0, -20)) * (std::fabs(want) + 1.1 * tg * std::fabs(up) + 1e-30);
          break;
        }
      }
      const double g = got[size_t(i) * cols + j];
      if (!(std::fabs(g - want) <= tol + 1e-30)) {  // NaN (an unwritten output) fails
        if (n_bad++ == 0)
          first = "y[" + std::to_string(i) + "][" + std::to_string(j) + "] = " + std::to_string(g) + ", want " +
                  std::to_string(want) + " +- " + std::to_string(tol);
      }
    }
  EXPECT_EQ(n_bad, 0u) << what << ": " << n_bad << " of " << got.size() << " outputs off; first " << first;
}

const char* out_name(GemvOut o) {
  return o == GemvOut::kBf16 ? "bf16" : o == GemvOut::kF32 ? "f32" : o == GemvOut::kAddF32 ? "add_f32" : "swiglu";
}

// ------------------------------------------------------------------------------ shapes

using Shape = std::tuple<std::pair<int, int> /*k, m*/, int /*n*/>;
class Bf16Gemv : public ::testing::TestWithParam<Shape> {};

// Every output form with and without the norm, both stagings (the same bits), twice (the same bits).
TEST_P(Bf16Gemv, MatchesTheReference) {
  LY_REQUIRE_GPU();
  const auto [km, n] = GetParam();
  const auto [k, m] = km;
  const Problem p = make_problem(n, k, m, uint32_t(7 * k + 13 * m + n));
  Device d = upload(p);
  for (const bool norm : {false, true}) {
    const Sums r = sums(p, norm);
    for (const GemvOut out : {GemvOut::kBf16, GemvOut::kF32, GemvOut::kAddF32, GemvOut::kSwiGlu}) {
      if (out == GemvOut::kSwiGlu && m % 2 != 0) continue;
      const std::string what = std::string(out_name(out)) + (norm ? " with norm" : "");
      const std::vector<float> y = run(d, p, args(d, p, out, norm, m, 0));
      expect_close(y, p, r, out, norm, what);
      const std::vector<float> ring = run(d, p, args(d, p, out, norm, m, 2));
      EXPECT_EQ(std::memcmp(y.data(), ring.data(), y.size() * sizeof(float)), 0) << what << ": the stagings differ";
      const std::vector<float> again = run(d, p, args(d, p, out, norm, m));
      EXPECT_EQ(std::memcmp(y.data(), again.data(), y.size() * sizeof(float)), 0) << what << ": runs differ";
    }
  }
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const auto [km, n] = info.param;
  const auto [k, m] = km;
  return "k" + std::to_string(k) + "_m" + std::to_string(m) + "_n" + std::to_string(n);
}

// (8, 2): one lane's piece of k; (40, 7): k inside the second chunk, a partial m16 tile, odd m (no
// SwiGLU); (1040, 38): k ending inside a chunk and a slab; (576, 960) and (1536, 576): the default
// model's QKV and down; (4096, 6144): Llama-3-8B's QKV (more than two blocks per SM: the ring's
// automatic choice); (14336, 64): its down_proj's k.
INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Gemv,
                         ::testing::Combine(::testing::Values(std::pair(8, 2), std::pair(40, 7), std::pair(1040, 38),
                                                              std::pair(576, 960), std::pair(1536, 576),
                                                              std::pair(4096, 6144), std::pair(14336, 64)),
                                            ::testing::Values(1, 3, 8)),
                         shape_name);

// ------------------------------------------------------------------------------ exactness

// The fused norm is add_rmsnorm's to within their roundings: with one-hot weight rows (row j picks
// input j once) the f32 product returns r_i · bf16(norm[j] · x[i][j]) and add_rmsnorm writes
// bf16(norm[j] · (x[i][j] · r_i)); each is within 2^-9 (and rsqrtf's 2 ulps) of the exact value,
// so they differ by at most 2^-8 of it. A missing factor, a wrong row's r or a swapped norm
// weight is off by far more.
TEST(Bf16GemvExact, NormIsAddRmsnormWithinItsRounding) {
  LY_REQUIRE_GPU();
  const int n = 3, k = 4096, m = k;
  Problem p = make_problem(n, k, 1, 21);
  p.m = m;
  p.w.assign(size_t(m) * k, 0);
  for (int j = 0; j < m; ++j) p.w[size_t(j) * k + j] = f32_to_bf16(1.0f);
  p.bias.assign(size_t(m), 0.0f);
  p.y0.assign(size_t(n) * m, 0.0f);
  Device d = upload(p);
  const std::vector<float> y = run(d, p, args(d, p, GemvOut::kF32, true, m));
  DeviceBuffer<float> x = test::to_device(p.x32);
  DeviceBuffer<bf16> h(size_t(n) * k);
  cuda::add_rmsnorm(x.data(), nullptr, nullptr, d.norm.data(), h.data(), n, k, kEps, nullptr);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> want = test::to_host_bf16(h);
  int n_bad = 0;
  for (size_t e = 0; e < want.size(); ++e)
    if (!(std::fabs(y[e] - want[e]) <= 1.01 * std::ldexp(std::fabs(want[e]), -8)) && n_bad++ < 5)
      ADD_FAILURE() << "x'[" << e / k << "][" << e % k << "]: " << y[e] << " vs add_rmsnorm " << want[e];
  EXPECT_EQ(n_bad, 0);
}

// ------------------------------------------------------------------------------ determinism

// A row's result depends only on its weights, x and k: the first 1024 rows give the same bits with
// m = 28672 (ring, several waves), 4096 and 1024 (registers, one wave).
TEST(Bf16GemvDeterminism, RowsDoNotDependOnM) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(8, 1024, 28672, 5);
  Device d = upload(p);
  std::vector<std::vector<float>> prefix;
  for (const int m : {28672, 4096, 1024}) {
    const std::vector<float> y = run(d, p, args(d, p, GemvOut::kF32, true, m));
    prefix.emplace_back();
    for (int i = 0; i < p.n; ++i) {
      const auto row = y.begin() + long(i) * m;
      prefix.back().insert(prefix.back().end(), row, row + 1024);
    }
  }
  for (size_t v = 1; v < prefix.size(); ++v)
    EXPECT_EQ(std::memcmp(prefix[0].data(), prefix[v].data(), prefix[0].size() * sizeof(float)), 0)
        << "m = 28672 and case " << v << " differ";
}

// Captured once and replayed into a poisoned output: the direct call's bits (the residual add
// replayed from the same starting residual each time).
TEST(Bf16GemvDeterminism, GraphReplayGivesTheSameBits) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(2, 1040, 38, 9);
  Device d = upload(p);
  cudaStream_t s = nullptr;
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (const GemvOut out : {GemvOut::kBf16, GemvOut::kAddF32, GemvOut::kSwiGlu}) {
    const Bf16GemvArgs a = args(d, p, out, true, p.m);
    const std::vector<float> direct = run(d, p, a, s);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    LY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuda::bf16_gemv(a, s);
    LY_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    LY_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int rep = 0; rep < 3; ++rep) {
      Problem q = p;  // run()'s reset of y, then the replay instead of a direct call
      const size_t count = size_t(p.n) * (out == GemvOut::kSwiGlu ? p.m / 2 : p.m);
      if (out == GemvOut::kAddF32)
        LY_CUDA_CHECK(cudaMemcpy(d.y32.data(), q.y0.data(), count * 4, cudaMemcpyHostToDevice));
      else
        LY_CUDA_CHECK(cudaMemset(d.y16.data(), 0xFF, d.y16.bytes()));
      LY_CUDA_CHECK(cudaGraphLaunch(exec, s));
      LY_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<float> y;
      if (out == GemvOut::kAddF32) {
        y = test::to_host(d.y32, count);
      } else {
        y = test::to_host_bf16(d.y16);
        y.resize(count);
      }
      EXPECT_EQ(std::memcmp(y.data(), direct.data(), y.size() * sizeof(float)), 0)
          << out_name(out) << " replay " << rep << " differs";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  }
  LY_CUDA_CHECK(cudaStreamDestroy(s));
}

// ------------------------------------------------------------------------------ argument checks

// The checks run on the host before any launch (bf16_gemv throws before launching); no GPU needed.
void expect_error(const Bf16GemvArgs& a, ErrorCode code, const std::string& needle) {
  try {
    cuda::bf16_gemv(a, nullptr);
    ADD_FAILURE() << "accepted; expected an error mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Bf16GemvArgs, RejectsWhatTheKernelCannotTake) {
  alignas(16) static uint16_t buf[64] = {};
  const auto* w = reinterpret_cast<const bf16*>(buf);
  Bf16GemvArgs ok;
  ok.x = buf, ok.w = w, ok.y = buf + 32, ok.n = 1, ok.k = 16, ok.m = 2;
  EXPECT_NO_THROW(cuda::check_bf16_gemv_args(ok));
  using EC = ErrorCode;
  auto a = ok;
  a.n = 0;
  expect_error(a, EC::kInvalidArgument, "n = 0");
  a = ok, a.n = 9;
  expect_error(a, EC::kUnsupported, "n = 9");
  a = ok, a.k = 12;
  expect_error(a, EC::kUnsupported, "k = 12");
  a = ok, a.m = 0;
  expect_error(a, EC::kInvalidArgument, "m = 0");
  a = ok, a.y = nullptr;
  expect_error(a, EC::kInvalidArgument, "null pointer");
  a = ok, a.x = buf + 1;  // 2-byte aligned
  expect_error(a, EC::kInvalidArgument, "16-byte aligned");
  a = ok, a.out = GemvOut::kSwiGlu, a.m = 3;
  expect_error(a, EC::kInvalidArgument, "m = 3");
  a = ok, a.eps = 1e-5f;
  expect_error(a, EC::kInvalidArgument, "without norm weights");
  a = ok, a.stages = 3;
  expect_error(a, EC::kInvalidArgument, "stages = 3");
  EXPECT_TRUE(cuda::bf16_gemv_fits(buf, w, 8, 576));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf, w, 9, 576));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf, w, 1, 20));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf + 1, w, 1, 576));
}

}  // namespace
}  // namespace lychee

#else
TEST(Bf16Gemv, NotBuilt) { LY_CUDA_NOT_BUILT("the bf16 GEMV kernel tests"); }
#endif  // LYCHEE_HAS_CUDA
