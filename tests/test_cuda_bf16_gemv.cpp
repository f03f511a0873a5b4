// bf16 weight GEMV with its fused RMSNorm and residual / SwiGLU epilogues (cuda/kernels/bf16_gemv.h)
// against a double-precision host reference: awkward and model shapes for n = 1, 3, 8, bf16 and FP8
// (e4m3 codes + row scales) weights, every output
// form with and without the norm (the residual add also writing the next norm's inputs); FP8
// weights without the norm give fp8_gemv's bits; the QKV + RoPE epilogue against bias, RoPE and
// the page append on the host; both
// weight stagings give the same bits, two calls give the same bits, rows do not depend on m, a
// CUDA graph replays them; a residual add followed by a normed product agrees with add_rmsnorm
// (kernels.h) to within their roundings. The argument checks need no GPU and run everywhere.
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
#include "core/fp8.h"
#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LYCHEE_HAS_CUDA
#include <cstdlib>

#include "cuda/common/device_buffer.h"
#include "cuda/kernels/bf16_gemv.h"
#include "cuda/kernels/fp8_gemv.h"
#include "cuda/kernels/kernels.h"
#include "pdl_probe.h"

namespace lychee {
namespace {

using cuda::bf16;
using cuda::Bf16GemvArgs;
using cuda::DeviceBuffer;
using cuda::GemvOut;

constexpr float kEps = 1e-5f;

// A product's inputs on the host. The norm's input is what a residual add with next_norm writes:
// xt = bf16(norm · v) for residual rows v, its residues xt_lo = bf16(norm · v - xt), and partial
// sums of squares of v (16 per slot).
struct Problem {
  int n = 0, k = 0, m = 0;
  std::vector<uint16_t> x16;     // [n][k] bf16 bits, ~N(0, 1)
  std::vector<float> v;          // [n][k] f32 residual, ~N(0, 4^i) (row scales apart: r_i differs per row)
  std::vector<float> norm;       // [k] RMSNorm weights around 1
  std::vector<uint16_t> xt;      // [n][k] bf16(norm · v)
  std::vector<uint16_t> xt_lo;   // [n][k] bf16(norm · v - xt)
  std::vector<float> ss;         // [n][ceil(k / 16)] Σ v² over 16 positions
  std::vector<uint16_t> w;       // [m][k] bf16 bits, row magnitudes 2^-6 .. 2^6, exact zeros
  std::vector<uint8_t> w8;       // [m][k] the same rows as e4m3 codes (core/fp8.h)
  std::vector<float> w_scale;    // [m] and their scales
  std::vector<float> bias;       // [m]
  std::vector<float> y0;         // [n][m] the residual the kAddF32 product adds to
  std::vector<float> next_norm;  // [m] the next RMSNorm's weights (kAddF32)
};

int ss_count(int k) { return cuda::bf16_gemv_ss_count(k); }

Problem make_problem(int n, int k, int m, uint32_t seed) {
  Problem p;
  p.n = n, p.k = k, p.m = m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x16.resize(size_t(n) * k);
  for (auto& e : p.x16) e = f32_to_bf16(normal(rng));
  p.norm.resize(size_t(k));
  for (auto& e : p.norm) e = 1.0f + 0.25f * normal(rng);
  p.v.resize(size_t(n) * k);
  p.xt.resize(size_t(n) * k);
  p.xt_lo.resize(size_t(n) * k);
  p.ss.assign(size_t(n) * ss_count(k), 0.0f);
  for (int i = 0; i < n; ++i)
    for (int t = 0; t < k; ++t) {
      const size_t e = size_t(i) * k + t;
      p.v[e] = std::ldexp(normal(rng), 2 * i - 4);
      const float u = p.norm[size_t(t)] * p.v[e];
      p.xt[e] = f32_to_bf16(u);
      p.xt_lo[e] = f32_to_bf16(u - bf16_to_f32(p.xt[e]));
      p.ss[size_t(i) * ss_count(k) + size_t(t / 16)] += p.v[e] * p.v[e];
    }
  p.w.resize(size_t(m) * k);
  for (int j = 0; j < m; ++j) {
    const float mag = std::ldexp(1.0f, j % 13 - 6);
    for (int t = 0; t < k; ++t) p.w[size_t(j) * k + t] = t % 97 == 5 ? 0 : f32_to_bf16(mag * normal(rng));
  }
  std::vector<float> wf(p.w.size());
  for (size_t e = 0; e < wf.size(); ++e) wf[e] = bf16_to_f32(p.w[e]);
  p.w8.resize(wf.size());
  p.w_scale.resize(size_t(m));
  quantize_rows_e4m3(wf.data(), m, k, p.w8.data(), p.w_scale.data());
  p.bias.resize(size_t(m));
  for (auto& e : p.bias) e = normal(rng);
  p.y0.resize(size_t(n) * m);
  for (auto& e : p.y0) e = 8.0f * normal(rng);
  p.next_norm.resize(size_t(m));
  for (auto& e : p.next_norm) e = 1.0f + 0.25f * normal(rng);
  return p;
}

// s[i][j] = f_i Σ_t w[j][t] x[i][t] in double (x = x16, or xt + xt_lo with f_i the exact RMSNorm
// factor of v; w the bf16 weights, or with fp8 the codes' values times the row scales, and x
// then xt alone: the FP8 products take no residues), and
// f_i Σ|terms| (bounds the f32 accumulation error), [n][m].
struct Sums {
  std::vector<double> s, abs;
};

double weight(const Problem& p, size_t e, bool fp8) {
  return fp8 ? double(e4m3_to_f32(p.w8[e])) * p.w_scale[e / size_t(p.k)] : double(bf16_to_f32(p.w[e]));
}

Sums sums(const Problem& p, bool norm, bool fp8) {
  Sums r{std::vector<double>(size_t(p.n) * p.m), std::vector<double>(size_t(p.n) * p.m)};
  std::vector<double> f(size_t(p.n), 1.0);
  if (norm)
    for (int i = 0; i < p.n; ++i) {
      double q = 0.0;
      for (int t = 0; t < p.k; ++t) q += double(p.v[size_t(i) * p.k + t]) * p.v[size_t(i) * p.k + t];
      f[size_t(i)] = 1.0 / std::sqrt(q / p.k + double(kEps));
    }
  const std::vector<uint16_t>& x = norm ? p.xt : p.x16;
  for (int j = 0; j < p.m; ++j)
    for (int i = 0; i < p.n; ++i) {
      double s = 0.0, a = 0.0;
      for (int t = 0; t < p.k; ++t) {
        const size_t e = size_t(i) * p.k + t;
        const double xv = double(bf16_to_f32(x[e])) + (norm && !fp8 ? double(bf16_to_f32(p.xt_lo[e])) : 0.0);
        const double term = weight(p, size_t(j) * p.k + t, fp8) * xv;
        s += term;
        a += std::fabs(term);
      }
      r.s[size_t(i) * p.m + j] = f[size_t(i)] * s;
      r.abs[size_t(i) * p.m + j] = f[size_t(i)] * a;
    }
  return r;
}

// Error bound of one sum, as the FP8 GEMV's test argues it: each f32 addition errs by at most
// 2^-23 of Σ|terms| and a sum passes through at most k/16 + 16 of them (doubled). With the norm the
// factor adds rsqrtf's 2 ulps and the f32 sums of squares' rounding: 2^-18 of the result. FP8
// weights: the row scale's f32 multiply, 2^-24 of the result (doubled).
double sum_tolerance(const Problem& p, bool norm, bool fp8, double s, double abs_sum) {
  const double acc = 2.0 * (p.k / 16 + 16) * std::ldexp(1.0, -23);
  return acc * abs_sum + (norm ? std::ldexp(std::fabs(s), -18) : 0.0) + (fp8 ? std::ldexp(std::fabs(s), -23) : 0.0);
}

struct Device {
  DeviceBuffer<bf16> x16, xt, xt_lo, w, y16, xn, xn_lo;
  DeviceBuffer<uint8_t> w8;
  DeviceBuffer<float> ss, bias, y32, next_norm, ss_out, w_scale;
};

Device upload(const Problem& p) {
  Device d;
  d.x16 = test::to_device_bf16_bits(p.x16);
  d.xt = test::to_device_bf16_bits(p.xt);
  d.xt_lo = test::to_device_bf16_bits(p.xt_lo);
  d.ss = test::to_device(p.ss);
  d.w = test::to_device_bf16_bits(p.w);
  d.w8 = test::to_device(p.w8);
  d.w_scale = test::to_device(p.w_scale);
  d.bias = test::to_device(p.bias);
  d.next_norm = test::to_device(p.next_norm);
  d.y16 = DeviceBuffer<bf16>(size_t(p.n) * p.m);
  d.y32 = DeviceBuffer<float>(size_t(p.n) * p.m);
  d.xn = DeviceBuffer<bf16>(size_t(p.n) * p.m);
  d.xn_lo = DeviceBuffer<bf16>(size_t(p.n) * p.m);
  d.ss_out = DeviceBuffer<float>(size_t(p.n) * ss_count(p.m));
  return d;
}

// The product over the first m rows of w (with fp8: of w8); a residual add also writes the next
// norm's inputs.
Bf16GemvArgs args(Device& d, const Problem& p, GemvOut out, bool norm, int m, int stages = -1, bool fp8 = false) {
  Bf16GemvArgs a;
  a.x = norm ? d.xt.data() : d.x16.data();
  if (norm) a.ss = d.ss.data(), a.ss_count = ss_count(p.k), a.eps = kEps;
  if (norm && !fp8) a.x_lo = d.xt_lo.data();
  if (fp8)
    a.w8 = d.w8.data(), a.w_scale = d.w_scale.data();
  else
    a.w = d.w.data();
  a.out = out;
  const bool f32 = out == GemvOut::kF32 || out == GemvOut::kAddF32;
  a.y = f32 ? static_cast<void*>(d.y32.data()) : static_cast<void*>(d.y16.data());
  a.bias = out == GemvOut::kAddF32 || out == GemvOut::kSwiGlu ? d.bias.data() : nullptr;
  if (out == GemvOut::kAddF32)
    a.next_norm = d.next_norm.data(), a.xn = d.xn.data(), a.xn_lo = d.xn_lo.data(), a.ss_out = d.ss_out.data();
  a.n = p.n, a.k = p.k, a.m = m, a.stages = stages;
  return a;
}

// y (and for a residual add: xn, xn_lo, then ss_out) as floats, after one product into poisoned outputs
// (NaN: unwritten outputs show; the residual add starts from y0).
std::vector<float> run(Device& d, const Problem& p, const Bf16GemvArgs& a, cudaStream_t stream = nullptr) {
  const size_t count = size_t(p.n) * (a.out == GemvOut::kSwiGlu ? a.m / 2 : a.m);
  LY_CUDA_CHECK(cudaMemset(d.y32.data(), 0xFF, d.y32.bytes()));
  LY_CUDA_CHECK(cudaMemset(d.y16.data(), 0xFF, d.y16.bytes()));
  LY_CUDA_CHECK(cudaMemset(d.xn.data(), 0xFF, d.xn.bytes()));
  LY_CUDA_CHECK(cudaMemset(d.xn_lo.data(), 0xFF, d.xn_lo.bytes()));
  LY_CUDA_CHECK(cudaMemset(d.ss_out.data(), 0xFF, d.ss_out.bytes()));
  if (a.out == GemvOut::kAddF32) {
    std::vector<float> y0(count);
    for (int i = 0; i < p.n; ++i) std::copy_n(p.y0.begin() + long(i) * p.m, a.m, y0.begin() + long(i) * a.m);
    LY_CUDA_CHECK(cudaMemcpy(d.y32.data(), y0.data(), count * 4, cudaMemcpyHostToDevice));
  }
  cuda::bf16_gemv(a, stream);
  LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (a.out == GemvOut::kF32) return test::to_host(d.y32, count);
  if (a.out == GemvOut::kAddF32) {
    std::vector<float> y = test::to_host(d.y32, count), xn = test::to_host_bf16(d.xn), lo = test::to_host_bf16(d.xn_lo);
    const std::vector<float> ss = test::to_host(d.ss_out, size_t(p.n) * ss_count(a.m));
    y.insert(y.end(), xn.begin(), xn.begin() + long(count));
    y.insert(y.end(), lo.begin(), lo.begin() + long(count));
    y.insert(y.end(), ss.begin(), ss.end());
    return y;
  }
  std::vector<float> y = test::to_host_bf16(d.y16);
  y.resize(count);
  return y;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// got (run()'s result for `out`) against the reference from the sums, every element within its
// bound; a residual add's xn must be bf16(next_norm · y) of its own y exactly (xn_lo the residue,
// exactly), and its sums of squares those of its y within 2^-20.
void expect_close(const std::vector<float>& got, const Problem& p, const Sums& r, GemvOut out, bool norm, bool fp8,
                  const std::string& what) {
  const int cols = out == GemvOut::kSwiGlu ? p.m / 2 : p.m;
  const size_t count = size_t(p.n) * cols;
  ASSERT_EQ(got.size(), out == GemvOut::kAddF32 ? 3 * count + size_t(p.n) * ss_count(p.m) : count) << what;
  size_t n_bad = 0;
  std::string first;
  const auto bad = [&](const std::string& where, double g, double want, double tol) {
    if (n_bad++ == 0)
      first = where + " = " + std::to_string(g) + ", want " + std::to_string(want) + " +- " + std::to_string(tol);
  };
  for (int i = 0; i < p.n; ++i)
    for (int j = 0; j < cols; ++j) {
      const size_t e = size_t(i) * p.m + j;
      const double ts = sum_tolerance(p, norm, fp8, r.s[e], r.abs[e]);
      double want = 0.0, tol = 0.0;
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
          const double tg = ts, tu = sum_tolerance(p, norm, fp8, r.s[eu], r.abs[eu]);
          want = silu(gate) * up;
          // |silu'| <= 1.1; __expf and the f32 arithmetic ~2^-20; the bf16 output 2^-8.
          tol = 1.1 * (std::fabs(up) + tu) * tg + (std::fabs(silu(gate)) + 1.1 * tg) * tu +
                (std::ldexp(1.0, -8) + std::ldexp(1.0, -20)) * (std::fabs(want) + 1.1 * tg * std::fabs(up) + 1e-30);
          break;
        }
        case GemvOut::kQkvRope: ADD_FAILURE() << "expect_close: kQkvRope has its own test"; return;
      }
      const double g = got[size_t(i) * cols + j];
      if (!(std::fabs(g - want) <= tol + 1e-30))  // NaN (an unwritten output) fails
        bad("y[" + std::to_string(i) + "][" + std::to_string(j) + "]", g, want, tol);
    }
  if (out == GemvOut::kAddF32)
    for (int i = 0; i < p.n; ++i) {
      for (int j = 0; j < p.m; ++j) {
        const float y = got[size_t(i) * p.m + j], xn = got[count + size_t(i) * p.m + j];
        const float lo = got[2 * count + size_t(i) * p.m + j];
        const float u = p.next_norm[size_t(j)] * y, want = bf16_to_f32(f32_to_bf16(u));
        const float want_lo = bf16_to_f32(f32_to_bf16(u - want));
        if (!(xn == want)) bad("xn[" + std::to_string(i) + "][" + std::to_string(j) + "]", xn, want, 0.0);
        if (!(lo == want_lo)) bad("xn_lo[" + std::to_string(i) + "][" + std::to_string(j) + "]", lo, want_lo, 0.0);
      }
      for (int b = 0; b < ss_count(p.m); ++b) {
        double q = 0.0;
        for (int j = 16 * b; j < std::min(p.m, 16 * b + 16); ++j)
          q += double(got[size_t(i) * p.m + j]) * got[size_t(i) * p.m + j];
        const double g = got[3 * count + size_t(i) * ss_count(p.m) + size_t(b)];
        if (!(std::fabs(g - q) <= std::ldexp(q, -20)))
          bad("ss_out[" + std::to_string(i) + "][" + std::to_string(b) + "]", g, q, std::ldexp(q, -20));
      }
    }
  EXPECT_EQ(n_bad, 0u) << what << ": " << n_bad << " outputs off; first " << first;
}

const char* out_name(GemvOut o) {
  return o == GemvOut::kBf16 ? "bf16" : o == GemvOut::kF32 ? "f32" : o == GemvOut::kAddF32 ? "add_f32" : "swiglu";
}

// ------------------------------------------------------------------------------ shapes

using Shape = std::tuple<std::pair<int, int> /*k, m*/, int /*n*/, bool /*fp8 weights*/>;
class Bf16Gemv : public ::testing::TestWithParam<Shape> {};

// fp8_gemv / fp8_gemv_f32_out of the same codes, x = x16 (the product without the norm), as run()
// returns a kBf16 / kF32 product.
std::vector<float> fp8_gemv_result(Device& d, const Problem& p, GemvOut out) {
  const size_t count = size_t(p.n) * p.m;
  LY_CUDA_CHECK(cudaMemset(d.y32.data(), 0xFF, d.y32.bytes()));
  LY_CUDA_CHECK(cudaMemset(d.y16.data(), 0xFF, d.y16.bytes()));
  if (out == GemvOut::kF32) {
    cuda::fp8_gemv_f32_out(d.x16.data(), d.w8.data(), d.w_scale.data(), d.y32.data(), p.n, p.k, p.m, nullptr);
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    return test::to_host(d.y32, count);
  }
  cuda::fp8_gemv(d.x16.data(), d.w8.data(), d.w_scale.data(), d.y16.data(), p.n, p.k, p.m, nullptr);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> y = test::to_host_bf16(d.y16);
  y.resize(count);
  return y;
}

// Every output form with and without the norm, both stagings (the same bits), twice (the same bits);
// FP8 weights without the norm: fp8_gemv's bits.
TEST_P(Bf16Gemv, MatchesTheReference) {
  LY_REQUIRE_GPU();
  const auto [km, n, fp8] = GetParam();
  const auto [k, m] = km;
  const Problem p = make_problem(n, k, m, uint32_t(7 * k + 13 * m + n));
  Device d = upload(p);
  for (const bool norm : {false, true}) {
    const Sums r = sums(p, norm, fp8);
    for (const GemvOut out : {GemvOut::kBf16, GemvOut::kF32, GemvOut::kAddF32, GemvOut::kSwiGlu}) {
      if (out == GemvOut::kSwiGlu && m % 2 != 0) continue;
      const std::string what = std::string(out_name(out)) + (norm ? " with norm" : "") + (fp8 ? ", fp8 weights" : "");
      const std::vector<float> y = run(d, p, args(d, p, out, norm, m, 0, fp8));
      expect_close(y, p, r, out, norm, fp8, what);
      const std::vector<float> ring = run(d, p, args(d, p, out, norm, m, 2, fp8));
      EXPECT_EQ(std::memcmp(y.data(), ring.data(), y.size() * sizeof(float)), 0) << what << ": the stagings differ";
      const std::vector<float> again = run(d, p, args(d, p, out, norm, m, -1, fp8));
      EXPECT_EQ(std::memcmp(y.data(), again.data(), y.size() * sizeof(float)), 0) << what << ": runs differ";
      if (out == GemvOut::kSwiGlu)  // the other tilings: 16 and 8 outputs per block, both stagings
        for (const int outputs : {16, 8})
          for (const int stages : {0, 2}) {
            Bf16GemvArgs a = args(d, p, out, norm, m, stages, fp8);
            a.swiglu_outputs = outputs;
            const std::vector<float> tiled = run(d, p, a);
            EXPECT_EQ(std::memcmp(y.data(), tiled.data(), y.size() * sizeof(float)), 0)
                << what << ": " << outputs << " outputs per block, stages " << stages << " differ";
          }
      if (fp8 && !norm && (out == GemvOut::kBf16 || out == GemvOut::kF32)) {
        const std::vector<float> plain = fp8_gemv_result(d, p, out);
        ASSERT_EQ(plain.size(), y.size());
        EXPECT_EQ(std::memcmp(y.data(), plain.data(), y.size() * sizeof(float)), 0) << what << ": not fp8_gemv's bits";
      }
    }
  }
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const auto [km, n, fp8] = info.param;
  const auto [k, m] = km;
  return "k" + std::to_string(k) + "_m" + std::to_string(m) + "_n" + std::to_string(n) + (fp8 ? "_fp8" : "");
}

// (8, 2): one lane's piece of k; (40, 7): k inside the second chunk, a partial m16 tile, odd m (no
// SwiGLU); (1040, 38): k ending inside a chunk and a slab; (576, 960) and (1536, 576): the default
// model's QKV and down; (4096, 6144): Llama-3-8B's QKV (more than one wave); (14336, 64): its
// down_proj's k.
INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Gemv,
                         ::testing::Combine(::testing::Values(std::pair(8, 2), std::pair(40, 7), std::pair(1040, 38),
                                                              std::pair(576, 960), std::pair(1536, 576),
                                                              std::pair(4096, 6144), std::pair(14336, 64)),
                                            ::testing::Values(1, 3, 8), ::testing::Values(false)),
                         shape_name);

