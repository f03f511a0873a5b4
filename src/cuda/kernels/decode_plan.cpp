// Host side of the decode attention: the split planner (a pure function the tests call without a
// GPU), dense work lists, and the argument checks decode_attention runs before launching.
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "cuda/kernels/decode_attention.h"

namespace lychee::cuda {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t tokens_of(const DecodeHeadWork& h) { return int64_t(h.n_entries) * h.unit; }

// Items needed when no split holds more than `chunk` tokens (whole entries, at least one).
int64_t items_for_chunk(std::span<const DecodeHeadWork> heads, int64_t chunk) {
  int64_t n = 0;
  for (const DecodeHeadWork& h : heads) n += std::min<int64_t>(h.n_entries, ceil_div(tokens_of(h), chunk));
  return n;
}

void check_heads(std::span<const DecodeHeadWork> heads, int batch, int n_heads, int n_kv_heads) {
  const int group = n_heads / n_kv_heads;
  std::vector<uint8_t> seen(size_t(batch) * size_t(n_heads), 0);
  for (size_t i = 0; i < heads.size(); ++i) {
    const DecodeHeadWork& h = heads[i];
    LY_CHECK(h.seq >= 0 && h.seq < batch && h.kv_head >= 0 && h.kv_head < n_kv_heads,
             ErrorCode::kInvalidArgument,
             "plan_decode: head {} is (seq {}, kv_head {}); expected seq < {} and kv_head < {}", i, h.seq,
             h.kv_head, batch, n_kv_heads);
    LY_CHECK(h.n_entries >= 0 && h.unit >= 1 && h.unit <= INT16_MAX && h.list >= 0 && h.count >= 0,
             ErrorCode::kInvalidArgument,
             "plan_decode: head {} has n_entries {}, unit {}, list {}, count {}; expected n_entries, list, "
             "count >= 0 and unit in 1..32767",
             i, h.n_entries, h.unit, h.list, h.count);
    LY_CHECK(h.row_begin >= 0 && h.n_rows >= 1 && h.row_begin + h.n_rows <= group, ErrorCode::kInvalidArgument,
             "plan_decode: head {} serves query rows [{}, {}) of a group of {}", i, h.row_begin,
             h.row_begin + h.n_rows, group);
    LY_CHECK(h.score == ScoreKind::kNone || h.kind == ListKind::kDense, ErrorCode::kInvalidArgument,
             "plan_decode: head {} scores but does not read densely", i);
    for (int r = h.row_begin; r < h.row_begin + h.n_rows; ++r) {
      uint8_t& s = seen[size_t(h.seq) * n_heads + size_t(h.kv_head) * group + r];
      LY_CHECK(s == 0, ErrorCode::kInvalidArgument, "plan_decode: query head {} of sequence {} is served twice",
               h.kv_head * group + r, h.seq);
      s = 1;
    }
  }
}

// The chunk is a whole number of the largest entry, so that every head of those entries gets
// splits within a factor 2 of each other. items_for_chunk is non-increasing in the chunk and
// equals work.size() <= target at max_tokens.
int64_t find_chunk(std::span<const DecodeHeadWork> work, int64_t target, int64_t min_split) {
  int64_t max_tokens = 0, max_unit = 1;
  for (const DecodeHeadWork& h : work) {
    max_tokens = std::max(max_tokens, tokens_of(h));
    max_unit = std::max<int64_t>(max_unit, h.unit);
  }
  int64_t lo = ceil_div(std::min(min_split, max_tokens), max_unit), hi = ceil_div(max_tokens, max_unit);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (items_for_chunk(work, mid * max_unit) <= target) hi = mid;
    else lo = mid + 1;
  }
  return lo * max_unit;
}

// Splits of head h (n_entries > 0) when no split should hold more than `chunk` tokens: fewer
// when ceil(t / chunk) of them would be shorter than min_split tokens, never more than entries.
int64_t splits_for_chunk(const DecodeHeadWork& h, int64_t chunk, int64_t min_split) {
  const int64_t t = tokens_of(h);
  return std::max<int64_t>(1, std::min({ceil_div(t, chunk), t / min_split, int64_t(h.n_entries)}));
}

