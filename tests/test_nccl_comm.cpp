// The NCCL wrapper (cuda/common/nccl_comm.h). At N = 1 (any GPU): out-of-place copies every
// element bit for bit into a buffer filled with NaNs, in place leaves the buffer as it was, a
// CUDA graph that captured the call runs it again on each replay (new input, new output), and
// the counters add what each call enqueued. At N = 2 (skipped, visibly, below 2 GPUs): every
// rank ends with the sum, exactly (small integers, exact in bf16), eagerly and from graphs.
// Without NCCL in the build the communicator is a kUnsupported error.
#include <gtest/gtest.h>

#include "gpu_test_util.h"

#ifdef LYCHEE_HAS_CUDA

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/common/nccl_comm.h"
#include "test_util.h"

namespace lychee {
namespace {

using cuda::NcclComm;
using cuda::ReduceType;
using test::expect_error;

// Skips (visibly; fails with LYCHEE_REQUIRE_GPU=1) when the build has no NCCL, after checking
// that asking is kUnsupported.
#define LY_REQUIRE_NCCL()                                                                       \
  if (!cuda::nccl_built())                                                                      \
    expect_error([] { NcclComm c({0}); }, ErrorCode::kUnsupported, "needs NCCL");               \
  LY_REQUIRE_NCCL_BUILD("the all-reduce test")

using test::device_count;

// Rank r's value at i: small integers, so any order of summing is exact in f32 and in bf16.
float value(int rank, size_t i) { return float(int((i * 7 + size_t(rank) * 13) % 61) - 30); }

std::vector<float> values(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return v;
}

// [n] of `type` on the device current at construction, from f32 values, and back.
struct TypedBuffer {
  ReduceType type;
  size_t n;
  cuda::DeviceBuffer<float> f32;
  cuda::DeviceBuffer<cuda::bf16> bf16;
  TypedBuffer(ReduceType t, const std::vector<float>& v)
      : type(t),
        n(v.size()),
        f32(t == ReduceType::kF32 ? test::to_device(v) : cuda::DeviceBuffer<float>()),
        bf16(t == ReduceType::kBf16 ? test::to_device_bf16(v) : cuda::DeviceBuffer<cuda::bf16>()) {}
  void* data() { return type == ReduceType::kF32 ? static_cast<void*>(f32.data()) : static_cast<void*>(bf16.data()); }
  size_t bytes() const { return n * cuda::reduce_type_bytes(type); }
  std::vector<float> host() { return type == ReduceType::kF32 ? test::to_host(f32) : test::to_host_bf16(bf16); }
  // New values at the same address (what a captured graph reads).
  void set(const std::vector<float>& v) {
    TypedBuffer t(type, v);
    LY_CUDA_CHECK(cudaMemcpy(data(), t.data(), bytes(), cudaMemcpyDeviceToDevice));
  }
  // cudaMemset may return before it has run, and it runs on the legacy stream, which a
  // non-blocking stream does not wait for: without the synchronisation the fill could land after
  // the collective's copy (the NaN seen once on the two-H200 machine).
  void fill_nan() {
    LY_CUDA_CHECK(cudaMemset(data(), 0xFF, bytes()));
    LY_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

void expect_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << what << ": first difference at element " << i << " of " << got.size();
}

TEST(NcclComm, ErrorsNameWhatIsWrong) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_NCCL();
  expect_error([] { NcclComm c({}); }, ErrorCode::kInvalidArgument, "no devices");
  expect_error([] { NcclComm c({0, 0}); }, ErrorCode::kInvalidArgument, "device 0 given twice");
  const int n = device_count();
  expect_error([n] { NcclComm c({n}); }, ErrorCode::kInvalidArgument, "device " + std::to_string(n) + " does not exist");
  NcclComm comm({0});
  const cudaStream_t s = nullptr;
  expect_error([&] { comm.all_reduce_sum_in_place(std::span<void* const>(), 4, ReduceType::kF32, {&s, 1}); },
               ErrorCode::kInvalidArgument, "over 1 ranks", "0 send buffers");
  void* null_buf = nullptr;
  expect_error([&] { comm.all_reduce_sum_in_place({&null_buf, 1}, 4, ReduceType::kF32, {&s, 1}); },
               ErrorCode::kInvalidArgument, "rank 0 has a null buffer");
}

TEST(NcclComm, OneRankCopiesInPlaceKeepsAndCounts) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_NCCL();
  std::printf("NCCL %s\n", cuda::nccl_version().c_str());
  EXPECT_FALSE(cuda::nccl_version().empty());
  NcclComm comm({0});
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.device(0), 0);
  cudaStream_t stream;
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint64_t payload = 0;
  for (ReduceType type : {ReduceType::kF32, ReduceType::kBf16})
    for (size_t n : {size_t(1), size_t(1177), size_t(1) << 20 | 3}) {
      const std::string what = std::string(type == ReduceType::kF32 ? "f32" : "bf16") + " n " + std::to_string(n);
      const std::vector<float> v = values(0, n);
      TypedBuffer send(type, v), recv(type, v);
      recv.fill_nan();
      const void* s = send.data();
      void* r = recv.data();
      comm.all_reduce_sum({&s, 1}, {&r, 1}, n, type, {&stream, 1});
      LY_CUDA_CHECK(cudaStreamSynchronize(stream));
      expect_equal(recv.host(), v, what + " out of place");
      void* b = send.data();
      comm.all_reduce_sum_in_place({&b, 1}, n, type, {&stream, 1});
      LY_CUDA_CHECK(cudaStreamSynchronize(stream));
      expect_equal(send.host(), v, what + " in place");
      payload += 2 * n * cuda::reduce_type_bytes(type);
    }
  EXPECT_EQ(comm.counters().calls, 12u);
  EXPECT_EQ(comm.counters().payload_bytes, payload);
  EXPECT_EQ(comm.counters().wire_bytes, 0.0);  // one rank sends nothing
  comm.reset_counters();
  EXPECT_EQ(comm.counters().calls, 0u);
  LY_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A graph captured once reruns the collective on each replay: new input in, new output out. The
// counters see the one call made while capturing, not the replays.
TEST(NcclComm, OneRankInACudaGraph) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_NCCL();
  NcclComm comm({0});
  cudaStream_t stream;
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t n = 4099;
  TypedBuffer send(ReduceType::kBf16, values(0, n)), recv(ReduceType::kBf16, values(0, n));
  const void* s = send.data();
  void* r = recv.data();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  comm.all_reduce_sum({&s, 1}, {&r, 1}, n, ReduceType::kBf16, {&stream, 1});
  LY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 1; replay <= 3; ++replay) {
    const std::vector<float> v = values(replay, n);
    send.set(v);
    recv.fill_nan();
    LY_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    LY_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_equal(recv.host(), v, "replay " + std::to_string(replay));
  }
  EXPECT_EQ(comm.counters().calls, 1u);
  LY_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LY_CUDA_CHECK(cudaGraphDestroy(graph));
  LY_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Two ranks on GPUs 0 and 1: both end with value(0, i) + value(1, i), f32 and bf16, in place,