// FP8 weights (k a multiple of 16): (16, 2) one lane's codes; (48, 7) k inside the first 64-wide
// chunk, a partial tile, odd m; (1040, 38) k ending inside a chunk and a slab; the default model's
// QKV and down, Llama-3-8B's QKV (more than one wave) and down_proj's k.
INSTANTIATE_TEST_SUITE_P(Fp8Shapes, Bf16Gemv,
                         ::testing::Combine(::testing::Values(std::pair(16, 2), std::pair(48, 7), std::pair(1040, 38),
                                                              std::pair(576, 960), std::pair(1536, 576),
                                                              std::pair(4096, 6144), std::pair(14336, 64)),
                                            ::testing::Values(1, 3, 8), ::testing::Values(true)),
                         shape_name);

// ------------------------------------------------------------------------------ QKV + RoPE

// The kQkvRope epilogue against the host: each row's Q heads (bias, RoPE at its position), and its
// K (bias, RoPE) and V (bias) heads in the pools at the row's page slot, from the double sums,
// bf16 and FP8 weights, with and without the norm; every other pool element left as it was (NaN).
struct RopeShape {
  int n, k, n_heads, n_kv_heads, head_dim;
  bool fp8;
};
class Bf16GemvQkvRope : public ::testing::TestWithParam<RopeShape> {};

