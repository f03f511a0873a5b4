// Data-parallel head-role training on the GPUs of one host (backend.h, make_gpu_student_ranks):
// one GpuStudent per distinct device, built in parallel from the one host copy of the weights,
// and the gate-gradient reducer: every rank's gradient all-gathered over NCCL
// (cuda/common/nccl_comm.h), then summed in rank order, the host sum's order: an all-reduce whose
// result does not depend on the number of GPUs.
#include <algorithm>
#include <future>
#include <memory>

#include "core/error.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/nccl_comm.h"
#include "cuda/train/student.h"
#include "runtime/cuda_backend.h"

namespace lychee {

namespace {

// The reducer's state: per distinct device a send block (its ranks' gradients, in rank order,
// padded to the most ranks any device has) and a receive buffer of every device's block, f64
// carried as pairs of f32 words (the gather copies bits), and a stream.
class NcclGateGradients {
 public:
  NcclGateGradients(const std::vector<int>& devices, std::vector<int> rank_slot)
      : comm_(devices), devices_(devices), rank_slot_(std::move(rank_slot)) {
    std::vector<int> per_device(devices_.size(), 0);
    for (int s : rank_slot_) rank_index_.push_back(per_device[size_t(s)]++);
    block_ranks_ = *std::max_element(per_device.begin(), per_device.end());
    for (int dev : devices_) {
      LY_CUDA_CHECK(cudaSetDevice(dev));
      cudaStream_t s = nullptr;
      LY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
    }
  }
  ~NcclGateGradients() {
    for (size_t i = 0; i < streams_.size(); ++i) {
      cudaSetDevice(devices_[i]);
      cudaStreamDestroy(streams_[i]);
    }
  }
  NcclGateGradients(const NcclGateGradients&) = delete;
  NcclGateGradients& operator=(const NcclGateGradients&) = delete;

  // grads[r] [n_params]: gathered over NCCL, then every one becomes the sum in rank order (the
  // host sum's order, so equal to it bit for bit for any number of ranks).
  void reduce(std::span<std::vector<double>> grads) {
    LY_CHECK(grads.size() == rank_slot_.size(), ErrorCode::kInvalidArgument,
             "data parallel: {} gradients for {} ranks", grads.size(), rank_slot_.size());
    const size_t n = grads[0].size(), n_dev = devices_.size(), block = size_t(block_ranks_) * n;
    if (send_.empty() || send_[0].size() != block) {
      send_.clear();
      recv_.clear();
      for (int dev : devices_) {
        LY_CUDA_CHECK(cudaSetDevice(dev));
        send_.emplace_back(block);
        recv_.emplace_back(block * n_dev);
      }
    }
    std::vector<double> host(block * n_dev, 0.0);
    for (size_t r = 0; r < grads.size(); ++r) {
      LY_CHECK(grads[r].size() == n, ErrorCode::kInvalidArgument, "data parallel: rank {} has {} values, rank 0 {}",
               r, grads[r].size(), n);
      std::copy(grads[r].begin(), grads[r].end(),
                host.begin() + ptrdiff_t((size_t(rank_slot_[r]) * block_ranks_ + size_t(rank_index_[r])) * n));
    }
    std::vector<const void*> send_ptrs;
    std::vector<void*> recv_ptrs;
    for (size_t k = 0; k < n_dev; ++k) {
      LY_CUDA_CHECK(cudaSetDevice(devices_[k]));
      LY_CUDA_CHECK(cudaMemcpyAsync(send_[k].data(), host.data() + k * block, block * sizeof(double),
                                    cudaMemcpyHostToDevice, streams_[k]));
      send_ptrs.push_back(send_[k].data());
      recv_ptrs.push_back(recv_[k].data());
    }
    comm_.all_gather(send_ptrs, recv_ptrs, 2 * block, cuda::ReduceType::kF32, streams_);
    LY_CUDA_CHECK(cudaSetDevice(devices_[0]));
    LY_CUDA_CHECK(cudaMemcpyAsync(host.data(), recv_[0].data(), host.size() * sizeof(double),
                                  cudaMemcpyDeviceToHost, streams_[0]));
    for (size_t k = 0; k < n_dev; ++k) {
      LY_CUDA_CHECK(cudaSetDevice(devices_[k]));
      LY_CUDA_CHECK(cudaStreamSynchronize(streams_[k]));
    }
    std::vector<double> sum(n, 0.0);
    for (size_t r = 0; r < grads.size(); ++r) {  // rank order, as host_gradient_sum
      const double* g = host.data() + (size_t(rank_slot_[r]) * block_ranks_ + size_t(rank_index_[r])) * n;
      for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
    }
    for (std::vector<double>& g : grads) g = sum;
  }

 private:
  cuda::NcclComm comm_;
  std::vector<int> devices_;
  std::vector<int> rank_slot_;   // [n_ranks] index into devices_
  std::vector<int> rank_index_;  // [n_ranks] position among its device's ranks
  int block_ranks_ = 1;
  std::vector<cudaStream_t> streams_;
  std::vector<cuda::DeviceBuffer<double>> send_, recv_;
};

}  // namespace

GpuStudentRanks make_cuda_student_ranks(const ModelConfig& c, const HostWeights& w,
                                        const train::StudentOptions& options, int max_context, int max_targets,
                                        std::span<const int> rank_devices, bool prefill_bf16,
                                        bool teacher_bf16) {
  LY_CHECK(!rank_devices.empty(), ErrorCode::kInvalidArgument, "--gpus: no device");
  int n_devices = 0;
  LY_CUDA_CHECK(cudaGetDeviceCount(&n_devices));
  std::vector<int> devices, slot;
  for (size_t r = 0; r < rank_devices.size(); ++r) {
    const int dev = rank_devices[r];
    LY_CHECK(dev >= 0 && dev < n_devices, ErrorCode::kInvalidArgument,
             "--gpus: rank {} is on device {}, but this machine has {} CUDA device(s)", r, dev, n_devices);
    const auto it = std::find(devices.begin(), devices.end(), dev);
    slot.push_back(int(it - devices.begin()));
    if (it == devices.end()) devices.push_back(dev);
  }
  cuda::GpuStudentTuning tuning;
  tuning.prefill_bf16 = tuning.prefill_cudnn = prefill_bf16;  // bf16 products and cuDNN's attention
  tuning.teacher_cudnn = teacher_bf16;
  // The uploads of the devices overlap (each reads the same host weights).
  std::vector<std::future<std::unique_ptr<train::Student>>> built;
  for (int dev : devices)
    built.push_back(std::async(std::launch::async, [&, dev]() -> std::unique_ptr<train::Student> {
      LY_CUDA_CHECK(cudaSetDevice(dev));
      return std::make_unique<cuda::GpuStudent>(c, w, options, max_context, max_targets, tuning);
    }));
  GpuStudentRanks out;
  std::exception_ptr first;
  for (auto& f : built) {
    try {
      out.students.push_back(f.get());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  for (int s : slot) out.ranks.push_back(out.students[size_t(s)].get());
  if (devices.size() > 1) {
    auto nccl = std::make_shared<NcclGateGradients>(devices, slot);
    out.reduce = [nccl](std::span<std::vector<double>> grads) { nccl->reduce(grads); };
  }  // one device: the trainer's host sum
  return out;
}

}  // namespace lychee
