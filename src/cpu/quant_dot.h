// Dot products of GGUF block-quantised weight rows with an activation row quantised to int8,
// for the CPU's native-weight path (WeightFormat::kNative). The weights stay in their file blocks
// (layouts in core/dtype.cpp); the activation row is quantised once per product into Q8Block
// blocks of 32, so every block's inner product is an exact integer and only the scales are f32.
// Each kernel computes  Σ_i dequant(w)[i] · a.d · a.q[i]  (the f32 reference dot against the
// dequantised weights and the dequantised activation), up to f32 rounding of the scale products.
//
// Two implementations of every type: portable scalar C++ (quant_dot.cpp) and AVX2 + FMA + F16C
// (quant_dot_avx2.cpp, compiled with those flags and called only when the CPU has them). The
// tests check both against dequantise-then-dot and against each other.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "cpu/q8_block.h"

namespace lychee::cpu {

// x: [n] f32, n a multiple of 32 -> out: [n / 32]. With AVX2 where the CPU has it; the same
// blocks as quantize_row_q8_scalar bit for bit.
void quantize_row_q8(const float* x, int64_t n, Q8Block* out);
void quantize_row_q8_scalar(const float* x, int64_t n, Q8Block* out);

enum class QuantIsa { kScalar, kAvx2 };
// kAvx2 when this CPU has AVX2, FMA and F16C (checked once, at run time), else kScalar.
QuantIsa detected_quant_isa();
const char* quant_isa_name(QuantIsa isa);  // "scalar", "avx2", "avx2 + avx-vnni"
// Whether kAvx2 runs the AVX-VNNI build of its kernels (quant_dot_vnni.cpp: the same results bit
// for bit, fewer instructions): the CPU has AVX-VNNI and LYCHEE_QUANT_VNNI is not "0". Checked once.
bool quant_vnni();

// Σ_i w[i] a[i] over n elements. w: one row of n elements of a block-quantised type (n a
// multiple of its block size); a: [n / 32] quantised activations.
using QuantDotFn = float (*)(const uint8_t* w, const Q8Block* a, int64_t n);

// The kernel for block type t on `isa`; Error(kUnsupported) for a type that is not block-quantised.
QuantDotFn quant_dot_fn(DType t, QuantIsa isa);

// Four activation rows at once against one weight row (the weight block unpacked once for the
// four): out[r] = Σ_i w[i] a_r[i], a_r = a + r * a_stride, each bit for bit what QuantDotFn gives
// for that row alone (the same operations in the same order per row), so prompt rows computed four
// at a time equal decode steps.
using QuantDot4Fn = void (*)(const uint8_t* w, const Q8Block* a, int64_t a_stride, int64_t n, float* out);
// The four-row kernel for t on isa, or nullptr where there is none (callers loop QuantDotFn).
QuantDot4Fn quant_dot4_fn(DType t, QuantIsa isa);

// One row of n elements of block type t dequantised to f32: out[i] equals what core/dtype.h's
// convert_to_f32 gives, bit for bit. kAvx2 has its own kernels for Q8_0, Q4_0 and Q4_1 (the
// dequantised sgemm's tiles, weight_linear.h); other types and kScalar go through convert_to_f32.
void dequantize_row(DType t, const uint8_t* w, int64_t n, float* out, QuantIsa isa);

}  // namespace lychee::cpu