TEST_P(Bf16GemvQkvRope, MatchesBiasRopeAndAppendOnTheHost) {
  LY_REQUIRE_GPU();
  const RopeShape sh = GetParam();
  const int d = sh.head_dim, half = d / 2, heads = sh.n_heads + 2 * sh.n_kv_heads, m = heads * d;
  const int page = 16, n_pages = sh.n + 3;
  const Problem p = make_problem(sh.n, sh.k, m, uint32_t(31 * sh.k + m + sh.n));
  Device dv = upload(p);
  std::mt19937 rng(uint32_t(sh.k + d));
  std::vector<int32_t> pos(size_t(sh.n)), kv_page(size_t(sh.n)), kv_row(size_t(sh.n));
  for (int i = 0; i < sh.n; ++i) {
    pos[size_t(i)] = int32_t(rng() % 131072u);
    kv_page[size_t(i)] = (i * 5 + 2) % n_pages;  // distinct pages, not in row order
    kv_row[size_t(i)] = int32_t(rng() % uint32_t(page));
  }
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j) inv_freq[size_t(j)] = float(std::pow(500000.0, -2.0 * j / d));
  DeviceBuffer<int32_t> dpos = test::to_device(pos), dpage = test::to_device(kv_page), drow = test::to_device(kv_row);
  DeviceBuffer<float> dfreq = test::to_device(inv_freq);
  const size_t pool_elems = size_t(n_pages) * sh.n_kv_heads * page * d;
  DeviceBuffer<bf16> kp(pool_elems), vp(pool_elems), qo(size_t(sh.n) * sh.n_heads * d);
  for (const bool norm : {false, true}) {
    LY_CUDA_CHECK(cudaMemset(kp.data(), 0xFF, kp.bytes()));
    LY_CUDA_CHECK(cudaMemset(vp.data(), 0xFF, vp.bytes()));
    LY_CUDA_CHECK(cudaMemset(qo.data(), 0xFF, qo.bytes()));
    Bf16GemvArgs a = args(dv, p, GemvOut::kBf16, norm, m, -1, sh.fp8);
    a.out = GemvOut::kQkvRope;
    a.y = qo.data();
    a.bias = dv.bias.data();
    a.rope.positions = dpos.data(), a.rope.kv_page = dpage.data(), a.rope.kv_row = drow.data();
    a.rope.inv_freq = dfreq.data(), a.rope.k_pool = kp.data(), a.rope.v_pool = vp.data();
    a.rope.n_heads = sh.n_heads, a.rope.n_kv_heads = sh.n_kv_heads, a.rope.head_dim = d, a.rope.page_size = page;
    cuda::bf16_gemv(a, nullptr);
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> q = test::to_host_bf16(qo), k = test::to_host_bf16(kp), v = test::to_host_bf16(vp);
    const Sums r = sums(p, norm, sh.fp8);
    const std::string what = std::string(norm ? "with norm" : "plain") + (sh.fp8 ? ", fp8 weights" : "");
    size_t n_bad = 0, written = 0;
    std::string first;
    const auto check = [&](const char* where, size_t at, double got, double want, double tol) {
      if (!(std::fabs(got - want) <= tol + 1e-30) && n_bad++ == 0)
        first = std::string(where) + "[" + std::to_string(at) + "] = " + std::to_string(got) + ", want " +
                std::to_string(want) + " +- " + std::to_string(tol);
    };
    for (int i = 0; i < sh.n; ++i)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < half; ++j) {
          const size_t e0 = size_t(i) * m + size_t(h * d + j), e1 = e0 + size_t(half);
          const double u0 = r.s[e0] + p.bias[e0 % size_t(m)], u1 = r.s[e1] + p.bias[e1 % size_t(m)];
          const double t0 = sum_tolerance(p, norm, sh.fp8, r.s[e0], r.abs[e0]);
          const double t1 = sum_tolerance(p, norm, sh.fp8, r.s[e1], r.abs[e1]);
          const bool v_head = h >= sh.n_heads + sh.n_kv_heads;
          double w0 = u0, w1 = u1, tol0 = t0, tol1 = t1;
          if (!v_head) {  // the kernel's f32 angle; sincosf within 2 ulps, f32 arithmetic
            const float ang = float(pos[size_t(i)]) * inv_freq[size_t(j)];
            const double c = std::cos(double(ang)), sn = std::sin(double(ang));
            w0 = u0 * c - u1 * sn, w1 = u1 * c + u0 * sn;
            const double mix = t0 + t1 + std::ldexp(std::fabs(u0) + std::fabs(u1), -20);
            tol0 = tol1 = mix;
          }
          tol0 += std::ldexp(std::fabs(w0), -8), tol1 += std::ldexp(std::fabs(w1), -8);
          size_t at = 0;
          const std::vector<float>* dst = &q;
          if (h < sh.n_heads) {
            at = (size_t(i) * sh.n_heads + h) * d;
          } else {
            const int kvh = h - sh.n_heads - (v_head ? sh.n_kv_heads : 0);
            dst = v_head ? &v : &k;
            at = ((size_t(kv_page[size_t(i)]) * sh.n_kv_heads + kvh) * page + kv_row[size_t(i)]) * d;
          }
          check(h < sh.n_heads ? "q" : v_head ? "v_pool" : "k_pool", at + j, (*dst)[at + j], w0, tol0);
          check(h < sh.n_heads ? "q" : v_head ? "v_pool" : "k_pool", at + j + half, (*dst)[at + j + half], w1, tol1);
        }
    for (const std::vector<float>* pool : {&k, &v})
      for (const float e : *pool) written += std::isnan(e) ? 0 : 1;
    EXPECT_EQ(n_bad, 0u) << what << ": " << n_bad << " outputs off; first " << first;
    EXPECT_EQ(written, size_t(sh.n) * sh.n_kv_heads * d * 2) << what << ": pool elements written outside the slots";
  }
}

