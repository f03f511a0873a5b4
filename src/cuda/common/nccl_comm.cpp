#include "cuda/common/nccl_comm.h"

#include <algorithm>
#include <set>
#include <utility>

#include "core/error.h"
#include "cuda/common/common.h"

#ifdef LYCHEE_HAS_NCCL
#include <nccl.h>
#endif

namespace lychee::cuda {

size_t reduce_type_bytes(ReduceType t) { return t == ReduceType::kF32 ? 4 : 2; }

double all_reduce_wire_bytes(uint64_t payload_bytes, int n_ranks) {
  return n_ranks <= 1 ? 0.0 : 2.0 * double(n_ranks - 1) / double(n_ranks) * double(payload_bytes);
}

#ifdef LYCHEE_HAS_NCCL

namespace {

#define LY_NCCL_CHECK(expr)                                                                                   \
  do {                                                                                                        \
    const ncclResult_t ly_r_ = (expr);                                                                        \
    if (ly_r_ != ncclSuccess)                                                                                 \
      ::lychee::fail(::lychee::ErrorCode::kCuda, "{} failed: {} ({}) ({}:{})", #expr, ncclGetErrorString(ly_r_), \
                     ncclGetLastError(nullptr), __FILE__, __LINE__);                                          \
  } while (0)

ncclDataType_t nccl_type(ReduceType t) { return t == ReduceType::kF32 ? ncclFloat32 : ncclBfloat16; }

}  // namespace

struct NcclComm::Impl {
  std::vector<int> devices;         // [N] CUDA device of rank r
  std::vector<ncclComm_t> comms;    // [N]
  // Finalizing waits until every rank's communicator is quiescent, so one thread that owns all
  // the ranks finalizes them in one group call (one at a time, the first would wait forever for
  // the others); destroying a finalized communicator then only frees local state.
  ~Impl() {
    ncclGroupStart();
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommFinalize(c);
    ncclGroupEnd();
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommDestroy(c);
  }
};

bool nccl_built() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

NcclComm::NcclComm(const std::vector<int>& devices) : impl_(std::make_unique<Impl>()) {
  LY_CHECK(!devices.empty(), ErrorCode::kInvalidArgument, "NCCL communicator: no devices given");
  int n_devices = 0;
  LY_CUDA_CHECK(cudaGetDeviceCount(&n_devices));
  std::set<int> seen;
  for (int d : devices) {
    LY_CHECK(d >= 0 && d < n_devices, ErrorCode::kInvalidArgument,
             "NCCL communicator: device {} does not exist (this process sees {} CUDA devices)", d, n_devices);
    LY_CHECK(seen.insert(d).second, ErrorCode::kInvalidArgument, "NCCL communicator: device {} given twice", d);
  }
  impl_->devices = devices;
  impl_->comms.assign(devices.size(), nullptr);
  int current = 0;
  LY_CUDA_CHECK(cudaGetDevice(&current));
  LY_NCCL_CHECK(ncclCommInitAll(impl_->comms.data(), int(devices.size()), devices.data()));
  LY_CUDA_CHECK(cudaSetDevice(current));  // ncclCommInitAll may leave another device current
}

namespace {

// One collective over every rank in one group call: `call(r)` enqueues rank r's part. Checks the
// spans (one buffer pair and stream per rank, no null buffer) first; n == 0 enqueues nothing.
template <typename Call>
void group_call(const char* what, const std::vector<ncclComm_t>& comms, std::span<const void* const> send,
                std::span<void* const> recv, size_t n, std::span<const cudaStream_t> streams, Call&& call) {
  const size_t N = comms.size();
  LY_CHECK(send.size() == N && recv.size() == N && streams.size() == N, ErrorCode::kInvalidArgument,
           "NCCL {} over {} ranks: got {} send buffers, {} receive buffers, {} streams", what, N, send.size(),
           recv.size(), streams.size());
  for (size_t r = 0; r < N; ++r)
    LY_CHECK(n == 0 || (send[r] != nullptr && recv[r] != nullptr), ErrorCode::kInvalidArgument,
             "NCCL {}: rank {} has a null buffer", what, r);
  if (n == 0) return;
  LY_NCCL_CHECK(ncclGroupStart());
  for (size_t r = 0; r < N; ++r) {
    const ncclResult_t res = call(r);
    if (res != ncclSuccess) {
      ncclGroupEnd();  // close the group before reporting
      fail(ErrorCode::kCuda, "NCCL {} (rank {}, {} elements) failed: {} ({})", what, r, n, ncclGetErrorString(res),
           ncclGetLastError(comms[r]));
    }
  }
  LY_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace

void NcclComm::all_reduce_sum(std::span<const void* const> send, std::span<void* const> recv, size_t n,
                              ReduceType type, std::span<const cudaStream_t> streams) {
  const std::vector<ncclComm_t>& comms = impl_->comms;
  group_call("all-reduce", comms, send, recv, n, streams, [&](size_t r) {
    return ncclAllReduce(send[r], recv[r], n, nccl_type(type), ncclSum, comms[r], streams[r]);
  });
  if (n == 0) return;
  const uint64_t payload = uint64_t(n) * reduce_type_bytes(type);
  counters_.calls += 1;
  counters_.payload_bytes += payload;
  counters_.wire_bytes += all_reduce_wire_bytes(payload, int(comms.size()));
}

void NcclComm::all_gather(std::span<const void* const> send, std::span<void* const> recv, size_t n, ReduceType type,
                          std::span<const cudaStream_t> streams) {
  const std::vector<ncclComm_t>& comms = impl_->comms;
  group_call("all-gather", comms, send, recv, n, streams, [&](size_t r) {
    return ncclAllGather(send[r], recv[r], n, nccl_type(type), comms[r], streams[r]);
  });
}

#else  // no NCCL in this build

struct NcclComm::Impl {
  std::vector<int> devices;
};

bool nccl_built() { return false; }
std::string nccl_version() { return ""; }

NcclComm::NcclComm(const std::vector<int>& devices) {
  fail(ErrorCode::kUnsupported,
       "tensor parallelism over {} GPUs needs NCCL, which this build does not link (install NCCL or set NCCL_ROOT, "
       "then reconfigure with LYCHEE_NCCL=AUTO or ON)",
       devices.size());
}

void NcclComm::all_reduce_sum(std::span<const void* const>, std::span<void* const>, size_t, ReduceType,
                              std::span<const cudaStream_t>) {
  fail(ErrorCode::kUnsupported, "NCCL all-reduce: this build does not link NCCL");
}

void NcclComm::all_gather(std::span<const void* const>, std::span<void* const>, size_t, ReduceType,
                          std::span<const cudaStream_t>) {
  fail(ErrorCode::kUnsupported, "NCCL all-gather: this build does not link NCCL");
}

#endif  // LYCHEE_HAS_NCCL

NcclComm::~NcclComm() = default;
NcclComm::NcclComm(NcclComm&&) noexcept = default;
NcclComm& NcclComm::operator=(NcclComm&&) noexcept = default;

int NcclComm::size() const { return int(impl_->devices.size()); }
int NcclComm::device(int rank) const { return impl_->devices.at(size_t(rank)); }

void NcclComm::all_reduce_sum_in_place(std::span<void* const> bufs, size_t n, ReduceType type,
                                       std::span<const cudaStream_t> streams) {
  const std::vector<const void*> send(bufs.begin(), bufs.end());
  all_reduce_sum(send, bufs, n, type, streams);
}

}  // namespace lychee::cuda
