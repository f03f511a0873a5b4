// Issue 40 on the GPU: the bf16 prefill's products keep all gates 1 at the teacher (the cuDNN
// prefill's tests: test_cuda_train_cudnn.cpp); the selection's keys in global memory (contexts
// past shared memory) equal shared; data parallelism: two GPU students on one GPU on threads of
// their own equal one student serving both ranks (the two ranks' gradients summed on one GPU), and
// on two GPUs (NCCL reducer) equal one GPU. Skipped with a visible message without a GPU (the
// two-GPU test below 2 GPUs).
#include <gtest/gtest.h>

#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/train/kernels.h"
#include "cuda/train/student.h"
#include "runtime/backend.h"
#include "test_util.h"
#include "tiny_checkpoint.h"
#include "train/trainer.h"

namespace lychee {
namespace {

using test::device_count;

// The teacher and the student read the same context K/V, so a bf16 prefill keeps all gates 1
// equal to the teacher bit for bit (as AllGatesOneIsTheTeacher, here through the flash path).
TEST(CudaTrainFlash, Bf16PrefillKeepsAllGatesOneTheTeacher) {
  LY_REQUIRE_GPU();
  const test::GoldenModel m = test::load_golden_model("llama31_untied_bf16_sharded");  // head_dim 64
  cuda::GpuStudentTuning tuning;
  tuning.prefill_bf16 = true;
  train::StudentOptions o;
  o.tf32 = true;  // the flash path (bf16 needs it)
  cuda::GpuStudent gpu(m.config, m.weights, o, 256, 30, tuning);
  std::mt19937 rng(5);
  std::vector<int32_t> ctx(200), tgt(30);
  for (int32_t& x : ctx) x = int32_t(rng() % uint32_t(m.config.vocab_size));
  for (int32_t& x : tgt) x = int32_t(rng() % uint32_t(m.config.vocab_size));
  gpu.set_context(ctx);
  gpu.teacher(tgt);
  const std::vector<float> t = gpu.teacher_outputs();
  // The student's dense rows (materialised TF32 products) and the teacher's flash differ by TF32
  // rounding only: the loss is that rounding's, tiny next to the teacher's logits.
  std::vector<float> z(size_t(m.config.n_layers) * m.config.n_kv_heads, 1.0f), dz(z.size());
  const double loss = gpu.student(z, dz);
  double scale = 0;
  for (float v : t) scale += double(v) * v / 30.0;
  EXPECT_LT(loss, 1e-4 * scale) << "all gates 1 with a bf16 prefill";
  for (float g : dz) EXPECT_TRUE(std::isfinite(g));
  // And the bf16 prefill's teacher is close to the TF32 prefill's (the context moved by bf16 only).
  cuda::GpuStudent ref(m.config, m.weights, o, 256, 30);
  ref.set_context(ctx);
  ref.teacher(tgt);
  const double err = test::rel_error(t, ref.teacher_outputs());
  std::printf("[ bf16 prefill ] teacher vs the tf32 prefill's: rel L2 %.2e; all-gates-1 loss %.3g\n", err, loss);
  EXPECT_LE(err, 3e-2);
}

// Past ~56K columns the selection's group sums move from shared memory to a global scratch
// (GpuStudent sizes that from max_context): the same sample with max_context 60000 and 512 gives
// the same sets, and the loss and dz to fp32 rounding (the selection is exact either way).
TEST(CudaTrainFlash, SelectionKeysInGlobalMemoryEqualShared) {
  LY_REQUIRE_GPU();
  const test::GoldenModel m = test::load_golden_model("qwen2_untied_f16");
  ModelConfig c = m.config;
  c.max_context = 60000;
  ASSERT_GT(cuda::train_ops::attention_forward_smem_bytes(60000, (60000 + 31) / 32, true),
            cuda::train_ops::attention_forward_smem_limit())
      << "60000 columns fit this GPU's shared memory: the test would not reach the global path";
  std::mt19937 rng(9);
  std::vector<int32_t> ctx(300), tgt(40);
  for (int32_t& x : ctx) x = int32_t(rng() % uint32_t(c.vocab_size));
  for (int32_t& x : tgt) x = int32_t(rng() % uint32_t(c.vocab_size));
  std::vector<float> z(size_t(c.n_layers) * c.n_kv_heads);
  for (size_t i = 0; i < z.size(); ++i) z[i] = float(i % 3) * 0.4f;
  train::StudentOptions o;
  o.tf32 = false;
  std::vector<float> dz_small(z.size()), dz_large(z.size());
  cuda::GpuStudent small(c, m.weights, o, 512, 40), large(c, m.weights, o, 60000, 40);
  for (cuda::GpuStudent* s : {&small, &large}) {
    s->set_context(ctx);
    s->teacher(tgt);
  }
  const double loss_small = small.student(z, dz_small), loss_large = large.student(z, dz_large);
  // The K/V caches' strides differ (max_context), which cuBLAS may answer with another kernel:
  // equal to fp32 rounding, not necessarily bit for bit. The sets are a discrete choice: equal.
  EXPECT_LE(std::fabs(loss_small - loss_large), 1e-6 * loss_small);
  EXPECT_LE(test::rel_error(dz_large, dz_small), 1e-5);
  for (int l = 1; l < c.n_layers; ++l) EXPECT_EQ(small.selected_sets(l), large.selected_sets(l)) << "layer " << l;
}

// Random contexts and targets, a pure function of the index.
class RandomSamples final : public train::TrainData {
 public:
  explicit RandomSamples(int vocab) : vocab_(vocab) {}
  size_t size() const override { return 0; }
  train::TrainSample sample(uint64_t index) const override {
    std::mt19937_64 rng(index * 7919 + 3);
    train::TrainSample s;
    const int n = 60 + int(rng() % 90);
    for (int i = 0; i < n; ++i) s.context.push_back(int32_t(rng() % uint64_t(vocab_)));
    for (int i = 0; i < 20; ++i) s.targets.push_back(int32_t(rng() % uint64_t(vocab_)));
    s.index = index;
    return s;
  }
  int max_target_tokens() const override { return 20; }
  std::string describe() const override { return "random tokens"; }