// Llama-3-8B's heads (32 / 8 x 128) at k = 4096 (the ring: 6144 rows), the default model's (9 / 3
// x 64, k = 576) and small ones (4 / 2 x 32; 3 / 1 x 16: one block per head), n = 1, 3, 8, bf16
// and FP8.
INSTANTIATE_TEST_SUITE_P(Shapes, Bf16GemvQkvRope,
                         ::testing::Values(RopeShape{1, 4096, 32, 8, 128, false}, RopeShape{8, 4096, 32, 8, 128, true},
                                           RopeShape{3, 576, 9, 3, 64, false}, RopeShape{8, 576, 9, 3, 64, true},
                                           RopeShape{3, 48, 4, 2, 32, true}, RopeShape{1, 40, 4, 2, 32, false},
                                           RopeShape{2, 64, 3, 1, 16, false}),
                         [](const auto& info) {
                           const RopeShape& s = info.param;
                           return "n" + std::to_string(s.n) + "_k" + std::to_string(s.k) + "_h" +
                                  std::to_string(s.n_heads) + "x" + std::to_string(s.n_kv_heads) + "_d" +
                                  std::to_string(s.head_dim) + (s.fp8 ? "_fp8" : "");
                         });

// ------------------------------------------------------------------------------ the chain

// A residual add with next_norm, then a normed product: what the fused decode layers do between
// two products. With one-hot weight rows in the second (row j picks input j once) its f32 output
// is RMSNorm(v)·norm as the chain computes it, r_i · (xn + xn_lo) with xn + xn_lo = norm[j] · v[i][j]
// to ~16 bits, where add_rmsnorm writes bf16(norm[j] · (v[i][j] · r_i)) for the same residual v: one
// bf16 rounding (at most 2^-8 of the value: 8 significant bits) and rsqrtf's ulps apart, so within
// 1.01 · 2^-8. A missing factor, a wrong row's r, a lost residue or a swapped norm weight is off by
// more (the slots of the sums are checked one by one above).
TEST(Bf16GemvChain, ResidualAddThenNormedProductIsAddRmsnorm) {
  LY_REQUIRE_GPU();
  const int n = 3, d = 4096;
  Problem p = make_problem(n, d, d, 21);  // the residual add: k = m = d
  Device dev = upload(p);
  DeviceBuffer<float> x = test::to_device(p.y0);  // the residual the add updates: v = y0 + s + bias
  Bf16GemvArgs add = args(dev, p, GemvOut::kAddF32, false, d);
  add.y = x.data();
  cuda::bf16_gemv(add, nullptr);
  std::vector<uint16_t> one_hot(size_t(d) * d, 0);
  for (int j = 0; j < d; ++j) one_hot[size_t(j) * d + j] = f32_to_bf16(1.0f);
  DeviceBuffer<bf16> eye = test::to_device_bf16_bits(one_hot);
  DeviceBuffer<float> y(size_t(n) * d);
  Bf16GemvArgs normed;
  normed.x = dev.xn.data(), normed.x_lo = dev.xn_lo.data(), normed.ss = dev.ss_out.data();
  normed.ss_count = ss_count(d), normed.eps = kEps;
  normed.w = eye.data(), normed.out = GemvOut::kF32, normed.y = y.data(), normed.n = n, normed.k = d, normed.m = d;
  cuda::bf16_gemv(normed, nullptr);
  DeviceBuffer<bf16> h(size_t(n) * d);  // add_rmsnorm of the same residual (its delta: none, it is added)
  cuda::add_rmsnorm(x.data(), nullptr, nullptr, dev.next_norm.data(), h.data(), n, d, kEps, nullptr);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = test::to_host(y), want = test::to_host_bf16(h);
  int n_bad = 0;
  for (size_t e = 0; e < want.size(); ++e)
    if (!(std::fabs(got[e] - want[e]) <= 1.01 * std::ldexp(std::fabs(want[e]), -8)) && n_bad++ < 5)
      ADD_FAILURE() << "row " << e / d << ", input " << e % d << ": " << got[e] << " vs add_rmsnorm " << want[e];
  EXPECT_EQ(n_bad, 0);
}

