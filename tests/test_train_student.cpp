// The CPU oracle of the head-role trainer's whole pass (src/train/cpu_student.h): dloss/dz
// against finite differences on z for the golden tiny models (and one gate of the default
// model), the equalities the semantics imply (all gates 1 == teacher, keep_ratio 1 == dense), the
// teacher against cpu::Model, float against double, the selections, and input validation.
// The measured errors are recorded as test properties: run with --gtest_output=xml to see them.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "test_util.h"
#include "train/cpu_student.h"

namespace lychee::train {
namespace {

using Vec = std::vector<double>;

using Tiny = test::GoldenModel;
using test::expect_error;
const auto load_tiny = test::load_golden_model;

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

constexpr int kContext = 40, kTargets = 8, kMaxContext = 64;

// z cycling through interior and boundary values (layer 0's entries are ignored).
template <typename Real>
std::vector<Real> z_pattern(const ModelConfig& c, int offset) {
  const double vals[] = {0.23, 0.81, 0.0, 1.0, 0.64, 0.37};
  std::vector<Real> z(size_t(c.n_layers * c.n_kv_heads));
  for (size_t i = 0; i < z.size(); ++i) z[i] = Real(vals[(i + size_t(offset)) % 6]);
  return z;
}

template <typename Real>
std::unique_ptr<CpuStudent<Real>> make_student(const Tiny& m, StudentOptions o,
                                               uint32_t seed = 11) {
  auto s = std::make_unique<CpuStudent<Real>>(m.config, m.weights, o, kMaxContext);
  s->set_context(random_tokens(kContext, m.config.vocab_size, seed));
  s->teacher(random_tokens(kTargets, m.config.vocab_size, seed + 1));
  return s;
}

using AllSets = std::vector<std::vector<std::vector<int32_t>>>;
AllSets all_sets(const CpuStudent<double>& s) {
  AllSets r;
  for (int l = 0; l < s.config().n_layers; ++l)
    for (int h = 0; h < s.config().n_kv_heads; ++h) r.push_back(s.selected(l, h));
  return r;
}

struct FdCase {
  std::string model;
  DistillLoss loss;
  bool propagate_only_retrieval;
};

std::string fd_case_name(const ::testing::TestParamInfo<FdCase>& info) {
  return info.param.model + (info.param.loss == DistillLoss::kLogits ? "_logits" : "_hidden") +
         (info.param.propagate_only_retrieval ? "_retrieval_only" : "_all_heads");
}

class StudentGradient : public ::testing::TestWithParam<FdCase> {};

// dloss/dz against finite differences on z: central inside (0, 1), second-order one-sided at 0
// and 1 (z outside [0, 1] is rejected). The sets must not change under the perturbation.
TEST_P(StudentGradient, MatchesFiniteDifferences) {
  const FdCase& p = GetParam();
  const Tiny m = load_tiny(p.model);
  const ModelConfig& c = m.config;
  StudentOptions o;
  o.loss = p.loss;
  o.propagate_only_retrieval = p.propagate_only_retrieval;
  auto s = make_student<double>(m, o);
  for (int offset = 0; offset < 3; ++offset) {
    std::vector<double> z = z_pattern<double>(c, offset), dz(z.size());
    const double loss = s->student_real(z, dz);  // 0 when every gate is 1 (qwen2: one gate)
    const AllSets sets = all_sets(*s);
    for (int l = 1; l < c.n_layers; ++l)  // the sparse sets are strict subsets
      for (int h = 0; h < c.n_kv_heads; ++h)
        for (int t = 0; t < kTargets; ++t) {
          const int n_visible = kContext + t + 1;
          const auto& row = sets[size_t(l * c.n_kv_heads + h)][size_t(t)];
          ASSERT_EQ(int(row.size()), student_budget(o.keep_ratio, n_visible));
          ASSERT_LT(int(row.size()), n_visible);
          ASSERT_EQ(row.back(), n_visible - 1);
        }
    auto f = [&](size_t i, double zi) {
      std::vector<double> zz = z;
      zz[i] = zi;
      const double r = s->student_real(zz, {});
      EXPECT_EQ(all_sets(*s), sets)
          << "a selection changed under the perturbation of z[" << i << "]";
      return r;
    };
    const double h = 1e-6;
    double max_err = 0, max_grad = 1e-3;  // the floor: an absolute tolerance of 1e-9
    for (double g : dz) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t i = 0; i < z.size(); ++i) {
      if (int(i) < c.n_kv_heads) {
        EXPECT_EQ(dz[i], 0.0) << "layer 0 has no gate";
        continue;
      }
      double fd;
      if (z[i] == 0.0)
        fd = (-3 * loss + 4 * f(i, h) - f(i, 2 * h)) / (2 * h);
      else if (z[i] == 1.0)
        fd = (3 * loss - 4 * f(i, 1 - h) + f(i, 1 - 2 * h)) / (2 * h);
      else
        fd = (f(i, z[i] + h) - f(i, z[i] - h)) / (2 * h);
      max_err = std::max(max_err, std::fabs(fd - dz[i]));
      EXPECT_NEAR(dz[i], fd, 1e-6 * max_grad) << "z[" << i << "] = " << z[i] << " (layer "
                                              << i / size_t(c.n_kv_heads) << "), loss " << loss;
    }
    RecordProperty("rel_err_z" + std::to_string(offset), fmt::format("{:.2e}", max_err / max_grad));
  }
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> r;
  for (const char* model : {"llama_tied_f32", "qwen2_untied_f16", "qwen3_tied_bf16"})
    for (DistillLoss loss : {DistillLoss::kLogits, DistillLoss::kHidden})
      for (bool retrieval_only : {false, true}) r.push_back({model, loss, retrieval_only});
  for (const char* model : {"llama_bias_f16", "llama31_untied_bf16_sharded", "mistral_f32"})
    r.push_back({model, DistillLoss::kLogits, true});
  return r;
}

INSTANTIATE_TEST_SUITE_P(Golden, StudentGradient, ::testing::ValuesIn(fd_cases()), fd_case_name);

const char* const kAllModels[] = {"llama31_untied_bf16_sharded",
                                  "llama_bias_f16",
                                  "llama_tied_f32",
                                  "mistral_f32",
                                  "qwen2_untied_f16",
                                  "qwen3_tied_bf16"};

// All gates 1: the student is the teacher bit for bit, in both precisions and for both losses.
TEST(StudentEqualities, AllGatesOneIsTheTeacherExactly) {
  for (const char* name : kAllModels) {
    const Tiny m = load_tiny(name);
    for (DistillLoss loss : {DistillLoss::kLogits, DistillLoss::kHidden}) {
      StudentOptions o;
      o.loss = loss;
      auto s = make_student<float>(m, o);
      std::vector<float> z(size_t(m.config.n_layers * m.config.n_kv_heads), 1.0f),
          dz(z.size(), 9.0f);
      EXPECT_EQ(s->student(z, dz), 0.0) << name;
      EXPECT_TRUE(std::equal(s->student_output().begin(), s->student_output().end(),
                             s->teacher_output().begin()))
          << name;
      for (float g : dz) EXPECT_EQ(g, 0.0f) << name;
      auto sd = make_student<double>(m, o);
      std::vector<double> zd(z.size(), 1.0), dzd(z.size());
      EXPECT_EQ(sd->student_real(zd, dzd), 0.0) << name;
    }
  }
}

// keep_ratio 1: every set is every visible token, sparse == dense, so any z gives loss ~0.
TEST(StudentEqualities, KeepRatioOneIsDense) {
  for (const char* name : {"llama_tied_f32", "qwen3_tied_bf16", "qwen2_untied_f16"}) {
    const Tiny m = load_tiny(name);
    StudentOptions o;
    o.keep_ratio = 1.0;
    auto s = make_student<double>(m, o);
    std::vector<double> z = z_pattern<double>(m.config, 0), dz(z.size());
    const double loss = s->student_real(z, dz);
    double scale = 0;
    for (double t : s->teacher_output()) scale += t * t / kTargets;
    EXPECT_LT(loss, 1e-26 * scale) << name;
    for (double g : dz) EXPECT_LT(std::fabs(g), 1e-12 * std::sqrt(scale)) << name;
    EXPECT_EQ(int(s->selected(1, 0)[kTargets - 1].size()), kContext + kTargets) << name;
  }
}

// The teacher is the verified engine: cpu::Model's all-logits forward of context + targets.
TEST(StudentEqualities, TeacherMatchesCpuModel) {
  for (const char* name : kAllModels) {
    const Tiny m = load_tiny(name);
    auto s = make_student<float>(m, StudentOptions{});
    const Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/" + name);
    cpu::Model model(ck.config(), HostWeights::load(ck));
    std::vector<int32_t> all = random_tokens(kContext, m.config.vocab_size, 11);
    const std::vector<int32_t> targets = random_tokens(kTargets, m.config.vocab_size, 12);
    all.insert(all.end(), targets.begin(), targets.end());
    cpu::KvCache kv(ck.config(), int(all.size()));
    std::vector<float> logits;
    model.forward(all, kv, logits, /*all_logits=*/true);
    const auto want =
        std::span<const float>(logits).subspan(size_t(kContext) * m.config.vocab_size);
    ASSERT_EQ(s->teacher_output().size(), want.size()) << name;
    const test::Deviation d = test::deviation(s->teacher_output(), want);
    EXPECT_LE(d.max_abs, 1e-4 * d.ref_max)
        << name << ": worst at " << d.worst << ": " << s->teacher_output()[d.worst] << " vs "
        << want[d.worst];
  }
}

// The default model (SmolLM2-135M, GGUF Q4_1: un-permuted Q/K rows, tied, 9 heads over 3 KV
// heads): the teacher against cpu::Model, and dloss/dz of one layer-1 gate (the longest backward
// path) against a central difference. One weight load; every double forward streams 1 GB.
TEST(StudentDefaultModel, TeacherMatchesCpuModelAndGradientMatchesFiniteDifferences) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const Checkpoint ck = Checkpoint::open(path);
  Tiny m{ck.config(), HostWeights::load(ck)};
  const ModelConfig& c = m.config;
  auto sf = make_student<float>(m, StudentOptions{});
  auto sd = make_student<double>(m, StudentOptions{});
  {
    cpu::Model model(c, std::move(m.weights));
    std::vector<int32_t> all = random_tokens(kContext, c.vocab_size, 11);
    const std::vector<int32_t> targets = random_tokens(kTargets, c.vocab_size, 12);
    all.insert(all.end(), targets.begin(), targets.end());
    cpu::KvCache kv(c, int(all.size()));
    std::vector<float> logits;
    model.forward(all, kv, logits, /*all_logits=*/true);
    const auto want = std::span<const float>(logits).subspan(size_t(kContext) * c.vocab_size);
    ASSERT_EQ(sf->teacher_output().size(), want.size());
    const test::Deviation d = test::deviation(sf->teacher_output(), want);
    RecordProperty("teacher_rel_err", fmt::format("{:.2e}", d.max_abs / d.ref_max));
    EXPECT_LE(d.max_abs, 1e-4 * d.ref_max) << "worst at " << d.worst;
    sf.reset();
  }
  std::vector<double> z = z_pattern<double>(c, 0), dz(z.size());
  const double loss = sd->student_real(z, dz);
  const AllSets sets = all_sets(*sd);
  const size_t i = size_t(c.n_kv_heads + 1);  // layer 1, KV head 1, z = 0.81
  const double h = 1e-6;
  std::vector<double> zz = z;
  zz[i] = z[i] + h;
  const double fp = sd->student_real(zz, {});
  EXPECT_EQ(all_sets(*sd), sets);
  zz[i] = z[i] - h;
  const double fm = sd->student_real(zz, {});
  EXPECT_EQ(all_sets(*sd), sets);
  const double fd = (fp - fm) / (2 * h);
  RecordProperty("rel_err_z_layer1", fmt::format("{:.2e}", std::fabs(fd - dz[i]) / std::fabs(fd)));
  EXPECT_NEAR(dz[i], fd, 1e-6 * std::fabs(fd)) << "z[" << i << "], loss " << loss;
}

