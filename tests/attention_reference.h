// The double-precision attention reference of the GPU attention tests (decode, prefill and the
// hybrid-head kernel): softmax(scale · q·kᵀ) · v over an explicit set of tokens of one sequence,
// its K/V read through the sequence's block table from a paged pool of bf16 values, the same
// bf16 inputs the kernels read, every product and sum in double. No CUDA types: bf16 values are
// their 16 bits (core/dtype.h), so the reference builds and runs anywhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"

namespace lychee::test {

// One sequence's keys and values in a paged KV pool: token t of KV head h is row t % page_size of
// page pages[t / page_size].
struct PagedSeqKv {
  const uint16_t* k_pool = nullptr;  // [n_pages][n_kv_heads][page_size][head_dim] bf16 bits
  const uint16_t* v_pool = nullptr;  // [n_pages][n_kv_heads][page_size][head_dim] bf16 bits
  const int32_t* pages = nullptr;    // [max_pages] the sequence's block table row
  int n_kv_heads = 0, page_size = 0, head_dim = 0;

  size_t row(int kv_head, int t) const {
    return ((size_t(pages[t / page_size]) * n_kv_heads + kv_head) * page_size + t % page_size) * head_dim;
  }
  double k(int kv_head, int t, int i) const { return bf16_to_f32(k_pool[row(kv_head, t) + i]); }
  double v(int kv_head, int t, int i) const { return bf16_to_f32(v_pool[row(kv_head, t) + i]); }
};

namespace detail {
// token_at(j) gives the j-th of n tokens read.
template <typename TokenAt>
std::vector<double> attend(const uint16_t* q, const PagedSeqKv& kv, int kv_head, size_t n, TokenAt token_at,
                           double scale) {
  const int d = kv.head_dim;
  std::vector<double> qd(size_t(d), 0.0), w(n), out(size_t(d), 0.0);
  for (int i = 0; i < d; ++i) qd[size_t(i)] = bf16_to_f32(q[i]);
  double mx = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    const uint16_t* k = kv.k_pool + kv.row(kv_head, token_at(j));
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += qd[size_t(i)] * double(bf16_to_f32(k[i]));
    w[j] = dot * scale;
    mx = std::max(mx, w[j]);
  }
  double sum = 0.0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  for (size_t j = 0; j < n; ++j) {
    const uint16_t* v = kv.v_pool + kv.row(kv_head, token_at(j));
    const double p = w[j] / sum;
    for (int i = 0; i < d; ++i) out[size_t(i)] += p * double(bf16_to_f32(v[i]));
  }
  return out;  // all zeros when no token is read
}
}  // namespace detail

// One query row q ([head_dim] bf16 bits) attending over `tokens` (each once, any order) of KV
// head kv_head: [head_dim] in double.
inline std::vector<double> paged_attention_reference(const uint16_t* q, const PagedSeqKv& kv, int kv_head,
                                                     std::span<const int32_t> tokens, double scale) {
  return detail::attend(q, kv, kv_head, tokens.size(), [&](size_t j) { return int(tokens[j]); }, scale);
}

// The same over the first n_tokens tokens 0 .. n_tokens - 1 (a whole sequence, or a causal row).
inline std::vector<double> paged_attention_reference(const uint16_t* q, const PagedSeqKv& kv, int kv_head,
                                                     int n_tokens, double scale) {
  return detail::attend(q, kv, kv_head, size_t(std::max(n_tokens, 0)), [](size_t j) { return int(j); }, scale);
}

}  // namespace lychee::test