// ------------------------------------------------------------------------------ determinism

// A row's result depends only on its weights, x and k: the first 1024 rows give the same bits with
// m = 28672 (the ring, several waves), 4096 and 1024 (registers, one wave: staged so explicitly,
// the automatic choice being the ring everywhere), bf16 and FP8 weights.
TEST(Bf16GemvDeterminism, RowsDoNotDependOnM) {
  LY_REQUIRE_GPU();
  const Problem p = make_problem(8, 1024, 28672, 5);
  Device d = upload(p);
  for (const bool fp8 : {false, true}) {
    std::vector<std::vector<float>> prefix;
    for (const int m : {28672, 4096, 1024}) {
      const std::vector<float> y = run(d, p, args(d, p, GemvOut::kF32, true, m, m == 28672 ? 2 : 0, fp8));
      prefix.emplace_back();
      for (int i = 0; i < p.n; ++i) {
        const auto row = y.begin() + long(i) * m;
        prefix.back().insert(prefix.back().end(), row, row + 1024);
      }
    }
    for (size_t v = 1; v < prefix.size(); ++v)
      EXPECT_EQ(std::memcmp(prefix[0].data(), prefix[v].data(), prefix[0].size() * sizeof(float)), 0)
          << "m = 28672 and case " << v << " differ" << (fp8 ? " (fp8 weights)" : "");
  }
}

