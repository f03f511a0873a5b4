// Issue 40's bf16 context prefill on the GPU: cuDNN's SDPA for the prefill's attention
// (GpuStudentTuning::prefill_cudnn, with and without the bf16 products of prefill_bf16, and the
// teacher_cudnn variant) against the TF32 path and the fp64 CPU oracle: the context K/V of every
// layer, the teacher's outputs, the loss and dz; a context of two prefill chunks; all gates 1 is
// still the teacher. Skipped with a visible message without a GPU.
//
// Tolerances, from bf16's rounding (8-bit significand: unit roundoff u = 2^-9 ≈ 2e-3, ≈ 1.1e-3
// rms per rounding). cuDNN rounds q, K, V and the probabilities and writes a bf16 output: five
// roundings, ≈ sqrt(5) · 1.1e-3 ≈ 2.5e-3 rms relative on a layer's attention output. A layer's K/V
// see the earlier layers' attention outputs through the residual stream (the norms keep relative
// errors), so on these 3-layer models their error is a few 1e-3; the bf16 products add ~1.6e-3
// per product (the activations rounded; the weights too where the checkpoint is not bf16).
// kKvTol = 2e-2 leaves ~4x. An indexing, head-mapping or causal-offset mistake gives errors of
// order 1. Layer 0's K/V come before any attention: with TF32 products they equal the TF32 path's
// bit for bit.
#include <gtest/gtest.h>

#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "cuda/train/student.h"
#include "model/config.h"
#include "model/weight_table.h"
#include "test_util.h"
#include "train/cpu_student.h"