// Appends the n_splits items of head h (n_entries > 0) to plan.items, for each of `chunks` groups
// of `per_item` new positions (chunks 1: all positions, n_pos 0); when a group has more than one
// split, gives each item a partial-result slot (group k's splits after group k - 1's) and points
// the merge of every query row it serves at them.
void split_head(const DecodeHeadWork& h, int64_t n_splits, int n_heads, int group, int rows_per_seq, int per_item,
                int chunks, DecodePlan& plan) {
  const int64_t base = h.n_entries / n_splits, extra = h.n_entries % n_splits;
  if (n_splits > 1) {
    for (int r = h.row_begin; r < h.row_begin + h.n_rows; ++r) {
      const size_t m = size_t(h.seq) * n_heads + size_t(h.kv_head) * group + r;
      plan.merge_begin[m] = plan.n_slots;
      plan.merge_count[m] = int32_t(n_splits);
    }
  }
  for (int c = 0; c < chunks; ++c) {
    int32_t e = 0;
    for (int64_t s = 0; s < n_splits; ++s) {
      const int32_t len = int32_t(base + (s < extra ? 1 : 0));
      DecodeWorkItem it{};
      it.seq = h.seq;
      it.kv_head = h.kv_head;
      it.list = h.list;
      it.count = h.count;
      it.begin = e;
      it.end = e + len;
      it.slot = n_splits > 1 ? plan.n_slots + int32_t(c * n_splits + s) : -1;
      it.unit = int16_t(h.unit);
      it.row_begin = int8_t(h.row_begin);
      it.n_rows = int8_t(h.n_rows);
      it.kind = h.kind;
      it.score = h.score;
      it.pos_begin = int8_t(chunks > 1 ? c * per_item : 0);
      it.n_pos = int8_t(chunks > 1 ? std::min(per_item, rows_per_seq - c * per_item) : 0);
      plan.items.push_back(it);
      e += len;
    }
  }
  if (n_splits > 1) plan.n_slots += int32_t(chunks * n_splits);
}

}  // namespace