// Captured once and replayed into poisoned outputs: the direct call's bits (the residual add
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
      // run()'s resets, then the replay instead of a direct call
      const size_t count = size_t(p.n) * (out == GemvOut::kSwiGlu ? p.m / 2 : p.m);
      LY_CUDA_CHECK(cudaMemset(d.y16.data(), 0xFF, d.y16.bytes()));
      LY_CUDA_CHECK(cudaMemset(d.xn.data(), 0xFF, d.xn.bytes()));
      LY_CUDA_CHECK(cudaMemset(d.xn_lo.data(), 0xFF, d.xn_lo.bytes()));
      LY_CUDA_CHECK(cudaMemset(d.ss_out.data(), 0xFF, d.ss_out.bytes()));
      if (out == GemvOut::kAddF32) LY_CUDA_CHECK(cudaMemcpy(d.y32.data(), p.y0.data(), count * 4, cudaMemcpyHostToDevice));
      LY_CUDA_CHECK(cudaGraphLaunch(exec, s));
      LY_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<float> y;
      if (out == GemvOut::kAddF32) {
        y = test::to_host(d.y32, count);
        const std::vector<float> xn = test::to_host_bf16(d.xn), lo = test::to_host_bf16(d.xn_lo);
        const std::vector<float> ss = test::to_host(d.ss_out);
        y.insert(y.end(), xn.begin(), xn.begin() + long(count));
        y.insert(y.end(), lo.begin(), lo.begin() + long(count));
        y.insert(y.end(), ss.begin(), ss.end());
      } else {
        y = test::to_host_bf16(d.y16);
        y.resize(count);
      }
      ASSERT_EQ(y.size(), direct.size());
      EXPECT_EQ(std::memcmp(y.data(), direct.data(), y.size() * sizeof(float)), 0)
          << out_name(out) << " replay " << rep << " differs";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  }
  LY_CUDA_CHECK(cudaStreamDestroy(s));
}

