// Session::decode_batch, the server's step: one decode step of many sessions, each sampled (via
// `after`) right after its own step. On the CPU the sessions step one by one, so the batch gives
// exactly what each session gives fed alone; every argument is checked before any session steps.
// (The GPU's grouped launches: test_cuda_hybrid.cpp.)
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/error.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "runtime/session.h"
#include "test_util.h"

namespace lychee {
namespace {

struct TinyModel {
  Checkpoint ck = Checkpoint::open(test::golden_dir() + "/models/llama_tied_f32");
  cpu::Model model{ck.config(), HostWeights::load(ck)};
};

std::vector<int32_t> ids_of(int n, int vocab, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 17 + salt * 5 + 1) % vocab);
  return v;
}

TEST(DecodeBatch, EachSessionGetsWhatItGetsAloneAndIsSampledRightAfterItsStep) {
  TinyModel t;
  const int vocab = t.ck.config().vocab_size;
  std::vector<std::unique_ptr<CpuSession>> alone, batched;
  for (int i = 0; i < 3; ++i) {
    alone.push_back(std::make_unique<CpuSession>(t.model, 64));
    batched.push_back(std::make_unique<CpuSession>(t.model, 64));
  }
  std::vector<Session*> sessions;
  for (int i = 0; i < 3; ++i) {
    const auto prompt = ids_of(5 + 7 * i, vocab, i);
    alone[size_t(i)]->feed(prompt);
    batched[size_t(i)]->feed(prompt);
    sessions.push_back(batched[size_t(i)].get());
  }
  for (int step = 0; step < 4; ++step) {
    const std::vector<int32_t> tokens = {int32_t(step + 1), int32_t(step + 9), int32_t(step + 20)};
    std::vector<size_t> order;
    std::vector<std::vector<float>> seen(3);
    Session::decode_batch(sessions, tokens, [&](size_t i) {
      order.push_back(i);
      const auto l = sessions[i]->logits();
      seen[i].assign(l.begin(), l.end());
    });
    EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));
    for (size_t i = 0; i < 3; ++i) {
      const auto want = alone[i]->forward(std::span<const int32_t>(&tokens[i], 1));
      EXPECT_EQ(seen[i], std::vector<float>(want.begin(), want.end())) << "session " << i << " step " << step;
      EXPECT_EQ(batched[i]->length(), alone[i]->length());
    }
  }
}

TEST(DecodeBatch, RefusesBadArgumentsBeforeAnySessionSteps) {
  TinyModel t;
  CpuSession a(t.model, 8), b(t.model, 8), empty(t.model, 8), full(t.model, 4);
  const std::vector<int32_t> p = {1, 2, 3};
  a.feed(p);
  b.feed(p);
  full.feed(std::vector<int32_t>{1, 2, 3, 4});
  auto run = [&](std::vector<Session*> s, std::vector<int32_t> tok) {
    Session::decode_batch(s, tok, [](size_t) {});
  };
  test::expect_error([&] { run({&a, &b}, {1}); }, ErrorCode::kInvalidArgument, "2 sessions but 1 tokens");
  test::expect_error([&] { run({&a, &a}, {1, 2}); }, ErrorCode::kInvalidArgument, "sessions 0 and 1 are the same");
  test::expect_error([&] { run({&a, &empty}, {1, 2}); }, ErrorCode::kInvalidArgument, "session 1 is empty");
  test::expect_error([&] { run({&a, nullptr}, {1, 2}); }, ErrorCode::kInvalidArgument, "session 1 is null");
  test::expect_error([&] { run({&b, &full}, {1, 2}); }, ErrorCode::kCapacity, "session 1 holds 4 tokens");
  EXPECT_EQ(a.length(), 3);  // nothing stepped
  EXPECT_EQ(b.length(), 3);
  run({}, {});  // an empty batch is no step
}

}  // namespace
}  // namespace lychee
