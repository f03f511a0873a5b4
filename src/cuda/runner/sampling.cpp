// Choosing the next token on the device: argmax, or temperature / top-k / top-p sampling with
// Philox random numbers; only the chosen tokens cross to the host.
#include <algorithm>

#include "core/error.h"
#include "cuda/kernels/kernels.h"
#include "cuda/runner/runner_impl.h"

namespace lychee::cuda {

void GpuRunner::greedy(int batch, std::span<int32_t> out) {
  Impl& m = *impl_;
  argmax(m.logits.data(), m.sampled.data(), batch, m.c.vocab_size, m.stream);
  LY_CUDA_CHECK(cudaMemcpyAsync(m.tokens_h.data(), m.sampled.data(), size_t(batch) * 4, cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  std::copy_n(m.tokens_h.data(), std::min(out.size(), size_t(batch)), out.begin());
}

void GpuRunner::sample(int batch, float temperature, int top_k, float top_p, uint64_t seed, std::span<int32_t> out) {
  Impl& m = *impl_;
  if (temperature <= 0.0f) return greedy(batch, out);
  lychee::cuda::sample(m.logits.data(), m.sampled.data(), batch, m.c.vocab_size, temperature, top_k, top_p,
                       seed, m.rng_step.data(), m.stream);
  LY_CUDA_CHECK(cudaMemcpyAsync(m.tokens_h.data(), m.sampled.data(), size_t(batch) * 4, cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  std::copy_n(m.tokens_h.data(), std::min(out.size(), size_t(batch)), out.begin());
}

void GpuRunner::copy_logits(int row, std::span<float> out) {
  Impl& m = *impl_;
  LY_CHECK(row >= 0 && row < m.o.max_batch && out.size() == size_t(m.c.vocab_size), ErrorCode::kInvalidArgument,
           "copy_logits: bad row {} or size {}", row, out.size());
  LY_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.data() + size_t(row) * m.c.vocab_size, out.size() * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

}  // namespace lychee::cuda
