// Prefix reuse across requests: sessions kept after their request finished, each truncated to
// the prompt it prefilled (dense attention, whatever the request's decode policy, so the K/V are
// exactly what another request's prefill of the same tokens would compute), keyed by those
// tokens. A new prompt that starts with a kept prompt (a second question about the same long
// document, the next turn of a chat whose earlier turns were a prompt) copies that prefix
// (Session::copy_prefix: shared pages on the GPU, copied rows on the CPU) instead of prefilling it.
//
// Bounded in tokens (the sessions' capacities, which is what they hold); the least recently used
// entries go first. Not thread-safe: the engine thread owns it, like the sessions.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace lychee {

// Which entries of a PrefixCache a prompt may use, and how an entry was made.
//   salt: entries are shared only among prompts of the same salt (tenants: the server's
//     cache_salt), so a hit cannot reveal another tenant's prompt.
//   aligned: 0, or the chunk C the entry's prompt was prefilled in (pieces [kC, (k+1)C)). A find
//     with aligned C > 0 takes only entries prefilled so and copies a multiple of C tokens: the
//     copied K/V and the chunks left to prefill are then exactly those of the prompt's own
//     aligned prefill (the same bits: batch-invariant requests).
struct PrefixCacheKey {
  std::string salt;
  int aligned = 0;
};

class PrefixCache {
 public:
  // max_tokens: what kept sessions may hold in all; min_match: the shortest prefix worth copying;
  // min_suffix: prompt tokens always prefilled after the copy. At least 2, so that the prompt's
  // end is a dense prefill and not a decode step under the request's policy; 8 by default, so
  // that it runs the prefill path of every backend (the CPU's quantised path multiplies up to 4
  // rows with int8 activations, longer chunks through f32 BLAS, as the whole prompt would).
  explicit PrefixCache(int64_t max_tokens, int min_match = 16, int min_suffix = 8);

  struct Match {
    Session* session = nullptr;  // null: no entry shares min_match tokens with the prompt
    int length = 0;              // tokens to copy (<= prompt.size() - min_suffix)
  };
  using Key = PrefixCacheKey;
  // The entry sharing the longest prefix with `prompt` under `key` (marked used).
  Match find(std::span<const int32_t> prompt, const Key& key = {});
  // Keeps `session` whose first tokens.size() cached positions are `tokens` (the caller truncated
  // it there), costing `cost` (< 0: the session's capacity in tokens) of max_tokens. An entry
  // with the same tokens and key is replaced; older entries go while the cache holds more than
  // max_tokens (an entry larger than that is not kept).
  void put(std::unique_ptr<Session> session, std::vector<int32_t> tokens, const Key& key = {}, int64_t cost = -1);
  // Drops least recently used entries until at most `keep` tokens are held.
  void evict_to(int64_t keep);
  void clear() { evict_to(0); }

  int64_t tokens_held() const { return held_; }
  int entries() const { return int(entries_.size()); }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  struct Entry {
    std::unique_ptr<Session> session;
    std::vector<int32_t> tokens;
    Key key;
    int64_t cost = 0;  // put's cost
  };
  int64_t max_tokens_;
  int min_match_, min_suffix_;
  int64_t held_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace lychee