// Under programmatic dependent launch (a.pdl = 1) behind a slow kernel (pdl_probe.h) that lets the
// GEMV launch at once and only 2 ms later writes its inputs: x, the norm's residues and sums of
// squares, and for the residual add the residual y, all NaN until then. The GEMV loads only weights
// and constants before its griddepcontrol.wait, so it gives the direct call's bits; a probe behind
// it reads x before its own wait and must see the producer's x (the GEMV lets the next kernel
// launch only past its wait). The probe test in test_cuda_decode_attention.cpp shows the window.
TEST(Bf16GemvUnderPdl, InputsWrittenSlowlyByThePreviousKernel) {
  LY_REQUIRE_GPU();
  if (std::getenv("LYCHEE_NO_PDL") != nullptr || std::getenv("LYCHEE_BF16_GEMV_PDL") != nullptr)
    GTEST_SKIP() << "LYCHEE_NO_PDL or LYCHEE_BF16_GEMV_PDL is set: the GEMV's launch mode is not the test's to choose";
  const Problem p = make_problem(3, 1040, 1536, 21);
  Device d = upload(p);
  const DeviceBuffer<bf16> xt = test::to_device_bf16_bits(p.xt), xt_lo = test::to_device_bf16_bits(p.xt_lo);
  const DeviceBuffer<float> ss = test::to_device(p.ss), y0 = test::to_device(p.y0);
  DeviceBuffer<uint8_t> probe_before(d.xt.bytes()), probe_after(d.xt.bytes());
  test::launch_slow_producer(nullptr, 0, 0, nullptr);  // loaded outside the race (lazy module loading)
  test::launch_pdl_probe(d.xt.data(), probe_before.data(), probe_after.data(), 0, nullptr);
  for (const bool fp8 : {false, true})
    for (const GemvOut out : {GemvOut::kBf16, GemvOut::kAddF32, GemvOut::kSwiGlu}) {
      SCOPED_TRACE(std::string(out_name(out)) + (fp8 ? ", fp8 weights" : ", bf16 weights"));
      Bf16GemvArgs a = args(d, p, out, true, p.m, -1, fp8);
      a.pdl = 1;
      const std::vector<float> direct = run(d, p, a);  // outside the race: the direct call's bits
      std::vector<test::CopyRange> ranges = {{d.xt.data(), xt.data(), uint32_t(d.xt.bytes())},
                                             {d.ss.data(), ss.data(), uint32_t(d.ss.bytes())}};
      if (a.x_lo != nullptr) ranges.push_back({d.xt_lo.data(), xt_lo.data(), uint32_t(d.xt_lo.bytes())});
      if (out == GemvOut::kAddF32) ranges.push_back({d.y32.data(), y0.data(), uint32_t(size_t(p.n) * p.m * 4)});
      const DeviceBuffer<test::CopyRange> d_ranges = test::to_device(ranges);
      // run()'s resets, then the inputs poisoned (NaN) for the producer to write
      LY_CUDA_CHECK(cudaMemset(d.y16.data(), 0xFF, d.y16.bytes()));
      LY_CUDA_CHECK(cudaMemset(d.xn.data(), 0xFF, d.xn.bytes()));
      LY_CUDA_CHECK(cudaMemset(d.xn_lo.data(), 0xFF, d.xn_lo.bytes()));
      LY_CUDA_CHECK(cudaMemset(d.ss_out.data(), 0xFF, d.ss_out.bytes()));
      for (const test::CopyRange& r : ranges) LY_CUDA_CHECK(cudaMemset(r.dst, 0xFF, r.bytes));
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      test::launch_slow_producer(d_ranges.data(), int(ranges.size()), 2'000'000, nullptr);
      cuda::bf16_gemv(a, nullptr);
      test::launch_pdl_probe(d.xt.data(), probe_before.data(), probe_after.data(), uint32_t(d.xt.bytes()), nullptr);
      LY_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t count = size_t(p.n) * (out == GemvOut::kSwiGlu ? p.m / 2 : p.m);
      std::vector<float> y;
      if (out == GemvOut::kAddF32) {  // as run() gathers it
        y = test::to_host(d.y32, count);
        const std::vector<float> xn = test::to_host_bf16(d.xn), lo = test::to_host_bf16(d.xn_lo);
        const std::vector<float> sso = test::to_host(d.ss_out, size_t(p.n) * ss_count(p.m));
        y.insert(y.end(), xn.begin(), xn.begin() + long(count));
        y.insert(y.end(), lo.begin(), lo.begin() + long(count));
        y.insert(y.end(), sso.begin(), sso.end());
      } else {
        y = test::to_host_bf16(d.y16);
        y.resize(count);
      }
      ASSERT_EQ(y.size(), direct.size());
      size_t differ = 0, first = 0;
      for (size_t i = 0; i < y.size(); ++i)
        if (std::memcmp(&y[i], &direct[i], sizeof(float)) != 0 && differ++ == 0) first = i;
      EXPECT_EQ(differ, 0u) << "behind the slow producer: " << differ << " outputs differ from the direct call's, the "
                            << "first at " << first << " (" << y[first] << " vs " << direct[first] << ")";
      EXPECT_TRUE(test::to_host(probe_before) == test::to_host(probe_after))
          << "x as the kernel after the GEMV read it before its wait was not the producer's: it started before the "
             "producer ended";
    }
}

