// How the KV cache holds keys and values (`--kv-cache-dtype`, vLLM's name for the option).
//
// kBf16 (the default): every K/V element as bf16 on the GPU (the CPU reference keeps f32).
// kFp8: every element as an FP8 e4m3 code (core/fp8.h) with one f32 scale per token and KV head,
// s = max|x| / 448 over that head's head_dim values (1 for an all-zero vector), x ~ s · e4m3(x / s):
// half the bytes of bf16 plus 4 bytes per token and head. A token's K/V are quantised once, when
// they are written (after RoPE for K), from the f32 values, so appending never rescales older
// tokens. The CPU reference stores scale · e4m3 values in its f32 cache (round_kv_through_e4m3),
// the values the GPU's codes stand for, so GPU-vs-CPU tests keep their meaning.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace lychee {

enum class KvCacheDtype { kBf16, kFp8 };

const char* kv_cache_dtype_name(KvCacheDtype d);  // "bf16", "fp8" (the option's values)
std::optional<KvCacheDtype> kv_cache_dtype_from_name(const std::string& name);

// Bytes one token's K or V of one KV head takes in the GPU pool (codes and scale).
int64_t kv_bytes_per_token_head(KvCacheDtype d, int head_dim);

// In place: each of `vectors` consecutive head_dim-long vectors (one token of one KV head)
// replaced by the values its FP8 codes stand for (scale per vector, as above).
void round_kv_through_e4m3(float* x, int64_t vectors, int head_dim);

}  // namespace lychee
