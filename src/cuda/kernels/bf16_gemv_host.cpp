// The checked entry point of the bf16 matrix-vector kernel (bf16_gemv.h): host code, because its
// errors are formatted by fmt (core/error.h), which nvcc does not compile.
#include <cstdint>

#include "core/error.h"
#include "cuda/kernels/bf16_gemv.h"

namespace lychee::cuda {

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

void check_bf16_gemv_args(const Bf16GemvArgs& a) {
  LY_CHECK(a.n >= 1, ErrorCode::kInvalidArgument, "bf16_gemv: n = {} rows of x; expected at least 1", a.n);
  LY_CHECK(a.n <= kBf16GemvMaxRows, ErrorCode::kUnsupported,
           "bf16_gemv: n = {} rows of x; the kernel takes 1 to {} (decode batches)", a.n, kBf16GemvMaxRows);
  LY_CHECK(a.k >= 1 && a.m >= 1, ErrorCode::kInvalidArgument, "bf16_gemv: k = {}, m = {}; expected both >= 1", a.k,
           a.m);
  const bool fp8 = a.w8 != nullptr;
  LY_CHECK(a.k % (fp8 ? 16 : 8) == 0, ErrorCode::kUnsupported,
           "bf16_gemv: k = {} is not a multiple of {} (the {} weight rows must be 16-byte aligned)", a.k, fp8 ? 16 : 8,
           fp8 ? "e4m3" : "bf16");
  LY_CHECK(a.x != nullptr && (a.w != nullptr || fp8) && a.y != nullptr, ErrorCode::kInvalidArgument,
           "bf16_gemv: null pointer (x {}, w {}, y {})", static_cast<const void*>(a.x), static_cast<const void*>(a.w), a.y);
  LY_CHECK(a.w == nullptr || !fp8, ErrorCode::kInvalidArgument,
           "bf16_gemv: both w ({}) and w8 ({}) given; the weights are one or the other",
           static_cast<const void*>(a.w), static_cast<const void*>(a.w8));
  LY_CHECK(fp8 == (a.w_scale != nullptr), ErrorCode::kInvalidArgument,
           "bf16_gemv: w_scale ({}) goes with the FP8 codes w8 ({}): both or neither",
           static_cast<const void*>(a.w_scale), static_cast<const void*>(a.w8));
  LY_CHECK(!fp8 || a.x_lo == nullptr, ErrorCode::kInvalidArgument,
           "bf16_gemv: x_lo with FP8 weights (w8): the FP8 products take the norm's input rounded once, no residues");
  const void* w = fp8 ? static_cast<const void*>(a.w8) : static_cast<const void*>(a.w);
  LY_CHECK(aligned16(a.x) && aligned16(w), ErrorCode::kInvalidArgument,
           "bf16_gemv: x ({}) and {} ({}) must be 16-byte aligned", static_cast<const void*>(a.x), fp8 ? "w8" : "w", w);
  LY_CHECK(a.ss == nullptr || a.ss_count >= 1, ErrorCode::kInvalidArgument,
           "bf16_gemv: ss_count = {} partial sums of squares per row; expected at least 1", a.ss_count);
  LY_CHECK(a.ss != nullptr || a.eps == 0.0f, ErrorCode::kInvalidArgument,
           "bf16_gemv: eps = {} without sums of squares (a norm was meant: pass ss)", a.eps);
  LY_CHECK(a.x_lo == nullptr || (a.ss != nullptr && aligned16(a.x_lo)), ErrorCode::kInvalidArgument,
           "bf16_gemv: x_lo ({}) is the norm's input residues: it needs ss and 16-byte alignment",
           static_cast<const void*>(a.x_lo));
  LY_CHECK(a.xn_lo == nullptr || a.next_norm != nullptr, ErrorCode::kInvalidArgument,
           "bf16_gemv: xn_lo without next_norm");
  LY_CHECK(a.next_norm == nullptr || (a.out == GemvOut::kAddF32 && a.xn != nullptr && a.ss_out != nullptr),
           ErrorCode::kInvalidArgument,
           "bf16_gemv: next_norm needs the residual-add output (kAddF32) and both xn and ss_out");
  LY_CHECK(a.out != GemvOut::kSwiGlu || a.m % 2 == 0, ErrorCode::kInvalidArgument,
           "bf16_gemv: SwiGLU output over m = {} rows; expected an even count (gate rows, then up rows)", a.m);
  if (a.out == GemvOut::kQkvRope) {
    const Bf16GemvRope& r = a.rope;
    LY_CHECK(r.head_dim >= 16 && r.head_dim % 16 == 0, ErrorCode::kInvalidArgument,
             "bf16_gemv: QKV + RoPE output with head_dim = {}; expected a positive multiple of 16", r.head_dim);
    LY_CHECK(r.n_heads >= 1 && r.n_kv_heads >= 1 &&
                 int64_t(a.m) == int64_t(r.n_heads + 2 * r.n_kv_heads) * int64_t(r.head_dim),
             ErrorCode::kInvalidArgument,
             "bf16_gemv: QKV + RoPE output over m = {} rows; expected (n_heads {} + 2 x n_kv_heads {}) x head_dim {}",
             a.m, r.n_heads, r.n_kv_heads, r.head_dim);
    LY_CHECK(r.positions != nullptr && r.kv_page != nullptr && r.kv_row != nullptr && r.inv_freq != nullptr &&
                 r.k_pool != nullptr && r.v_pool != nullptr && r.page_size >= 1,
             ErrorCode::kInvalidArgument,
             "bf16_gemv: QKV + RoPE output needs positions, kv_page, kv_row, inv_freq, k_pool, v_pool and a "
             "page_size >= 1 (page_size = {})",
             r.page_size);
  }
  LY_CHECK(a.stages == -1 || a.stages == 0 || a.stages == 2, ErrorCode::kInvalidArgument,
           "bf16_gemv: stages = {} (-1 for the automatic choice, 0 or 2)", a.stages);
  LY_CHECK(a.swiglu_outputs == -1 || a.swiglu_outputs == 8 || a.swiglu_outputs == 16, ErrorCode::kInvalidArgument,
           "bf16_gemv: swiglu_outputs = {} (-1 for the automatic choice, 8 or 16 outputs per block)",
           a.swiglu_outputs);
  LY_CHECK(a.pdl >= -1 && a.pdl <= 1, ErrorCode::kInvalidArgument,
           "bf16_gemv: pdl = {} (-1 by size, 0 plain, 1 programmatic dependent launch)", a.pdl);
}

bool bf16_gemv_weights_fit(const void* w, int k, bool fp8) {
  const int unit = fp8 ? 16 : 8;
  return k >= unit && k % unit == 0 && w != nullptr && aligned16(w);
}

bool bf16_gemv_fits(const void* x, const void* w, int n, int k, bool fp8) {
  return n >= 1 && n <= kBf16GemvMaxRows && x != nullptr && aligned16(x) && bf16_gemv_weights_fit(w, k, fp8);
}

void bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream) {
  check_bf16_gemv_args(a);
  detail::launch_bf16_gemv(a, stream);
}

}  // namespace lychee::cuda
