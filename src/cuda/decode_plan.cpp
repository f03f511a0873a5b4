// Host side of the decode attention: the split planner (a pure function the tests call without a
// GPU), dense work lists, and the argument checks decode_attention runs before launching.
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "cuda/decode_attention.h"

namespace lychee::cuda {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Items needed when no split is longer than `chunk` pages.
int64_t items_for_chunk(std::span<const DecodeHeadWork> heads, int64_t chunk) {
  int64_t n = 0;
  for (const DecodeHeadWork& h : heads) n += ceil_div(h.n_pages, chunk);
  return n;
}

void check_heads(std::span<const DecodeHeadWork> heads, int batch, int n_kv_heads) {
  std::vector<uint8_t> seen(size_t(batch) * size_t(n_kv_heads), 0);
  for (size_t i = 0; i < heads.size(); ++i) {
    const DecodeHeadWork& h = heads[i];
    LY_CHECK(h.seq >= 0 && h.seq < batch && h.kv_head >= 0 && h.kv_head < n_kv_heads,
             ErrorCode::kInvalidArgument,
             "plan_decode: head {} is (seq {}, kv_head {}); expected seq < {} and kv_head < {}", i, h.seq,
             h.kv_head, batch, n_kv_heads);
    LY_CHECK(h.n_pages >= 0 && h.list_offset >= 0, ErrorCode::kInvalidArgument,
             "plan_decode: head {} has n_pages {} and list_offset {}; expected both >= 0", i, h.n_pages,
             h.list_offset);
    uint8_t& s = seen[size_t(h.seq) * n_kv_heads + h.kv_head];
    LY_CHECK(s == 0, ErrorCode::kInvalidArgument, "plan_decode: (seq {}, kv_head {}) is listed twice", h.seq,
             h.kv_head);
    s = 1;
  }
}

}  // namespace

// The chunk (longest split, in pages) is the smallest c >= min_pages_per_split with
// sum_i ceil(n_i / c) <= target, target = ctas_per_sm * sm_count (more when there are more heads
// than that, never above max_items): the most parallelism the machine holds in one wave. A head
// of n pages then gets s = ceil(n / c) splits of floor(n / s) or ceil(n / s) pages, so every split
// of a split head lies in (c/2, c] and all CTAs of a wave finish together (a head is cut into
// fewer splits where that would make them shorter than min_pages_per_split). Decode attention is
// bandwidth-bound: a wave slightly short of the target still saturates HBM, so equal lengths
// matter more than hitting the CTA count exactly.
DecodePlan plan_decode(std::span<const DecodeHeadWork> heads, int batch, int n_kv_heads, int sm_count,
                       int ctas_per_sm, int min_pages_per_split, int max_items) {
  LY_CHECK(batch >= 0 && n_kv_heads >= 1 && sm_count >= 1 && ctas_per_sm >= 1 && max_items >= 1,
           ErrorCode::kInvalidArgument,
           "plan_decode: batch {}, n_kv_heads {}, sm_count {}, ctas_per_sm {}, max_items {}; expected "
           "batch >= 0 and the others >= 1",
           batch, n_kv_heads, sm_count, ctas_per_sm, max_items);
  check_heads(heads, batch, n_kv_heads);

  std::vector<DecodeHeadWork> work;
  for (const DecodeHeadWork& h : heads)
    if (h.n_pages > 0) work.push_back(h);
  LY_CHECK(int64_t(work.size()) <= max_items, ErrorCode::kInvalidArgument,
           "plan_decode: {} heads have pages but max_items is {}; every head needs at least one item",
           work.size(), max_items);

  DecodePlan plan;
  const size_t n_merge = size_t(batch) * size_t(n_kv_heads);
  plan.merge_begin.assign(n_merge, 0);
  plan.merge_count.assign(n_merge, 0);
  if (work.empty()) return plan;

  const int64_t target = std::min<int64_t>(
      max_items, std::max<int64_t>(int64_t(ctas_per_sm) * sm_count, int64_t(work.size())));
  int64_t max_pages = 0;
  for (const DecodeHeadWork& h : work) max_pages = std::max<int64_t>(max_pages, h.n_pages);
  // items_for_chunk is non-increasing in the chunk and equals work.size() <= target at max_pages.
  int64_t lo = std::min<int64_t>(std::max(1, min_pages_per_split), max_pages), hi = max_pages;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (items_for_chunk(work, mid) <= target) hi = mid;
    else lo = mid + 1;
  }
  const int64_t chunk = lo;

  const int64_t min_split = std::max(1, min_pages_per_split);
  for (const DecodeHeadWork& h : work) {
    // Fewer splits when ceil(n / chunk) of them would be shorter than min_pages_per_split.
    const int64_t n_splits = std::max<int64_t>(1, std::min(ceil_div(h.n_pages, chunk), h.n_pages / min_split));
    const int64_t base = h.n_pages / n_splits, extra = h.n_pages % n_splits;
    const size_t m = size_t(h.seq) * n_kv_heads + h.kv_head;
    if (n_splits > 1) {
      plan.merge_begin[m] = plan.n_slots;
      plan.merge_count[m] = int32_t(n_splits);
    }
    int32_t page = 0;
    for (int64_t s = 0; s < n_splits; ++s) {
      const int32_t len = int32_t(base + (s < extra ? 1 : 0));
      const int32_t slot = n_splits > 1 ? plan.n_slots + int32_t(s) : -1;
      plan.items.push_back({h.seq, h.kv_head, h.list_offset, page, page + len, slot});
      page += len;
    }
    if (n_splits > 1) plan.n_slots += int32_t(n_splits);
  }
  // Longest first: when the items outnumber the resident CTAs, the short ones fill the tail.
  std::stable_sort(plan.items.begin(), plan.items.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    return a.page_end - a.page_begin > b.page_end - b.page_begin;
  });
  LY_ASSERT(int64_t(plan.items.size()) <= max_items);
  return plan;
}

