// Choosing the next token on the device: argmax, or temperature / top-k / top-p sampling with
// Philox random numbers; only the chosen tokens cross to the host. Under tensor parallelism the
// logits and the sampling are rank 0's (the next decode step copies the tokens to the others).
#include <algorithm>

#include "core/error.h"
#include "cuda/kernels/kernels.h"
#include "cuda/runner/runner_impl.h"

namespace lychee::cuda {

void GpuRunner::greedy(int batch, std::span<int32_t> out) { wait_tokens(greedy_async(batch), out); }

void GpuRunner::sample(int batch, float temperature, int top_k, float top_p, uint64_t seed, uint64_t counter,
                       std::span<int32_t> out) {
  wait_tokens(sample_async(batch, temperature, top_k, top_p, seed, counter), out);
}

Ticket GpuRunner::greedy_async(int batch) {
  Shard& m = impl_->lead();
  m.use();
  LY_CHECK(batch >= 1 && batch <= m.o.max_batch, ErrorCode::kInvalidArgument, "greedy: batch {} (1..{})", batch,
           m.o.max_batch);
  argmax(m.logits.data(), m.sampled.data(), batch, m.c.vocab_size, m.stream);
  return m.tokens_ring.push(m.sampled.data(), batch, m.stream);
}

Ticket GpuRunner::sample_async(int batch, float temperature, int top_k, float top_p, uint64_t seed,
                               uint64_t counter) {
  Shard& m = impl_->lead();
  m.use();
  if (temperature <= 0.0f) return greedy_async(batch);
  LY_CHECK(batch >= 1 && batch <= m.o.max_batch, ErrorCode::kInvalidArgument, "sample: batch {} (1..{})", batch,
           m.o.max_batch);
  lychee::cuda::sample(m.logits.data(), m.sampled.data(), batch, m.c.vocab_size, temperature, top_k, top_p,
                       seed, counter, m.stream);
  return m.tokens_ring.push(m.sampled.data(), batch, m.stream);
}

Ticket GpuRunner::greedy_row_async(int row) {
  Shard& m = impl_->lead();
  m.use();
  LY_CHECK(row >= 0 && row < m.o.max_batch, ErrorCode::kInvalidArgument, "greedy: row {} (0..{})", row,
           m.o.max_batch - 1);
  argmax(m.logits.data() + size_t(row) * m.c.vocab_size, m.sampled.data() + row, 1, m.c.vocab_size, m.stream);
  return m.tokens_ring.push(m.sampled.data() + row, 1, m.stream);
}

Ticket GpuRunner::sample_row_async(int row, float temperature, int top_k, float top_p, uint64_t seed,
                                   uint64_t counter) {
  Shard& m = impl_->lead();
  m.use();
  if (temperature <= 0.0f) return greedy_row_async(row);
  LY_CHECK(row >= 0 && row < m.o.max_batch, ErrorCode::kInvalidArgument, "sample: row {} (0..{})", row,
           m.o.max_batch - 1);
  lychee::cuda::sample(m.logits.data() + size_t(row) * m.c.vocab_size, m.sampled.data() + row, 1, m.c.vocab_size,
                       temperature, top_k, top_p, seed, counter, m.stream);
  return m.tokens_ring.push(m.sampled.data() + row, 1, m.stream);
}

void GpuRunner::wait_tokens(const Ticket& t, std::span<int32_t> out) {
  const std::span<const int32_t> got = impl_->lead().tokens_ring.read(t);
  std::copy_n(got.begin(), std::min(out.size(), got.size()), out.begin());
}

void GpuRunner::copy_logits(int row, std::span<float> out) {
  Shard& m = impl_->lead();
  m.use();
  LY_CHECK(row >= 0 && row < logit_rows(m.o) && out.size() == size_t(m.c.vocab_size), ErrorCode::kInvalidArgument,
           "copy_logits: bad row {} or size {}", row, out.size());
  LY_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.data() + size_t(row) * m.c.vocab_size, out.size() * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

}  // namespace lychee::cuda
