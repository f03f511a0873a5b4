// NCCL for tensor parallelism: one communicator per GPU, all owned by this process (one thread
// drives every GPU through group calls), and the in-place sum all-reduce that joins the partial
// outputs of the attention and MLP shards. No NCCL type crosses this header: NCCL is linked
// privately (cmake/CudaDependencies.cmake), and a build without it throws kUnsupported here.
//
// Bytes: an all-reduce of P bytes per rank over N ranks sends 2 (N - 1) / N x P per rank on a
// ring (reduce-scatter then all-gather; NCCL's "bus bandwidth" convention, nccl-tests' busbw),
// the figure docs/scaling.md sets against the link bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace lychee::cuda {

enum class ReduceType : uint8_t { kF32, kBf16 };

size_t reduce_type_bytes(ReduceType t);  // 4, 2

// Whether this build links NCCL.
bool nccl_built();
// NCCL's library version, e.g. "2.28.9" ("" without NCCL).
std::string nccl_version();

// Bytes one rank sends for an all-reduce of `payload_bytes` over n_ranks (ring): 2 (N-1)/N x P.
double all_reduce_wire_bytes(uint64_t payload_bytes, int n_ranks);

// What the calls made through one NcclComm enqueued. A CUDA graph that captured calls replays
// them without passing here: a runner that replays graphs counts per replay itself (the calls a
// step captures times their payload).
struct NcclCounters {
  uint64_t calls = 0;          // all-reduce calls (each over every rank)
  uint64_t payload_bytes = 0;  // per rank: sum of n x element size
  double wire_bytes = 0;       // per rank: sum of all_reduce_wire_bytes
};

class NcclComm {
 public:
  // One communicator per CUDA device of `devices` (rank r on devices[r]), made together by
  // ncclCommInitAll. Error(kUnsupported) in a build without NCCL; kInvalidArgument for an empty
  // or repeated list or a device that does not exist; kCuda with NCCL's message otherwise.
  explicit NcclComm(const std::vector<int>& devices);
  ~NcclComm();
  NcclComm(NcclComm&&) noexcept;
  NcclComm& operator=(NcclComm&&) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int size() const;
  int device(int rank) const;

  // recv[r][i] = sum over ranks r' of send[r'][i], for every rank r: send[r], recv[r] [n] of
  // `type` on device(r), enqueued on streams[r] (a stream of device(r)); send[r] == recv[r] is
  // in place. One ncclGroupStart/End from this thread; enqueues only, no host synchronisation.
  // Capturable: when every streams[r] is being captured (cudaStreamBeginCapture), the
  // collectives become nodes of those graphs and run on each replay. bf16 sums accumulate in the
  // order NCCL picks: equal to the f32 sum rounded once only for N <= 2.
  void all_reduce_sum(std::span<const void* const> send, std::span<void* const> recv, size_t n, ReduceType type,
                      std::span<const cudaStream_t> streams);
  void all_reduce_sum_in_place(std::span<void* const> bufs, size_t n, ReduceType type,
                               std::span<const cudaStream_t> streams);

  // recv[r] = send[0] | send[1] | ... | send[N-1] (n elements each, rank order), for every rank r:
  // send[r] [n], recv[r] [N n] on device(r), enqueued on streams[r]; capturable like the all-reduce.
  // Not counted in counters() (which count all-reduces).
  void all_gather(std::span<const void* const> send, std::span<void* const> recv, size_t n, ReduceType type,
                  std::span<const cudaStream_t> streams);

  const NcclCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  NcclCounters counters_;
};

}  // namespace lychee::cuda