TEST(StudentEqualities, FloatAgreesWithDouble) {
  for (const char* name : {"llama_tied_f32", "qwen3_tied_bf16", "qwen2_untied_f16"})
    for (DistillLoss loss : {DistillLoss::kLogits, DistillLoss::kHidden}) {
      const Tiny m = load_tiny(name);
      StudentOptions o;
      o.loss = loss;
      auto sf = make_student<float>(m, o);
      auto sd = make_student<double>(m, o);
      const std::vector<float> z = z_pattern<float>(m.config, 1);
      std::vector<float> dzf(z.size());
      std::vector<double> zd(z.begin(), z.end()), dzd(z.size());
      const double lf = sf->student(z, dzf), ld = sd->student_real(zd, dzd);
      EXPECT_NEAR(lf, ld, 1e-4 * ld) << name;
      double gmax = 0;
      for (double g : dzd) gmax = std::max(gmax, std::fabs(g));
      for (size_t i = 0; i < z.size(); ++i)
        EXPECT_NEAR(dzf[i], dzd[i], 1e-3 * gmax) << name << " z[" << i << "]";
    }
}

// Layer 1 reads layer 0's selection: recompute it from the weights with the ops (layer 0's q and
// k of a token depend only on its embedding and position) and compare.
TEST(StudentSelection, LayerOneReadsLayerZerosDenseMapSelection) {
  for (const char* name : {"llama_tied_f32", "qwen2_untied_f16", "qwen3_tied_bf16"}) {
    const Tiny m = load_tiny(name);
    const ModelConfig& c = m.config;
    auto s = make_student<double>(m, StudentOptions{});
    std::vector<double> z = z_pattern<double>(c, 0);
    s->student_real(z, {});
    std::vector<int32_t> all = random_tokens(kContext, c.vocab_size, 11);
    const std::vector<int32_t> targets = random_tokens(kTargets, c.vocab_size, 12);
    all.insert(all.end(), targets.begin(), targets.end());
    const int n = int(all.size()), d = c.d_model, hd = c.head_dim;
    auto w = [&](WeightId id) {
      const float* p = m.weights.get(id, 0);
      return p ? Vec(p, p + weight_numel(weight_spec(id), c)) : Vec();
    };
    Vec x(size_t(n * d)), h(x.size()), q(size_t(n * c.q_dim())), k(size_t(n * c.kv_dim()));
    const Vec embd = w(WeightId::kTokEmbd), norm = w(WeightId::kAttnNorm);
    for (int t = 0; t < n; ++t)
      std::copy_n(embd.begin() + int64_t(all[size_t(t)]) * d, d, x.begin() + int64_t(t) * d);
    rmsnorm(x.data(), norm.data(), h.data(), n, d, double(c.rms_eps));
    const Vec bq = w(WeightId::kBq), bk = w(WeightId::kBk);
    linear(h.data(), w(WeightId::kWq).data(), bq.empty() ? nullptr : bq.data(), q.data(), n, d,
           c.q_dim());
    linear(h.data(), w(WeightId::kWk).data(), bk.empty() ? nullptr : bk.data(), k.data(), n, d,
           c.kv_dim());
    if (c.qk_norm) {
      rmsnorm(q.data(), w(WeightId::kQNorm).data(), q.data(), n * c.n_heads, hd, double(c.rms_eps));
      rmsnorm(k.data(), w(WeightId::kKNorm).data(), k.data(), n * c.n_kv_heads, hd,
              double(c.rms_eps));
    }
    const std::vector<float> inv_f = rope_inv_freq(c);
    const Vec inv(inv_f.begin(), inv_f.end());
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) pos[size_t(t)] = t;
    rope(q.data(), pos.data(), n, c.n_heads, hd, inv.data());
    rope(k.data(), pos.data(), n, c.n_kv_heads, hd, inv.data());
    const int group = c.group_size();
    for (int kh = 0; kh < c.n_kv_heads; ++kh)
      for (int t = 0; t < kTargets; ++t) {
        const int p = kContext + t;
        Vec a(static_cast<size_t>(p), 0.0);
        for (int g = 0; g < group; ++g)
          for (int j = 0; j < p; ++j)
            for (int i = 0; i < hd; ++i)
              a[size_t(j)] += q[size_t((p * c.n_heads + kh * group + g) * hd + i)] *
                              k[size_t((j * c.n_kv_heads + kh) * hd + i)] / group;
        std::vector<int32_t> want;
        select_set(a.data(), p, student_budget(0.3, p + 1), want);
        EXPECT_EQ(s->selected(1, kh)[size_t(t)], want) << name << " KV head " << kh << " row " << t;
        EXPECT_TRUE(s->selected(0, kh)[size_t(t)].empty());
      }
  }
}