// The chunk (longest split, in tokens) is the smallest c >= min_tokens_per_split with
// sum_i min(n_i, ceil(t_i / c)) <= target, target = ctas_per_sm * sm_count (more when there are
// more heads than that, never above max_items): the most parallelism the machine holds in one
// wave. A head of t tokens in n entries then gets s = min(n, ceil(t / c)) splits of floor(n / s)
// or ceil(n / s) entries, so the splits of every head are within one entry of each other and all
// CTAs of a wave finish together whatever mix of dense and sparse heads the layer has (a head is
// cut into fewer splits where they would be shorter than min_tokens_per_split). Decode attention
// is bandwidth-bound: a wave slightly short of the target still saturates HBM, so equal lengths
// matter more than hitting the CTA count exactly.
// Batch-invariant planning (splits_per_head > 0) cuts each head into min(splits_per_head, n,
// t / min_tokens_per_split) splits whatever the other heads are, so a head's splits, and with them
// the order in which its partial results are merged, depend on that head alone: a sequence's
// attention gives the same bits alone or in any batch (the server's seeded requests).
DecodePlan plan_decode(std::span<const DecodeHeadWork> heads, int batch, int n_heads, int n_kv_heads,
                       int sm_count, int ctas_per_sm, int min_tokens_per_split, int max_items,
                       int splits_per_head, int rows_per_seq) {
  LY_CHECK(batch >= 0 && n_kv_heads >= 1 && n_heads >= n_kv_heads && n_heads % n_kv_heads == 0 &&
               n_heads / n_kv_heads <= 127 && sm_count >= 1 && ctas_per_sm >= 1 && max_items >= 1,
           ErrorCode::kInvalidArgument,
           "plan_decode: batch {}, n_heads {}, n_kv_heads {}, sm_count {}, ctas_per_sm {}, max_items {}; expected "
           "batch >= 0, n_heads a multiple of n_kv_heads and the others >= 1",
           batch, n_heads, n_kv_heads, sm_count, ctas_per_sm, max_items);
  LY_CHECK(splits_per_head >= 0, ErrorCode::kInvalidArgument, "plan_decode: splits_per_head {}; expected >= 0",
           splits_per_head);
  check_heads(heads, batch, n_heads, n_kv_heads);
  const int group = n_heads / n_kv_heads;
  LY_CHECK(rows_per_seq >= 1 && rows_per_seq <= kDecodeMaxVerifyRows, ErrorCode::kInvalidArgument,
           "plan_decode: rows_per_seq {}; expected 1 to {}", rows_per_seq, kDecodeMaxVerifyRows);
  const int per_item = decode_positions_per_item(group, rows_per_seq);
  const int chunks = (rows_per_seq + per_item - 1) / per_item;
  for (size_t i = 0; i < heads.size() && rows_per_seq > 1; ++i)
    LY_CHECK(heads[i].kind == ListKind::kDense && heads[i].score == ScoreKind::kNone && heads[i].n_rows == group,
             ErrorCode::kInvalidArgument,
             "plan_decode: head {} is not dense and GQA-packed; rows_per_seq {} takes dense heads only", i,
             rows_per_seq);

  std::vector<DecodeHeadWork> work;
  for (const DecodeHeadWork& h : heads)
    if (h.n_entries > 0) work.push_back(h);
  LY_CHECK(int64_t(work.size()) * chunks <= max_items, ErrorCode::kInvalidArgument,
           "plan_decode: {} heads have entries, {} items each at least, but max_items is {}", work.size(), chunks,
           max_items);

  DecodePlan plan;
  const size_t n_merge = size_t(batch) * size_t(n_heads);
  plan.merge_begin.assign(n_merge, 0);
  plan.merge_count.assign(n_merge, 0);
  if (work.empty()) return plan;

  const int64_t min_split = std::max(1, min_tokens_per_split);
  if (splits_per_head > 0) {
    for (const DecodeHeadWork& h : work) {
      const int64_t n = std::max<int64_t>(1, std::min({int64_t(splits_per_head), tokens_of(h) / min_split,
                                                       int64_t(h.n_entries)}));
      split_head(h, n, n_heads, group, rows_per_seq, per_item, chunks, plan);
    }
    LY_CHECK(int64_t(plan.items.size()) <= max_items, ErrorCode::kInvalidArgument,
             "plan_decode: {} heads at up to {} splits each need {} items; max_items is {}", work.size(),
             splits_per_head, plan.items.size(), max_items);
  } else {
    // Every split is `chunks` items: balanced as if each head were `chunks` heads.
    const int64_t target = std::min<int64_t>(max_items, std::max<int64_t>(int64_t(ctas_per_sm) * sm_count,
                                                                          int64_t(work.size()) * chunks)) / chunks;
    const int64_t chunk = find_chunk(work, target, min_split);
    for (const DecodeHeadWork& h : work)
      split_head(h, splits_for_chunk(h, chunk, min_split), n_heads, group, rows_per_seq, per_item, chunks, plan);
  }
  // Longest first: when the items outnumber the resident CTAs, the short ones fill the tail.
  std::stable_sort(plan.items.begin(), plan.items.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    return int64_t(a.end - a.begin) * a.unit > int64_t(b.end - b.begin) * b.unit;
  });
  LY_ASSERT(int64_t(plan.items.size()) <= max_items);
  return plan;
}

std::vector<DecodeHeadWork> dense_decode_heads(std::span<const int32_t> seq_lens, int n_kv_heads, int group,
                                               int page_size, int max_pages_per_seq) {
  LY_CHECK(n_kv_heads >= 1 && group >= 1 && page_size >= 1 && max_pages_per_seq >= 1, ErrorCode::kInvalidArgument,
           "dense_decode_heads: n_kv_heads {}, group {}, page_size {}, max_pages_per_seq {}; expected all >= 1",
           n_kv_heads, group, page_size, max_pages_per_seq);
  std::vector<DecodeHeadWork> heads;
  heads.reserve(seq_lens.size() * size_t(n_kv_heads));
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const int64_t n_pages = ceil_div(seq_lens[s], page_size);
    LY_CHECK(seq_lens[s] >= 1 && n_pages <= max_pages_per_seq, ErrorCode::kInvalidArgument,
             "dense_decode_heads: sequence {} has length {}; expected 1 to {} tokens ({} pages of {})", s,
             seq_lens[s], int64_t(max_pages_per_seq) * page_size, max_pages_per_seq, page_size);
    for (int h = 0; h < n_kv_heads; ++h) {
      DecodeHeadWork w;
      w.seq = int32_t(s);
      w.kv_head = h;
      w.n_entries = int32_t(n_pages);
      w.unit = page_size;
      w.row_begin = 0;
      w.n_rows = group;
      heads.push_back(w);
    }
  }
  return heads;
}