// ------------------------------------------------------------------------------ argument checks

// The checks run on the host before any launch (bf16_gemv throws before launching); no GPU needed.
void expect_error(const Bf16GemvArgs& a, ErrorCode code, const std::string& needle) {
  test::expect_error([&] { cuda::bf16_gemv(a, nullptr); }, code, needle);
}

TEST(Bf16GemvArgs, RejectsWhatTheKernelCannotTake) {
  alignas(16) static uint16_t buf[64] = {};
  const auto* w = reinterpret_cast<const bf16*>(buf);
  Bf16GemvArgs ok;
  ok.x = w, ok.w = w, ok.y = buf + 32, ok.n = 1, ok.k = 16, ok.m = 2;
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
  a = ok, a.x = w + 1;  // 2-byte aligned
  expect_error(a, EC::kInvalidArgument, "16-byte aligned");
  a = ok, a.out = GemvOut::kSwiGlu, a.m = 3;
  expect_error(a, EC::kInvalidArgument, "m = 3");
  a = ok, a.eps = 1e-5f;
  expect_error(a, EC::kInvalidArgument, "without sums of squares");
  static float ss[4] = {};
  a = ok, a.ss = ss;  // ss_count 0
  expect_error(a, EC::kInvalidArgument, "ss_count = 0");
  a = ok, a.next_norm = ss;  // on a bf16 output
  expect_error(a, EC::kInvalidArgument, "next_norm");
  a = ok, a.out = GemvOut::kAddF32, a.next_norm = ss, a.ss_out = ss;  // no xn
  expect_error(a, EC::kInvalidArgument, "next_norm");
  a = ok, a.x_lo = w;  // residues without ss
  expect_error(a, EC::kInvalidArgument, "x_lo");
  a = ok, a.stages = 3;
  expect_error(a, EC::kInvalidArgument, "stages = 3");
  a = ok, a.swiglu_outputs = 4;
  expect_error(a, EC::kInvalidArgument, "swiglu_outputs = 4");
  a = ok, a.pdl = 2;
  expect_error(a, EC::kInvalidArgument, "pdl = 2");
  static int32_t ints[4] = {};
  a = ok, a.out = GemvOut::kQkvRope, a.m = 4 * 32;  // 2 Q + 2 x 1 KV heads of 32
  a.rope.n_heads = 2, a.rope.n_kv_heads = 1, a.rope.head_dim = 32, a.rope.page_size = 16;
  a.rope.positions = ints, a.rope.kv_page = ints, a.rope.kv_row = ints, a.rope.inv_freq = ss;
  a.rope.k_pool = const_cast<bf16*>(w), a.rope.v_pool = const_cast<bf16*>(w);
  EXPECT_NO_THROW(cuda::check_bf16_gemv_args(a));
  auto b = a;
  b.rope.head_dim = 40, b.m = 4 * 40;
  expect_error(b, EC::kInvalidArgument, "head_dim = 40");
  b = a, b.m = 96;
  expect_error(b, EC::kInvalidArgument, "m = 96");
  b = a, b.rope.kv_row = nullptr;
  expect_error(b, EC::kInvalidArgument, "kv_row");
  b = a, b.rope.page_size = 0;
  expect_error(b, EC::kInvalidArgument, "page_size = 0");
  b = a, b.w = nullptr, b.w8 = reinterpret_cast<const uint8_t*>(buf), b.w_scale = ss;
  EXPECT_NO_THROW(cuda::check_bf16_gemv_args(b));  // FP8 codes take the RoPE epilogue too
  b.ss = ss, b.ss_count = 1, b.x_lo = w;             // but no input residues
  expect_error(b, EC::kInvalidArgument, "x_lo with FP8");
  static float scales[2] = {};
  const auto* codes = reinterpret_cast<const uint8_t*>(buf);
  a = ok, a.w = nullptr, a.w8 = codes;  // FP8 codes without their scales
  expect_error(a, EC::kInvalidArgument, "w_scale");
  a = ok, a.w8 = codes, a.w_scale = scales;  // both formats
  expect_error(a, EC::kInvalidArgument, "both w");
  a = ok, a.w_scale = scales;  // scales with bf16 weights
  expect_error(a, EC::kInvalidArgument, "w_scale");
  a = ok, a.w = nullptr, a.w8 = codes, a.w_scale = scales;
  EXPECT_NO_THROW(cuda::check_bf16_gemv_args(a));
  a.k = 24;  // a multiple of 8, not of 16
  expect_error(a, EC::kUnsupported, "k = 24");
  a = ok, a.w = nullptr, a.w8 = codes + 1, a.w_scale = scales;
  expect_error(a, EC::kInvalidArgument, "w8");
  a = ok, a.w = nullptr;
  expect_error(a, EC::kInvalidArgument, "null pointer");
  EXPECT_TRUE(cuda::bf16_gemv_fits(buf, w, 8, 576));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf, w, 9, 576));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf, w, 1, 20));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf + 1, w, 1, 576));
  EXPECT_TRUE(cuda::bf16_gemv_fits(buf, codes, 8, 576, true));
  EXPECT_FALSE(cuda::bf16_gemv_fits(buf, codes, 8, 24, true));
  EXPECT_TRUE(cuda::bf16_gemv_fits(buf, codes, 8, 24, false));
  EXPECT_TRUE(cuda::bf16_gemv_weights_fit(codes, 32, true));
  EXPECT_FALSE(cuda::bf16_gemv_weights_fit(codes, 24, true));
  EXPECT_FALSE(cuda::bf16_gemv_weights_fit(codes + 1, 32, true));
  EXPECT_FALSE(cuda::bf16_gemv_weights_fit(nullptr, 32, false));
}

}  // namespace
}  // namespace lychee

#else
TEST(Bf16Gemv, NotBuilt) { LY_CUDA_NOT_BUILT("the bf16 GEMV kernel tests"); }
#endif  // LYCHEE_HAS_CUDA