// propagate_only_retrieval: a head of layer 1 with z <= 0.5 leaves its index's set as it was.
TEST(StudentSelection, RetrievalOnlyPropagation) {
  const Tiny m = load_tiny("qwen3_tied_bf16");  // 3 layers, 2 KV heads
  StudentOptions o;
  o.propagate_only_retrieval = true;
  auto s = make_student<double>(m, o);
  std::vector<double> z = {0.5, 0.5, /*layer 1*/ 0.5, 0.9, /*layer 2*/ 0.3, 0.3};
  s->student_real(z, {});
  EXPECT_EQ(s->selected(2, 0), s->selected(1, 0));  // z = 0.5 is not > 0.5: kept
  EXPECT_NE(s->selected(2, 1), s->selected(1, 1));  // re-selected by layer 1
  o.propagate_only_retrieval = false;
  auto all = make_student<double>(m, o);
  all->student_real(z, {});
  EXPECT_EQ(all->selected(1, 0), s->selected(1, 0));
  EXPECT_EQ(all->selected(2, 1), s->selected(2, 1));
  EXPECT_NE(all->selected(2, 0), s->selected(2, 0));
}

TEST(StudentValidation, RejectsBadInputsWithClearErrors) {
  const Tiny m = load_tiny("llama_tied_f32");
  const ModelConfig& c = m.config;
  using S = CpuStudent<float>;
  StudentOptions bad;
  bad.keep_ratio = 0.0;
  expect_error([&] { S(c, m.weights, bad, 64); }, ErrorCode::kInvalidArgument, "keep_ratio");
  bad.keep_ratio = 1.5;
  expect_error([&] { S(c, m.weights, bad, 64); }, ErrorCode::kInvalidArgument, "keep_ratio");
  expect_error([&] { S(c, m.weights, {}, c.max_context + 1); }, ErrorCode::kInvalidArgument,
               "max_context");
  expect_error([&] { S(c, m.weights, {}, 1); }, ErrorCode::kInvalidArgument, "max_context");

  S s(c, m.weights, {}, 16);
  const std::vector<int32_t> ctx = {1, 2, 3}, tgt = {4, 5};
  std::vector<float> z(size_t(c.n_layers * c.n_kv_heads), 0.5f), dz(z.size());
  expect_error([&] { s.teacher(tgt); }, ErrorCode::kInvalidArgument, "before set_context");
  expect_error([&] { s.set_context(std::vector<int32_t>(16, 1)); }, ErrorCode::kCapacity,
               "max_context 16");
  expect_error(
      [&] {
        s.set_context(std::vector<int32_t>{1, c.vocab_size});
      },
      ErrorCode::kInvalidArgument, "outside the vocabulary");
  expect_error([&] { s.set_context(std::vector<int32_t>{-1}); }, ErrorCode::kInvalidArgument,
               "context token -1");
  s.set_context(ctx);
  expect_error([&] { s.student(z, dz); }, ErrorCode::kInvalidArgument, "before teacher");
  expect_error([&] { s.teacher({}); }, ErrorCode::kInvalidArgument, "at least one target");
  expect_error([&] { s.teacher(std::vector<int32_t>(14, 1)); }, ErrorCode::kCapacity,
               "exceeds max_context");
  expect_error(
      [&] {
        s.teacher(std::vector<int32_t>{4, c.vocab_size + 3});
      },
      ErrorCode::kInvalidArgument, "target token");
  s.teacher(std::vector<int32_t>(13, 1));  // 3 + 13 = 16 fits exactly
  s.teacher(tgt);
  expect_error([&] { s.selected(1, 0); }, ErrorCode::kInvalidArgument, "before a student pass");
  std::vector<float> short_z(z.size() - 1);
  expect_error([&] { s.student(short_z, dz); }, ErrorCode::kInvalidArgument, "z has");
  expect_error([&] { s.student(z, std::span<float>(dz).first(1)); }, ErrorCode::kInvalidArgument,
               "dz has");
  for (float v : {-0.1f, 1.5f, std::nanf("")}) {
    std::vector<float> zb = z;
    zb[3] = v;
    expect_error([&] { s.student(zb, dz); }, ErrorCode::kInvalidArgument,
                 "z[3] (layer 1, KV head 1)");
  }
  EXPECT_GT(s.student(z, dz), 0.0);
  expect_error([&] { s.selected(c.n_layers, 0); }, ErrorCode::kInvalidArgument, "outside");
  expect_error([&] { s.selected(0, -1); }, ErrorCode::kInvalidArgument, "outside");
  s.set_context(ctx);  // a new context drops the teacher
  expect_error([&] { s.student(z, dz); }, ErrorCode::kInvalidArgument, "before teacher");
}

}  // namespace
}  // namespace lychee::train