namespace {

// rows_per_seq > 1 (verification): dense attention only. The items are on the device, so what is
// checked here is that no policy field is set; the runner plans such a step with
// dense_decode_heads and plan_decode's rows_per_seq.
void check_decode_rows(const DecodeAttentionArgs& a) {
  const int r = a.rows_per_seq;
  LY_CHECK(r >= 1, ErrorCode::kInvalidArgument, "decode_attention: rows_per_seq {}; expected >= 1", r);
  if (r == 1) return;
  LY_CHECK(r <= kDecodeMaxVerifyRows, ErrorCode::kUnsupported, "unsupported rows_per_seq: {} (at most {})", r,
           kDecodeMaxVerifyRows);
  LY_CHECK(a.k8_pool == nullptr, ErrorCode::kUnsupported,
           "unsupported rows_per_seq: {} with FP8 KV pages (k8_pool; the FP8 reader serves 8 query rows)", r);
  const char* policy_field = a.unit_lists != nullptr    ? "unit_lists"
                             : a.list_counts != nullptr ? "list_counts"
                             : a.scores != nullptr      ? "scores"
                             : a.token_reads != nullptr ? "token_reads"
                             : a.window_sink != 0 || a.window_recent != 0 ? "window_sink/window_recent"
                                                                           : nullptr;
  LY_CHECK(policy_field == nullptr, ErrorCode::kUnsupported,
           "unsupported rows_per_seq: {} with {} set (several positions per sequence take dense items only)", r,
           policy_field);
}

}  // namespace

void check_decode_args(const DecodeAttentionArgs& a) {
  LY_CHECK(a.head_dim == 64 || a.head_dim == 128, ErrorCode::kUnsupported, "unsupported head_dim: {}",
           a.head_dim);
  LY_CHECK(a.page_size == 16 || a.page_size == 32 || a.page_size == 64 || a.page_size == 128,
           ErrorCode::kUnsupported, "unsupported page_size: {} (expected 16, 32, 64 or 128)", a.page_size);
  LY_CHECK(a.n_kv_heads >= 1 && a.n_heads >= a.n_kv_heads && a.n_heads % a.n_kv_heads == 0,
           ErrorCode::kInvalidArgument,
           "decode_attention: n_heads {} is not a positive multiple of n_kv_heads {}", a.n_heads, a.n_kv_heads);
  const int group = a.n_heads / a.n_kv_heads;
  LY_CHECK(group <= 8, ErrorCode::kUnsupported,
           "unsupported GQA group: {} query heads per KV head (expected 1 to 8)", group);
  LY_CHECK(a.batch >= 0 && a.max_items >= 0 && a.max_pages >= 1, ErrorCode::kInvalidArgument,
           "decode_attention: batch {}, max_items {}, max_pages {}; expected batch, max_items >= 0 and max_pages >= 1",
           a.batch, a.max_items, a.max_pages);
  LY_CHECK(a.scale > 0.0f, ErrorCode::kInvalidArgument, "decode_attention: scale {}; expected > 0", a.scale);
  LY_CHECK(a.window_sink >= 0 && a.window_recent >= 0, ErrorCode::kInvalidArgument,
           "decode_attention: window sink {} and recent {}; expected both >= 0", a.window_sink, a.window_recent);
  // partial_o / partial_lse may be null when no item has a slot, unit_lists / list_counts when no
  // item reads a list, scores when none scores; the kernels never touch them then.
  const bool bf16_kv = a.k_pool && a.v_pool, fp8_kv = a.k8_pool && a.v8_pool && a.k_scale && a.v_scale;
  LY_CHECK(bf16_kv != fp8_kv, ErrorCode::kInvalidArgument,
           "decode_attention: set either k_pool and v_pool (bf16 KV) or k8_pool, v8_pool, k_scale and v_scale (FP8 "
           "KV), not {}", bf16_kv ? "both" : "neither");
  LY_CHECK(a.q && a.block_table && a.seq_lens && a.items && a.n_items && a.merge_begin &&
               a.merge_count && a.out,
           ErrorCode::kInvalidArgument, "decode_attention: a device pointer in DecodeAttentionArgs is null");
  check_decode_rows(a);
}

}  // namespace lychee::cuda