namespace lychee {
namespace {

constexpr double kKvTol = 2e-2;
// The teacher's outputs move with the context's K/V (they are its only bf16 input): as the bf16
// prefill's teacher against the TF32 prefill's in test_cuda_train_dp.cpp.
constexpr double kTeacherTol = 3e-2;
// dz against the TF32 path: the student and the teacher read the same moved context, so the loss's
// differences move only to second order; what moves dz is the student's own selection reading the
// moved keys (a position at the top-k boundary may swap, changing that row's sparse output by
// ~1/k of it). 5e-2 is the TF32 path's own bound against the oracle (test_cuda_train.cpp).
constexpr double kDzTol = 5e-2;

std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

std::vector<float> gates(const ModelConfig& c, uint32_t seed) {  // mostly sparse, every third above 0.5
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> z(size_t(c.n_layers) * c.n_kv_heads);
  for (size_t i = 0; i < z.size(); ++i) z[i] = i % 3 == 1 ? 0.6f + 0.3f * u(rng) : 0.3f * u(rng);
  return z;
}

std::vector<float> to_float(std::span<const double> v) { return {v.begin(), v.end()}; }

struct Pass {
  std::vector<std::vector<float>> kv;  // [layer] context_kv
  std::vector<float> teacher, dz;
  double loss = 0;
  std::vector<std::vector<int32_t>> sets;  // the last layer's
  std::string backend;                     // GpuStudent::sdpa_backend() after the pass
};

Pass run_gpu(const ModelConfig& c, const HostWeights& w, const cuda::GpuStudentTuning& tuning,
             const std::vector<int32_t>& ctx, const std::vector<int32_t>& tgt, const std::vector<float>& z) {
  cuda::GpuStudent gpu(c, w, train::StudentOptions{}, int(ctx.size() + tgt.size()), int(tgt.size()), tuning);
  gpu.set_context(ctx);
  Pass p;
  for (int l = 0; l < c.n_layers; ++l) p.kv.push_back(gpu.context_kv(l));
  gpu.teacher(tgt);
  p.teacher = gpu.teacher_outputs();
  p.dz.assign(z.size(), NAN);
  p.loss = gpu.student(z, p.dz);
  p.sets = gpu.selected_sets(c.n_layers - 1);
  p.backend = gpu.sdpa_backend();
  return p;
}

cuda::GpuStudentTuning cudnn_tuning(bool bf16_products, bool teacher) {
  cuda::GpuStudentTuning t;
  t.prefill_cudnn = true;
  t.prefill_bf16 = bf16_products;
  t.teacher_cudnn = teacher;
  return t;
}

class CudnnPrefill : public ::testing::TestWithParam<std::string> {};

TEST_P(CudnnPrefill, MatchesTf32PathAndCpuOracle) {
  LY_REQUIRE_GPU();
  const test::GoldenModel m = test::load_golden_model(GetParam());  // head_dim 64, 3 layers
  const ModelConfig& c = m.config;
  const std::vector<int32_t> ctx = tokens(200, c.vocab_size, 11), tgt = tokens(30, c.vocab_size, 12);
  const std::vector<float> z = gates(c, 13);
  train::CpuStudent<double> cpu(c, m.weights, train::StudentOptions{}, 230);
  cpu.set_context(ctx);
  std::vector<std::vector<float>> kv_cpu;
  for (int l = 0; l < c.n_layers; ++l) kv_cpu.push_back(to_float(cpu.context_kv(l)));
  cpu.teacher(tgt);
  std::vector<double> zd(z.begin(), z.end()), dzd(z.size());
  cpu.student_real(zd, dzd);
  const std::vector<float> teacher_cpu = to_float(cpu.teacher_output()), dz_cpu = to_float(dzd);

  const Pass ref = run_gpu(c, m.weights, {}, ctx, tgt, z);  // TF32 products, TF32 flash attention
  for (bool bf16_products : {false, true}) {
    const Pass p = run_gpu(c, m.weights, cudnn_tuning(bf16_products, false), ctx, tgt, z);
    const std::string label = GetParam() + (bf16_products ? " cudnn + bf16 products" : " cudnn");
    for (int l = 0; l < c.n_layers; ++l) {
      const double vs_tf32 = test::rel_error(p.kv[size_t(l)], ref.kv[size_t(l)]);
      const double vs_cpu = test::rel_error(p.kv[size_t(l)], kv_cpu[size_t(l)]);
      std::printf("[ cudnn prefill ] %s layer %d K/V: vs tf32 %.2e, vs cpu %.2e (tf32 vs cpu %.2e)\n", label.c_str(),
                  l, vs_tf32, vs_cpu, test::rel_error(ref.kv[size_t(l)], kv_cpu[size_t(l)]));
      EXPECT_LE(vs_tf32, kKvTol) << label << " layer " << l;
      EXPECT_LE(vs_cpu, kKvTol) << label << " layer " << l;
      if (l == 0 && !bf16_products) {
        EXPECT_EQ(p.kv[0], ref.kv[0]) << label << ": layer 0 precedes any attention";
      }
    }
    int mismatches = 0;
    for (size_t i = 0; i < p.sets.size(); ++i) mismatches += p.sets[i] != ref.sets[i];
    const double t_tf32 = test::rel_error(p.teacher, ref.teacher), t_cpu = test::rel_error(p.teacher, teacher_cpu);
    const double dz_tf32 = test::rel_error(p.dz, ref.dz), dz_cpu_err = test::rel_error(p.dz, dz_cpu);
    std::printf("[ cudnn prefill ] %s (%s): teacher vs tf32 %.2e, vs cpu %.2e; dz vs tf32 %.2e, vs cpu %.2e (tf32 "
                "vs cpu %.2e); last layer's sets differing from tf32's: %d of %zu\n",
                label.c_str(), p.backend.c_str(), t_tf32, t_cpu, dz_tf32, dz_cpu_err, test::rel_error(ref.dz, dz_cpu),
                mismatches, p.sets.size());
    EXPECT_LE(t_tf32, kTeacherTol) << label;
    EXPECT_LE(t_cpu, kTeacherTol) << label;
    EXPECT_LE(dz_tf32, kDzTol) << label;
    // The TF32 path is within kDzTol of the oracle (test_cuda_train.cpp), this path within kDzTol of it.
    EXPECT_LE(dz_cpu_err, 2 * kDzTol) << label;
    EXPECT_LE(std::fabs(p.loss - ref.loss), kTeacherTol * ref.loss) << label;
  }
}

INSTANTIATE_TEST_SUITE_P(CudaTrainCudnn, CudnnPrefill,
                         ::testing::Values("llama31_untied_bf16_sharded", "qwen3_tied_bf16", "llama_tied_f32"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// All gates 1 with the cuDNN prefill: the teacher and the student read the same context K/V, so
// the loss is the TF32 rounding between the teacher's flash rows and the student's materialised
// ones (the bound of Bf16PrefillKeepsAllGatesOneTheTeacher). With the teacher's attention on cuDNN
// too, the teacher moves by bf16's rounding of its own attention, which the student does not
// share: loss / scale = (the teacher's relative error)², below kTeacherTol² ≈ 1e-3.
TEST(CudaTrainCudnn, AllGatesOneIsTheTeacher) {
  LY_REQUIRE_GPU();
  const test::GoldenModel m = test::load_golden_model("llama31_untied_bf16_sharded");
  const ModelConfig& c = m.config;
  const std::vector<int32_t> ctx = tokens(200, c.vocab_size, 21), tgt = tokens(30, c.vocab_size, 22);
  const std::vector<float> ones(size_t(c.n_layers) * c.n_kv_heads, 1.0f);
  for (bool teacher : {false, true}) {
    const Pass p = run_gpu(c, m.weights, cudnn_tuning(true, teacher), ctx, tgt, ones);
    double scale = 0;
    for (float v : p.teacher) scale += double(v) * v / double(tgt.size());
    std::printf("[ cudnn prefill ] all gates 1, teacher on cudnn %d (%s): loss / scale %.3g\n", int(teacher),
                p.backend.c_str(), p.loss / scale);
    EXPECT_LT(p.loss, (teacher ? kTeacherTol * kTeacherTol : 1e-4) * scale) << "teacher on cudnn " << teacher;
    for (float g : p.dz) EXPECT_TRUE(std::isfinite(g));
  }
}

// A context of two prefill chunks (8192 rows, then 1000): the second chunk's queries sit at
// positions 8192 ... and see every earlier key, the causal offset cuDNN takes from
// kv_len − q_len (1000 rows give enough blocks that the kernels keep cuDNN rather than their
// split kernel, prefill_kv_splits). Random weights through a WeightSource (no CPU oracle at this length: the TF32
// path, whose flash kernel takes absolute positions, is the reference); the rows of each chunk
// are compared on their own so that a wrong offset in the short second chunk cannot hide.
TEST(CudaTrainCudnn, TwoChunkContextMatchesTf32Path) {
  LY_REQUIRE_GPU();
  ModelConfig c = model_shape("smollm2-135m");
  c.n_layers = 2, c.d_model = 128, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.d_ff = 256;
  c.vocab_size = 256, c.max_context = 9300;
  std::map<std::pair<int, int>, std::vector<float>> w;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const WeightSpec& spec : weight_table()) {
    if (spec.optional || (spec.present != nullptr && !spec.present(c))) continue;
    const bool norm = spec.id == WeightId::kAttnNorm || spec.id == WeightId::kFfnNorm || spec.id == WeightId::kOutputNorm;
    const float mean = norm ? 1.0f : 0.0f;
    const float sd = norm ? 0.1f : spec.id == WeightId::kTokEmbd ? 1.0f
                     : spec.id == WeightId::kWq || spec.id == WeightId::kWk ? 0.1f : 0.07f;
    for (int l = 0; l < (spec.per_layer ? c.n_layers : 1); ++l) {
      std::vector<float>& v = w[{int(spec.id), l}];
      v.resize(size_t(weight_numel(spec, c)));
      for (float& x : v) x = mean + sd * nd(rng);
    }
  }
  const cuda::WeightSource source = [&w](WeightId id, int layer) -> const float* {
    auto it = w.find({int(id), layer});
    if (it == w.end() && id == WeightId::kOutput) it = w.find({int(WeightId::kTokEmbd), 0});  // tied
    return it == w.end() ? nullptr : it->second.data();
  };
  const int L = 9192, T = 20, first = 8192;
  const std::vector<int32_t> ctx = tokens(L, c.vocab_size, 31), tgt = tokens(T, c.vocab_size, 32);
  std::vector<std::vector<float>> kv[2];
  for (int v = 0; v < 2; ++v) {
    cuda::GpuStudent gpu(c, source, train::StudentOptions{}, L + T, T, v == 0 ? cuda::GpuStudentTuning{}
                                                                               : cudnn_tuning(false, false));
    gpu.set_context(ctx);
    for (int l = 0; l < c.n_layers; ++l) kv[v].push_back(gpu.context_kv(l));
    if (v == 1) std::printf("[ cudnn prefill ] two chunks: the last chunk ran on %s\n", gpu.sdpa_backend().c_str());
  }
  EXPECT_EQ(kv[1][0], kv[0][0]) << "layer 0 precedes any attention";
  const size_t hd = size_t(c.head_dim), blocks = 2 * size_t(c.n_kv_heads);
  for (int part = 0; part < 2; ++part) {
    const size_t r0 = part == 0 ? 0 : size_t(first), r1 = part == 0 ? size_t(first) : size_t(L);
    std::vector<float> a, b;  // layer 1's K/V rows [r0, r1) of every head
    for (size_t k = 0; k < blocks; ++k) {
      a.insert(a.end(), kv[1][1].begin() + ptrdiff_t((k * L + r0) * hd), kv[1][1].begin() + ptrdiff_t((k * L + r1) * hd));
      b.insert(b.end(), kv[0][1].begin() + ptrdiff_t((k * L + r0) * hd), kv[0][1].begin() + ptrdiff_t((k * L + r1) * hd));
    }
    const double err = test::rel_error(a, b);
    std::printf("[ cudnn prefill ] two chunks: layer 1 K/V rows %zu..%zu vs tf32 %.2e\n", r0, r1 - 1, err);
    EXPECT_LE(err, kKvTol) << "rows " << r0 << " .. " << r1 - 1;
  }
}

}  // namespace
}  // namespace lychee

#else
TEST(CudaTrainCudnn, NotBuilt) { LY_CUDA_NOT_BUILT("the GPU trainer's cuDNN prefill tests"); }
#endif  // LYCHEE_HAS_CUDA
