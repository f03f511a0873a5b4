#include "attention/policy.h"

#include <algorithm>

namespace lychee {

KvReadStats& KvReadStats::operator+=(const KvReadStats& o) {
  decode_steps += o.decode_steps;
  token_reads += o.token_reads;
  dense_token_reads += o.dense_token_reads;
  metadata_bytes += o.metadata_bytes;
  correction_token_reads += o.correction_token_reads;
  return *this;
}

int64_t union_size(std::span<const HeadRead> group_reads, int n_ctx) {
  if (group_reads.size() == 1) return group_reads[0].dense ? n_ctx : int64_t(group_reads[0].tokens.size());
  std::vector<int32_t> all;
  for (const HeadRead& r : group_reads) {
    if (r.dense) return n_ctx;
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  }
  std::sort(all.begin(), all.end());
  return std::unique(all.begin(), all.end()) - all.begin();
}

}  // namespace lychee