 private:
  int vocab_;
};

struct Outcome {
  nlohmann::json checkpoint;
  std::vector<double> expected_z;
};

Outcome train_ranks(const test::GoldenModel& m, std::span<train::Student* const> ranks,
                    const train::GradientReduce& reduce, const std::string& out) {
  std::filesystem::remove_all(out);
  train::TrainOptions o;
  o.n_retrieval = 1;  // qwen2_untied_f16 gates one KV head (layer 1 of 2)
  o.steps = 8;
  o.lr = 0.05;
  o.lambda_lr = 1e-3;
  o.checkpoint_every = 8;
  o.out_dir = out;
  o.progress = false;
  const RandomSamples data(m.config.vocab_size);
  const train::TrainResult r = train::train_head_roles(m.config, ranks, data, o, {}, {}, reduce);
  return {test::read_json(out + "/checkpoint.json"), r.expected_z};
}

void expect_same(const Outcome& a, const Outcome& b) {
  EXPECT_EQ(a.checkpoint["params"], b.checkpoint["params"]);
  EXPECT_EQ(a.checkpoint["losses"], b.checkpoint["losses"]);
  EXPECT_EQ(a.checkpoint["lambda"], b.checkpoint["lambda"]);
  EXPECT_EQ(a.expected_z, b.expected_z);
}

train::StudentOptions pedantic() {
  train::StudentOptions o;
  o.tf32 = false;
  return o;
}

// One GPU: ranks 0 and 1 on two students run on two threads, against one student computing both
// ranks' gradients in turn and summing them: the same trajectory bit for bit.
TEST(CudaTrainDataParallel, TwoStudentsOnOneGpuEqualOneServingBoth) {
  LY_REQUIRE_GPU();
  const test::GoldenModel m = test::load_golden_model("qwen2_untied_f16");
  cuda::GpuStudent a(m.config, m.weights, pedantic(), 256, 20), b(m.config, m.weights, pedantic(), 256, 20);
  const std::string base = test::temp_dir("cuda_train_dp_one");
  train::Student* const turn[] = {&a, &a};
  train::Student* const threads[] = {&a, &b};
  expect_same(train_ranks(m, turn, {}, base + "/turn"), train_ranks(m, threads, {}, base + "/threads"));
}

// Two GPUs, each rank's gradient on its own device, gathered over NCCL and summed in rank order,
// against one GPU serving both ranks (the host sum, same order): bit for bit.
TEST(CudaTrainDataParallel, TwoGpusEqualOneGpu) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_NCCL_BUILD("data-parallel training over 2 GPUs");
  if (device_count() < 2)
    GTEST_SKIP() << "data-parallel training over 2 GPUs: this machine has " << device_count()
                 << " GPU(s); the NCCL gradient sum was not checked (TwoStudentsOnOneGpuEqualOneServingBoth ran)";
  const test::GoldenModel m = test::load_golden_model("qwen2_untied_f16");
  const int one_gpu[] = {0, 0}, two_gpus[] = {0, 1};
  GpuStudentRanks single = make_gpu_student_ranks(m.config, m.weights, pedantic(), 256, 20, one_gpu, false);
  GpuStudentRanks dual = make_gpu_student_ranks(m.config, m.weights, pedantic(), 256, 20, two_gpus, false);
  ASSERT_EQ(single.students.size(), 1u);
  ASSERT_EQ(dual.students.size(), 2u);
  ASSERT_TRUE(bool(dual.reduce)) << "two devices: the NCCL reducer";
  ASSERT_FALSE(bool(single.reduce)) << "one device: the trainer's host sum";
  const std::string base = test::temp_dir("cuda_train_dp_two");
  expect_same(train_ranks(m, single.ranks, single.reduce, base + "/one"),
              train_ranks(m, dual.ranks, dual.reduce, base + "/two"));
  LY_CUDA_CHECK(cudaSetDevice(0));
}

}  // namespace
}  // namespace lychee

#else

TEST(CudaTrainDataParallel, NotBuilt) { LY_CUDA_NOT_BUILT("the GPU data-parallel trainer tests"); }

#endif  // LYCHEE_HAS_CUDA
