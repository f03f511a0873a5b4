// Host-side argument checks of the selection kernels (select.h): kept out of the .cu file so
// that nvcc never compiles fmt.
#include "core/error.h"
#include "cuda/kernels/select.h"

namespace lychee::cuda {

void check_select_args(const SelectArgs& a) {
  LY_CHECK(a.unit >= 1 && a.score_unit >= 1 && a.unit % a.score_unit == 0, ErrorCode::kInvalidArgument,
           "select_units: unit {} is not a multiple of the score unit {}", a.unit, a.score_unit);
  LY_CHECK(a.list_stride >= 1 && a.score_stride >= 1 && a.n_select >= 0 && a.row_heads >= 1,
           ErrorCode::kInvalidArgument, "select_units: list_stride {}, score_stride {}, n_select {}, row_heads {}",
           a.list_stride, a.score_stride, a.n_select, a.row_heads);
  LY_CHECK(a.strategy != SelectStrategy::kTopK || a.budget >= 1, ErrorCode::kInvalidArgument,
           "select_units: top-k budget {}; expected >= 1", a.budget);
  LY_CHECK(a.sink >= 0 && a.recent >= 0 && a.scale > 0.0f, ErrorCode::kInvalidArgument,
           "select_units: sink {}, recent {}, scale {}", a.sink, a.recent, a.scale);
  LY_CHECK(a.scores && a.seq_lens && a.heads && a.lists && a.counts && a.unit_scores, ErrorCode::kInvalidArgument,
           "select_units: a device pointer is null");
}

void check_union_args(const UnionReadsArgs& a) {
  LY_CHECK(a.unit >= 1 && a.max_units >= 1 && a.n_kv_heads >= 1 && a.n_heads % a.n_kv_heads == 0,
           ErrorCode::kInvalidArgument, "count_union_reads: unit {}, max_units {}, heads {}/{}", a.unit,
           a.max_units, a.n_heads, a.n_kv_heads);
  LY_CHECK((a.max_units + 31) / 32 * 4 <= 48 * 1024, ErrorCode::kUnsupported,
           "count_union_reads: {} units need more than 48 KiB of shared memory", a.max_units);
}

void check_quest_args(const QuestArgs& a) {
  LY_CHECK(a.qpage >= 1 && a.page_size % a.qpage == 0, ErrorCode::kUnsupported,
           "quest page {} does not divide the KV page size {}", a.qpage, a.page_size);
}

}  // namespace lychee::cuda