// eagerly and from a pair of graphs captured together (one per GPU's stream).
TEST(NcclComm, TwoRanksSum) {
  LY_REQUIRE_GPU();
  LY_REQUIRE_NCCL();
  if (const int n_gpus = device_count(); n_gpus < 2)
    GTEST_SKIP() << "N = 2 needs 2 GPUs, this process sees " << n_gpus << ": the two-rank sum was not checked";
  NcclComm comm({0, 1});
  ASSERT_EQ(comm.size(), 2);
  const size_t n = (size_t(1) << 20) + 77;
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = value(0, i) + value(1, i);
  cudaStream_t streams[2];
  for (int r = 0; r < 2; ++r) {
    LY_CUDA_CHECK(cudaSetDevice(r));
    LY_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  for (ReduceType type : {ReduceType::kF32, ReduceType::kBf16})
    for (bool graph : {false, true}) {
      const std::string what = std::string(type == ReduceType::kF32 ? "f32" : "bf16") + (graph ? " graph" : " eager");
      std::vector<std::unique_ptr<TypedBuffer>> bufs;
      void* ptrs[2];
      for (int r = 0; r < 2; ++r) {
        LY_CUDA_CHECK(cudaSetDevice(r));
        bufs.push_back(std::make_unique<TypedBuffer>(type, values(r, n)));
        ptrs[r] = bufs.back()->data();
      }
      if (!graph) {
        comm.all_reduce_sum_in_place(ptrs, n, type, streams);
      } else {
        cudaGraph_t graphs[2];
        cudaGraphExec_t execs[2];
        // Relaxed, as the runner captures several GPUs (runner_impl.h: NCCL's group call failed
        // under a stricter mode on the two-H200 machine).
        for (int r = 0; r < 2; ++r) {
          LY_CUDA_CHECK(cudaSetDevice(r));
          LY_CUDA_CHECK(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeRelaxed));
        }
        comm.all_reduce_sum_in_place(ptrs, n, type, streams);
        for (int r = 0; r < 2; ++r) {
          LY_CUDA_CHECK(cudaSetDevice(r));
          LY_CUDA_CHECK(cudaStreamEndCapture(streams[r], &graphs[r]));
          LY_CUDA_CHECK(cudaGraphInstantiate(&execs[r], graphs[r], 0));
        }
        for (int r = 0; r < 2; ++r) {
          LY_CUDA_CHECK(cudaSetDevice(r));
          LY_CUDA_CHECK(cudaGraphLaunch(execs[r], streams[r]));
        }
        for (int r = 0; r < 2; ++r) {
          LY_CUDA_CHECK(cudaSetDevice(r));
          LY_CUDA_CHECK(cudaStreamSynchronize(streams[r]));
          LY_CUDA_CHECK(cudaGraphExecDestroy(execs[r]));
          LY_CUDA_CHECK(cudaGraphDestroy(graphs[r]));
        }
      }
      for (int r = 0; r < 2; ++r) {
        LY_CUDA_CHECK(cudaSetDevice(r));
        LY_CUDA_CHECK(cudaStreamSynchronize(streams[r]));
        expect_equal(bufs[size_t(r)]->host(), sum, what + " rank " + std::to_string(r));
      }
    }
  EXPECT_EQ(comm.counters().calls, 4u);
  EXPECT_DOUBLE_EQ(comm.counters().wire_bytes, double(comm.counters().payload_bytes));  // 2 (N-1)/N = 1 at N = 2
  for (int r = 0; r < 2; ++r) {
    LY_CUDA_CHECK(cudaSetDevice(r));
    LY_CUDA_CHECK(cudaStreamDestroy(streams[r]));
  }
  LY_CUDA_CHECK(cudaSetDevice(0));
}

}  // namespace
}  // namespace lychee

#else  // no CUDA in this build

TEST(NcclComm, NeedsTheCudaBuild) { LY_CUDA_NOT_BUILT("the NCCL all-reduce tests"); }

#endif
