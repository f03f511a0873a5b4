#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace lychee {

PrefixCache::PrefixCache(int64_t max_tokens, int min_match, int min_suffix)
    : max_tokens_(max_tokens), min_match_(min_match), min_suffix_(min_suffix) {
  LY_CHECK(max_tokens >= 0 && min_match >= 1 && min_suffix >= 2, ErrorCode::kInvalidArgument,
           "prefix cache: max_tokens must be >= 0, min_match >= 1 and min_suffix >= 2 (got {}, {}, {})", max_tokens,
           min_match, min_suffix);
}

PrefixCache::Match PrefixCache::find(std::span<const int32_t> prompt, const Key& key) {
  auto best = entries_.end();
  int best_len = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key.salt != key.salt || (key.aligned > 0 && it->key.aligned != key.aligned)) continue;
    const size_t n = std::min(it->tokens.size(), prompt.size());
    const size_t common = size_t(std::mismatch(it->tokens.begin(), it->tokens.begin() + long(n), prompt.begin()).first -
                                 it->tokens.begin());
    // The prompt's last min_suffix tokens are always prefilled (see the constructor).
    int len = int(std::min<int64_t>(int64_t(common), int64_t(prompt.size()) - min_suffix_));
    if (key.aligned > 0) len = len / key.aligned * key.aligned;
    if (len > best_len) {
      best_len = len;
      best = it;
    }
  }
  if (best == entries_.end() || best_len < min_match_) return {};
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  return {entries_.front().session.get(), best_len};
}

void PrefixCache::put(std::unique_ptr<Session> session, std::vector<int32_t> tokens, const Key& key,
                      int64_t cost) {
  LY_CHECK(session != nullptr && session->length() == int(tokens.size()), ErrorCode::kInvalidArgument,
           "prefix cache: the session holds {} tokens, {} given", session ? session->length() : -1, tokens.size());
  LY_CHECK(key.aligned >= 0, ErrorCode::kInvalidArgument, "prefix cache: aligned chunk {} < 0", key.aligned);
  if (cost < 0) cost = session->capacity();
  if (tokens.empty() || cost > max_tokens_) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->tokens == tokens && it->key.salt == key.salt && it->key.aligned == key.aligned) {
      held_ -= it->cost;
      entries_.erase(it);
      break;
    }
  evict_to(max_tokens_ - cost);
  entries_.push_front({std::move(session), std::move(tokens), key, cost});
  held_ += cost;
}

void PrefixCache::evict_to(int64_t keep) {
  while (!entries_.empty() && held_ > keep) {
    held_ -= entries_.back().cost;
    entries_.pop_back();
  }
}

}  // namespace lychee
