// The CPU reference transformer: prefill and incremental decode over a KvCache, fp32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attention/policy.h"
#include "cpu/kv_cache.h"
#include "cpu/weight_linear.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace lychee::cpu {

class Model {
 public:
  // Weights held in f32 (the reference) or with WeightFormat::kNative: quantised matrices in
  // their blocks. A native model multiplies them through the integer dot products of the ISA this
  // CPU has for decode steps and chunks of fewer than min_gemm_rows() rows, and through sgemm on
  // tiles dequantised on the fly for longer chunks (cpu::choose_product). Dense attention goes
  // through attend_rows (decode_attention.h) instead of BLAS. With set_min_gemm_rows(kNoGemm)
  // it is chunk-invariant: a prompt row computes what it computes as a decode step, bit for bit.
  Model(const ModelConfig& config, HostWeights weights);

  const ModelConfig& config() const { return config_; }
  const HostWeights& weights() const { return weights_; }
  // The kernels used for quantised weights (detected_quant_isa() by default; tests pick kScalar).
  QuantIsa quant_isa() const { return isa_; }
  void set_quant_isa(QuantIsa isa) { isa_ = isa; }
  // Chunks of at least this many rows multiply quantised matrices through dequantised sgemm
  // (cpu::choose_product): kDefaultGemmRows, or LYCHEE_CPU_GEMM_ROWS when set (0 = kNoGemm).
  int64_t min_gemm_rows() const { return min_gemm_rows_; }
  void set_min_gemm_rows(int64_t rows) { min_gemm_rows_ = rows; }

  // Runs `tokens` at positions kv.length() .. kv.length() + n - 1 and appends their K/V.
  // logits: [n_out, vocab] f32 for the last token (n_out = 1) or every token (all_logits).
  // A single-token call after a prefix (a decode step) asks `policy` what each head reads;
  // prefill and calls without a policy attend densely. Decode steps add what they read to
  // `stats` when given.
  void forward(std::span<const int32_t> tokens, KvCache& kv, std::vector<float>& logits,
               bool all_logits = false, AttentionPolicy* policy = nullptr,
               KvReadStats* stats = nullptr);

 private:
  struct Scratch {
    std::vector<float> x, h, q, k, v, att, o, gate, up;
    std::vector<int32_t> pos;
    std::vector<HeadRead> reads;
    LinearScratch lin;
    std::vector<LinearOut> group;  // linear_group's products
  };
  // y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias).
  void linear(const float* x, WeightId id, WeightId bias, int layer, float* y, int n);
  // Products of the same x: one parallel region for a native model whose weights are all
  // quantised (cpu::linear_group), else one linear() each. {weight, bias, output}.
  struct Product {
    WeightId id, bias;
    float* y;
  };
  void linear_group(const float* x, std::initializer_list<Product> products, int layer, int n);
  LinearProduct product(int n) const { return choose_product(n, min_gemm_rows_); }
  void attention_block(int layer, int n, KvCache& kv, AttentionPolicy* policy, KvReadStats* stats);
  void mlp_block(int layer, int n);
  void decode_attention(int layer, KvCache& kv, AttentionPolicy* policy, KvReadStats* stats);

  ModelConfig config_;
  HostWeights weights_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  QuantIsa isa_ = detected_quant_isa();
  int64_t min_gemm_rows_;
  Scratch s_;
};

}  // namespace lychee::cpu