std::vector<DecodeHeadWork> dense_decode_heads(std::span<const int32_t> seq_lens, int n_kv_heads,
                                               int page_size, int max_pages_per_seq) {
  LY_CHECK(n_kv_heads >= 1 && page_size >= 1 && max_pages_per_seq >= 1, ErrorCode::kInvalidArgument,
           "dense_decode_heads: n_kv_heads {}, page_size {}, max_pages_per_seq {}; expected all >= 1",
           n_kv_heads, page_size, max_pages_per_seq);
  std::vector<DecodeHeadWork> heads;
  heads.reserve(seq_lens.size() * size_t(n_kv_heads));
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const int64_t n_pages = ceil_div(seq_lens[s], page_size);
    LY_CHECK(seq_lens[s] >= 1 && n_pages <= max_pages_per_seq, ErrorCode::kInvalidArgument,
             "dense_decode_heads: sequence {} has length {}; expected 1 to {} tokens ({} pages of {})", s,
             seq_lens[s], int64_t(max_pages_per_seq) * page_size, max_pages_per_seq, page_size);
    const int64_t offset = int64_t(s) * max_pages_per_seq;
    LY_CHECK(offset <= INT32_MAX, ErrorCode::kInvalidArgument,
             "dense_decode_heads: list offset {} of sequence {} overflows int32", offset, s);
    for (int h = 0; h < n_kv_heads; ++h)
      heads.push_back({int32_t(s), int32_t(h), int32_t(offset), int32_t(n_pages)});
  }
  return heads;
}

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
  LY_CHECK(a.batch >= 0 && a.max_items >= 0, ErrorCode::kInvalidArgument,
           "decode_attention: batch {} and max_items {}; expected both >= 0", a.batch, a.max_items);
  LY_CHECK(a.scale > 0.0f, ErrorCode::kInvalidArgument, "decode_attention: scale {}; expected > 0", a.scale);
  // partial_o / partial_lse may be null when no item has a slot; the kernels never touch them then.
  LY_CHECK(a.q && a.k_pool && a.v_pool && a.page_lists && a.seq_lens && a.items && a.n_items && a.merge_begin &&
               a.merge_count && a.out,
           ErrorCode::kInvalidArgument, "decode_attention: a device pointer in DecodeAttentionArgs is null");
}

}  // namespace lychee::cuda
