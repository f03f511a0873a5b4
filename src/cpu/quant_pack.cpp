// The eight-row layout of quant_pack.h: packing, unpacking a row, and the scalar twin of the
// AVX2 kernels (each row gathered back into the file's layout and put through the scalar kernel).
#include "cpu/quant_pack.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace lychee::cpu {

namespace {

// Where the parts of row r's block b live in a group and in the file's row.
struct BlockParts {
  int64_t group_block_bytes;  // one block of the eight rows
  int64_t row_block_bytes;    // one block of one row
  int64_t scale_bytes;        // f16 scales at the start of a row's block (d, or d and m)
};

BlockParts parts_of(DType t) {
  switch (t) {
    case DType::kQ4_1: return {160, 20, 4};
    case DType::kQ8_0: return {272, 34, 2};
    default: break;
  }
  fail(ErrorCode::kUnsupported, "no eight-row layout for {} weights", dtype_name(t));
}

// Byte offsets of row r's parts within a group's block: its f16 scales (d, and m for Q4_1), each
// in an array of eight, then its codes.
struct RowSpots {
  int64_t scale[2];
  int64_t codes;
};

RowSpots spots(DType t, int r) {
  const BlockParts p = parts_of(t);
  int lane = r;
  if (t == DType::kQ4_1)
    for (int l = 0; l < int(kPackRows); ++l)
      if (kQ4LaneRow[l] == r) lane = l;
  const int64_t code_bytes = p.row_block_bytes - p.scale_bytes;
  return {{2 * lane, 2 * kPackRows + 2 * lane}, p.scale_bytes * kPackRows + code_bytes * r};
}

template <DType T>
void scalar_dot8(const uint8_t* w, const Q8Block* a, int64_t n, float* out) {
  thread_local std::vector<uint8_t> row;
  row.resize(size_t(dtype_bytes(T, n)));
  const QuantDotFn dot = quant_dot_fn(T, QuantIsa::kScalar);
  for (int r = 0; r < int(kPackRows); ++r) {
    packed_row(T, w, kPackRows, n, r, row.data());
    out[r] = dot(row.data(), a, n);
  }
}

}  // namespace

bool packable(DType t) { return t == DType::kQ4_1 || t == DType::kQ8_0; }

void pack_rows8(DType t, uint8_t* data, int64_t rows, int64_t cols) {
  const BlockParts p = parts_of(t);
  const int64_t row_bytes = dtype_bytes(t, cols), nb = cols / 32;
  const int64_t n_scales = p.scale_bytes / 2, code_bytes = p.row_block_bytes - p.scale_bytes;
  std::vector<uint8_t> rows8(size_t(kPackRows * row_bytes));
  for (int64_t g = 0; g + kPackRows <= rows; g += kPackRows) {
    uint8_t* group = data + g * row_bytes;
    std::memcpy(rows8.data(), group, rows8.size());
    for (int r = 0; r < int(kPackRows); ++r) {
      const RowSpots at = spots(t, r);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* f = rows8.data() + r * row_bytes + b * p.row_block_bytes;
        uint8_t* gb = group + b * p.group_block_bytes;
        for (int64_t s = 0; s < n_scales; ++s) std::memcpy(gb + at.scale[s], f + 2 * s, 2);
        std::memcpy(gb + at.codes, f + p.scale_bytes, size_t(code_bytes));
      }
    }
  }
}

void packed_row(DType t, const uint8_t* data, int64_t rows, int64_t cols, int64_t row, uint8_t* out) {
  LY_ASSERT(row >= 0 && row < rows);
  const BlockParts p = parts_of(t);
  const int64_t row_bytes = dtype_bytes(t, cols), nb = cols / 32;
  if (row >= rows / kPackRows * kPackRows) {  // past the last whole group: as the file has it
    std::memcpy(out, data + row * row_bytes, size_t(row_bytes));
    return;
  }
  const int64_t n_scales = p.scale_bytes / 2, code_bytes = p.row_block_bytes - p.scale_bytes;
  const uint8_t* group = data + row / kPackRows * kPackRows * row_bytes;
  const RowSpots at = spots(t, int(row % kPackRows));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * p.group_block_bytes;
    uint8_t* f = out + b * p.row_block_bytes;
    for (int64_t s = 0; s < n_scales; ++s) std::memcpy(f + 2 * s, gb + at.scale[s], 2);
    std::memcpy(f + p.scale_bytes, gb + at.codes, size_t(code_bytes));
  }
}

QuantDot8Fn quant_dot8_fn(DType t, QuantIsa isa) {
  LY_CHECK(packable(t), ErrorCode::kUnsupported, "no eight-row product for {} weights", dtype_name(t));
  LY_CHECK(isa == QuantIsa::kScalar || detected_quant_isa() == QuantIsa::kAvx2, ErrorCode::kUnsupported,
           "the AVX2 eight-row products need a CPU with AVX2, FMA and F16C");
  const bool q4 = t == DType::kQ4_1;
#if defined(__x86_64__)
  if (isa == QuantIsa::kAvx2) {
    if (quant_vnni()) return q4 ? avx2vnni::dot8_q4_1 : avx2vnni::dot8_q8_0;
    return q4 ? avx2::dot8_q4_1 : avx2::dot8_q8_0;
  }
#endif
  return q4 ? scalar_dot8<DType::kQ4_1> : scalar_dot8<DType::kQ8_0>;
}

}  // namespace lychee::cpu
