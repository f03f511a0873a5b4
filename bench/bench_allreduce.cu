// The all-reduce tensor parallelism runs (cuda/common/nccl_comm.h): in-place bf16 sums over the
// GPUs of this host, as a decode step issues them (64 per step on the 8B shape: d_model bf16 per
// token), timed inside a captured CUDA graph (how the runner replays a step) and eagerly.
//   bench_allreduce [--gpus 2] [--sizes 8192,32768,65536,1048576,16777216] [--calls 64] [--json FILE]
// sizes in bytes per rank. Per size: time per all-reduce, and the bus bandwidth 2 (N-1)/N x bytes
// / time (nccl-tests' busbw), the figure docs/scaling.md sets against NVLink.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_env.h"
#include "core/json_io.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/nccl_comm.h"

namespace {

using namespace lychee;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  int n_gpus = 2, calls = 64;
  std::string sizes = "8192,32768,65536,1048576,16777216", json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--gpus") n_gpus = std::stoi(next());
    else if (a == "--sizes") sizes = next();
    else if (a == "--calls") calls = std::stoi(next());
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "bench_allreduce: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  int have = 0;
  LY_CUDA_CHECK(cudaGetDeviceCount(&have));
  if (have < n_gpus) {
    std::fprintf(stderr, "bench_allreduce: %d GPUs asked, this machine has %d\n", n_gpus, have);
    return 1;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed (logs of runs that time out)
  std::vector<int> devices;
  for (int g = 0; g < n_gpus; ++g) devices.push_back(g);
  cuda::NcclComm comm(devices);
  std::vector<cudaStream_t> streams(static_cast<size_t>(n_gpus), nullptr);
  for (int g = 0; g < n_gpus; ++g) {
    LY_CUDA_CHECK(cudaSetDevice(g));
    LY_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[size_t(g)], cudaStreamNonBlocking));
  }
  auto sync_all = [&] {
    for (int g = 0; g < n_gpus; ++g) {
      LY_CUDA_CHECK(cudaSetDevice(g));
      LY_CUDA_CHECK(cudaStreamSynchronize(streams[size_t(g)]));
    }
  };
  std::printf("NCCL %s, %d GPUs (%s); %d all-reduces per timing\n", cuda::nccl_version().c_str(), n_gpus,
              cuda::device_info().name, calls);
  std::printf("%12s %14s %14s %14s\n", "bytes/rank", "graph us/call", "eager us/call", "busbw GB/s");
  nlohmann::json rows = nlohmann::json::array();
  for (const long long bytes : bench::parse_numbers(sizes)) {
    const size_t n = size_t(bytes) / 2;
    std::vector<cuda::DeviceBuffer<cuda::bf16>> bufs;
    std::vector<void*> ptrs;
    for (int g = 0; g < n_gpus; ++g) {
      LY_CUDA_CHECK(cudaSetDevice(g));
      bufs.emplace_back(n);
      LY_CUDA_CHECK(cudaMemset(bufs.back().data(), 0, n * 2));
      ptrs.push_back(bufs.back().data());
    }
    auto issue = [&] {
      for (int c = 0; c < calls; ++c) comm.all_reduce_sum_in_place(ptrs, n, cuda::ReduceType::kBf16, streams);
    };
    issue();  // warm-up (connections, buffers)
    sync_all();
    auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 5; ++rep) issue();
    sync_all();
    const double eager_us = ms_since(t0) * 1e3 / (5.0 * calls);
    std::printf("%12lld %14s %14.2f   (eager done; capturing)\n", bytes, "", eager_us);
    std::vector<cudaGraphExec_t> execs(static_cast<size_t>(n_gpus), nullptr);
    for (int g = 0; g < n_gpus; ++g) {  // relaxed, as the runner's multi-GPU capture (runner_impl.h)
      LY_CUDA_CHECK(cudaSetDevice(g));
      LY_CUDA_CHECK(cudaStreamBeginCapture(streams[size_t(g)], cudaStreamCaptureModeRelaxed));
    }
    issue();
    for (int g = 0; g < n_gpus; ++g) {
      cudaGraph_t graph = nullptr;
      LY_CUDA_CHECK(cudaSetDevice(g));
      LY_CUDA_CHECK(cudaStreamEndCapture(streams[size_t(g)], &graph));
      LY_CUDA_CHECK(cudaGraphInstantiate(&execs[size_t(g)], graph, 0));
      cudaGraphDestroy(graph);
    }
    auto replay = [&] {
      for (int g = 0; g < n_gpus; ++g) {
        LY_CUDA_CHECK(cudaSetDevice(g));
        LY_CUDA_CHECK(cudaGraphLaunch(execs[size_t(g)], streams[size_t(g)]));
      }
    };
    replay();
    sync_all();
    t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 10; ++rep) replay();
    sync_all();
    const double graph_us = ms_since(t0) * 1e3 / (10.0 * calls);
    for (int g = 0; g < n_gpus; ++g) {
      LY_CUDA_CHECK(cudaSetDevice(g));
      cudaGraphExecDestroy(execs[size_t(g)]);
    }
    const double busbw = cuda::all_reduce_wire_bytes(uint64_t(bytes), n_gpus) / (graph_us * 1e-6) / 1e9;
    std::printf("%12lld %14.2f %14.2f %14.1f\n", bytes, graph_us, eager_us, busbw);
    rows.push_back({{"bytes_per_rank", bytes}, {"graph_us_per_call", graph_us}, {"eager_us_per_call", eager_us},
                    {"busbw_gbps", busbw}});
  }
  if (!json_path.empty()) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    nlohmann::json j = {{"gpu", cuda::device_info().name}, {"driver", bench::driver_string()}, {"command", command},
                        {"commit", std::getenv("LYCHEE_COMMIT") ? std::getenv("LYCHEE_COMMIT") : "unknown"}};
    j["nccl"] = cuda::nccl_version();
    j["gpus"] = n_gpus;
    j["calls"] = calls;
    j["rows"] = rows;
    write_json_file(json_path, j);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_allreduce: error: %s\n", e.what());
  return 1;
}
