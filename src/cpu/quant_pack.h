// Quantised matrices re-laid out in groups of eight rows for the decode products (the CPU
// backend's native weights, cpu/model.h). The bytes of rows 8g .. 8g + 7 are interleaved block
// by block, so that a kernel reads one activation block once for eight rows and converts the
// eight rows' scales at once (quant_pack_avx2.cpp gives the instruction counts); the matrix keeps
// its size, and rows past the last whole group (rows % 8 of them) stay as the file has them.
//
// Layouts of one group, per 32-element block b (the group's bytes are 8 x row_bytes):
//   Q4_1 (160 bytes a block): [8] f16 d, [8] f16 m, both in lane order kQ4LaneRow (0 2 4 6 1 3 5 7,
//        the order three hadds leave the rows' sums in), then the 16 nibble bytes of rows 0, 1,
//        2, ..., 7 in row order (two rows per 32-byte load).
//   Q8_0 (272 bytes a block): [8] f16 d in row order, then the 32 codes of rows 0 .. 7.
// Each row's product equals the scalar kernel's on the row as the file has it (quant_dot.h's
// QuantDotFn at QuantIsa::kScalar), bit for bit, whichever ISA computes it (tested).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "cpu/quant_dot.h"

namespace lychee::cpu {

inline constexpr int64_t kPackRows = 8;
inline constexpr int kQ4LaneRow[kPackRows] = {0, 2, 4, 6, 1, 3, 5, 7};  // Q4_1: lane i holds row kQ4LaneRow[i]

// Whether t has an eight-row layout (Q4_1, Q8_0).
bool packable(DType t);

// Rewrites rows 0 .. rows / 8 * 8 - 1 of a row-major [rows, cols] matrix of type t (row_bytes
// per row) into the interleaved groups, in place. Error(kUnsupported) for a type without a layout.
void pack_rows8(DType t, uint8_t* data, int64_t rows, int64_t cols);
// Row `row` of a matrix pack_rows8 rewrote, as the file had it: [dtype_bytes(t, cols)] bytes.
void packed_row(DType t, const uint8_t* data, int64_t rows, int64_t cols, int64_t row, uint8_t* out);

// out[r] = Σ_i w_r[i] a[i] for the eight rows of one group (w: the group's first byte), n the
// row length. kScalar: each row gathered and put through the scalar kernel; kAvx2: the kernels
// of quant_pack_avx2.cpp (AVX-VNNI's build when quant_vnni()).
using QuantDot8Fn = void (*)(const uint8_t* w, const Q8Block* a, int64_t n, float* out);
// Error(kUnsupported) for a type that is not packable, or kAvx2 on a CPU without AVX2.
QuantDot8Fn quant_dot8_fn(DType t, QuantIsa isa);

}  // namespace lychee::cpu
