#include "runtime/cuda_session.h"

#include <algorithm>

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

GpuSession::GpuSession(cuda::GpuRunner& runner, int capacity)
    : runner_(runner), capacity_(std::min(capacity, runner.max_context())),
      logits_(size_t(runner.config().vocab_size)) {
  LY_CHECK(capacity_ > 0, ErrorCode::kInvalidArgument, "session capacity must be positive");
}

GpuSession::~GpuSession() {
  runner_.cancel_before_next_forward(this);
  runner_.release(seq_);
}

void GpuSession::keep_logits(bool keep) {
  keep_logits_ = keep;
  if (!keep) runner_.cancel_before_next_forward(this);
  else if (!logits_valid_ && runner_.forwards() == forward_ && forward_ != 0) own_logits();
}

void GpuSession::own_logits() {
  if (!keep_logits_) return;
  runner_.call_before_next_forward(this, [this] {
    if (!logits_valid_ && runner_.forwards() == forward_) {
      runner_.copy_logits(row_, logits_);
      logits_valid_ = true;
    }
  });
}

void GpuSession::feed(std::span<const int32_t> tokens, bool allow_policy) {
  commit_pending();
  LY_CHECK(seq_.length + int(tokens.size()) <= capacity_, ErrorCode::kCapacity,
           "KV cache full: {} cached + {} new tokens exceed the session's {} tokens", seq_.length,
           tokens.size(), capacity_);
  logits_valid_ = false;
  if (tokens.size() == 1 && seq_.length > 0) {
    decode_step(tokens, allow_policy);
    commit_pending();
    return;
  }
  const ModelConfig& c = runner_.config();
  const int before = seq_.length;
  runner_.prefill(seq_, tokens);
  forward_ = runner_.forwards();
  row_ = 0;
  own_logits();
  if (!allow_policy && before > 0 && policy_ != nullptr)  // cache correction: a dense re-prefill
    stats_.correction_token_reads += uint64_t(c.n_layers) * uint64_t(c.n_kv_heads) * uint64_t(seq_.length);
}

void GpuSession::check_verify_rows(int n) const {
  LY_CHECK(n >= 1 && n <= cuda::kMaxVerifyRows, ErrorCode::kInvalidArgument,
           "verify takes 1..{} tokens, got {}", cuda::kMaxVerifyRows, n);
  LY_CHECK(seq_.length > 0, ErrorCode::kInvalidArgument, "verify of an empty sequence (prefill first)");
  LY_CHECK(seq_.length + n <= capacity_, ErrorCode::kCapacity,
           "KV cache full: {} cached + {} verified tokens exceed the session's {} tokens", seq_.length, n, capacity_);
}

std::span<const float> GpuSession::verify(std::span<const int32_t> tokens) {
  commit_pending();
  const int n = int(tokens.size());
  check_verify_rows(n);
  const int before = seq_.length;
  // One decode step of n rows where the decode kernel takes them (n <= 16, bf16 KV, one GPU): the
  // KV is read once, as by a Full step, where a group x n fits one mma tile (16 rows), once per
  // tile's worth of positions past it. Otherwise prefill's pass with every row's logits.
  if (runner_.verify_step_fits(1, n)) {
    cuda::GpuSeq* seqs[] = {&seq_};
    runner_.verify(seqs, tokens, n);
  } else {
    runner_.prefill(seq_, tokens, /*all_logits=*/true);
  }
  return verified(0, n, before);
}

// The verification pass just run holds this session's n rows from logits row `first` on.
std::span<const float> GpuSession::verified(int first, int n, int before) {
  forward_ = runner_.forwards();
  const size_t vocab = logits_.size();
  rows_.resize(size_t(n) * vocab);
  for (int i = 0; i < n; ++i)
    runner_.copy_logits(first + i, std::span<float>(rows_.data() + size_t(i) * vocab, vocab));
  std::copy(rows_.end() - std::ptrdiff_t(vocab), rows_.end(), logits_.begin());
  row_ = first + n - 1;
  logits_valid_ = true;
  const ModelConfig& c = runner_.config();
  stats_.correction_token_reads += uint64_t(c.n_layers) * uint64_t(c.n_kv_heads) * uint64_t(before + n);
  if (policy_ != nullptr) policy_->reset();
  return rows_;
}

// Sessions of equal row counts, none batch-invariant, as verification steps of as many sequences
// as GpuRunner::verify_step_fits takes (the KV of each read once, the weights once for all); a
// session no step takes with another verifies alone (verify: its own step, or the prefill pass).
void GpuSession::verify_together(std::span<Session* const> sessions,
                                 std::span<const std::span<const int32_t>> tokens, const VerifiedRows& after) {
  const size_t n = sessions.size();
  std::vector<GpuSession*> gs(n);
  for (size_t i = 0; i < n; ++i) {
    gs[i] = dynamic_cast<GpuSession*>(sessions[i]);
    LY_CHECK(gs[i] != nullptr && &gs[i]->runner_ == &runner_, ErrorCode::kInvalidArgument,
             "verify_batch: session {} is not a GPU session of this runner", i);
    gs[i]->commit_pending();
    gs[i]->check_verify_rows(int(tokens[i].size()));
  }
  std::vector<bool> done(n, false);
  std::vector<size_t> group;
  std::vector<cuda::GpuSeq*> seqs;
  std::vector<int32_t> group_tokens;
  std::vector<int> before;
  for (size_t first = 0; first < n; ++first) {
    if (done[first]) continue;
    const int rows = int(tokens[first].size());
    group.assign(1, first);
    done[first] = true;
    if (!gs[first]->batch_invariant_)
      for (size_t j = first + 1; j < n; ++j)
        if (!done[j] && !gs[j]->batch_invariant_ && int(tokens[j].size()) == rows &&
            runner_.verify_step_fits(int(group.size()) + 1, rows)) {
          group.push_back(j);
          done[j] = true;
        }
    if (group.size() == 1) {
      const std::span<const float> r = gs[first]->verify(tokens[first]);
      if (after) after(first, r);
      continue;
    }
    seqs.clear();
    group_tokens.clear();
    before.clear();
    for (size_t j : group) {
      seqs.push_back(&gs[j]->seq_);
      group_tokens.insert(group_tokens.end(), tokens[j].begin(), tokens[j].end());
      before.push_back(gs[j]->seq_.length);
    }
    runner_.verify(seqs, group_tokens, rows);
    // Every row copied before any after(): a caller's step would overwrite the runner's rows.
    for (size_t r = 0; r < group.size(); ++r) gs[group[r]]->verified(int(r) * rows, rows, before[r]);
    if (after)
      for (size_t j : group) after(j, gs[j]->rows_);
  }
}

void GpuSession::use_policy() {
  // Sessions share the runner: another session may have set its own policy since.
  if (policy_ != nullptr && runner_.policy_epoch() != policy_epoch_) {
    runner_.set_policy(policy_->spec());
    policy_epoch_ = runner_.policy_epoch();
  }
}

// One decode step of this session's sequence; its counts become the pending step.
void GpuSession::decode_step(std::span<const int32_t> tokens, bool allow_policy) {
  cuda::GpuSeq* seqs[] = {&seq_};
  const bool with_policy = allow_policy && policy_ != nullptr;
  if (with_policy) use_policy();
  runner_.decode(seqs, tokens, with_policy, batch_invariant_);
  if (!allow_policy) {  // like the CPU session: a step outside the policy is not counted
    forward_ = runner_.forwards();
    row_ = 0;
    logits_valid_ = false;
    own_logits();
    return;
  }
  // Counted on the device in row 0: the copy and reset are queued right behind this step,
  // before any other session's step.
  stepped(0, with_policy ? runner_.take_token_reads_async() : cuda::Ticket{});
}

void GpuSession::stepped(int row, const cuda::Ticket& reads) {
  const ModelConfig& c = runner_.config();
  forward_ = runner_.forwards();
  row_ = row;
  logits_valid_ = false;
  own_logits();
  PendingStep p;
  p.active = true;
  p.row = row;
  const uint64_t n_ctx = uint64_t(seq_.length);
  p.counts.decode_steps = 1;
  p.counts.dense_token_reads = uint64_t(c.n_layers) * c.n_kv_heads * n_ctx;
  if (policy_ != nullptr) {
    p.reads = reads;
    for (int l = 0; l < c.n_layers; ++l) p.counts.metadata_bytes += policy_->metadata_bytes(l, int(n_ctx));
  } else {
    p.counts.token_reads = uint64_t(c.n_layers) * c.n_kv_heads * n_ctx;
  }
  pending_ = p;
}

void GpuSession::decode_together(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                                 const std::function<void(size_t)>& after) {
  const size_t n = sessions.size();
  std::vector<GpuSession*> gs(n);
  for (size_t i = 0; i < n; ++i) {
    gs[i] = dynamic_cast<GpuSession*>(sessions[i]);
    LY_CHECK(gs[i] != nullptr && &gs[i]->runner_ == &runner_, ErrorCode::kInvalidArgument,
             "decode_batch: session {} is not a GPU session of this runner", i);
    gs[i]->commit_pending();
  }
  const int max_batch = runner_.options().max_batch;
  const int invariant_rows = cuda::batch_invariant_rows(runner_.options());
  // Batch-invariant sessions share steps only with each other, in batches whose products take
  // the path a lone sequence's take.
  auto same_policy = [&](const GpuSession* a, const GpuSession* b) {
    if (a->batch_invariant_ != b->batch_invariant_) return false;
    if ((a->policy_ == nullptr) != (b->policy_ == nullptr)) return false;
    return a->policy_ == nullptr || a->policy_ == b->policy_ || a->policy_->spec() == b->policy_->spec();
  };
  std::vector<bool> done(n, false);
  std::vector<size_t> group;
  std::vector<cuda::GpuSeq*> seqs;
  std::vector<int32_t> group_tokens;
  for (size_t first = 0; first < n; ++first) {
    if (done[first]) continue;
    group.clear();
    const int rows = gs[first]->batch_invariant_ ? invariant_rows : max_batch;
    for (size_t j = first; j < n && int(group.size()) < rows; ++j)
      if (!done[j] && same_policy(gs[first], gs[j])) {
        group.push_back(j);
        done[j] = true;
      }
    GpuSession& lead = *gs[first];
    const bool with_policy = lead.policy_ != nullptr;
    if (with_policy) {
      lead.use_policy();
      for (size_t j : group) gs[j]->policy_epoch_ = lead.policy_epoch_;  // the same spec is in force
    }
    seqs.clear();
    group_tokens.clear();
    for (size_t j : group) {
      seqs.push_back(&gs[j]->seq_);
      group_tokens.push_back(tokens[j]);
    }
    runner_.decode(seqs, group_tokens, with_policy, lead.batch_invariant_);
    const cuda::Ticket reads = with_policy ? runner_.take_token_reads_async() : cuda::Ticket{};
    for (size_t r = 0; r < group.size(); ++r) gs[group[r]]->stepped(int(r), reads);
    if (after)
      for (size_t j : group) after(j);
  }
}

void GpuSession::commit_pending() const {
  if (!pending_.active) return;
  PendingStep p = pending_;
  pending_ = {};
  if (p.reads.id != 0) p.counts.token_reads += runner_.token_reads(p.reads)[size_t(p.row)];
  stats_.decode_steps += p.counts.decode_steps;
  stats_.dense_token_reads += p.counts.dense_token_reads;
  stats_.token_reads += p.counts.token_reads;
  stats_.metadata_bytes += p.counts.metadata_bytes;
}

const KvReadStats& GpuSession::stats() const {
  commit_pending();
  return stats_;
}

void GpuSession::reset_stats() {
  commit_pending();
  stats_ = {};
}

// The runner's logits rows belong to its last forward pass: reading them after another session
// stepped would silently give that session's logits.
void GpuSession::check_last_forward() const {
  LY_CHECK(runner_.forwards() == forward_, ErrorCode::kInternal,
           "GPU session: another session ran a forward pass on the shared runner since this session's last "
           "step; read this session's logits (or sample) before stepping another");
}

std::span<const float> GpuSession::logits() {
  if (!logits_valid_) {
    check_last_forward();
    runner_.copy_logits(row_, logits_);
    logits_valid_ = true;
  }
  return logits_;
}

cuda::Ticket GpuSession::queue_sample(Sampler& sampler) {
  check_last_forward();
  const SamplingParams& p = sampler.params();
  // Row row_ alone: the same draw as this sequence decoded on its own.
  if (p.temperature == 0.0f) return runner_.greedy_row_async(row_);
  return runner_.sample_row_async(row_, p.temperature, p.top_k, p.top_p, p.seed, uint64_t(seq_.length));
}

int32_t GpuSession::sample(Sampler& sampler) {
  commit_pending();
  int32_t token = 0;
  runner_.wait_tokens(queue_sample(sampler), std::span<int32_t>(&token, 1));
  return token;
}

int32_t GpuSession::sample_and_feed(Sampler& sampler, bool feed_next, bool allow_policy) {
  commit_pending();
  const cuda::Ticket t = queue_sample(sampler);
  if (feed_next && row_ != 0) {  // a device-side feed reads row 0: after a batched step, feed from the host
    int32_t token = 0;
    runner_.wait_tokens(t, std::span<int32_t>(&token, 1));
    feed(std::span<const int32_t>(&token, 1), allow_policy);
    return token;
  }
  if (feed_next) {
    LY_CHECK(seq_.length + 1 <= capacity_, ErrorCode::kCapacity,
             "KV cache full: {} cached + 1 new token exceed the session's {} tokens", seq_.length, capacity_);
    LY_CHECK(seq_.length > 0, ErrorCode::kInvalidArgument, "sample_and_feed before any prefill");
    decode_step({}, allow_policy);  // fed the token just sampled, on the device
  }
  int32_t token = 0;
  runner_.wait_tokens(t, std::span<int32_t>(&token, 1));
  return token;
}

void GpuSession::truncate(int n) {
  if (pending_.active && n == seq_.length - 1) pending_ = {};  // a pipelined step dropped: not counted
  commit_pending();
  runner_.truncate(seq_, n);
  logits_valid_ = false;
}

void GpuSession::copy_prefix(const Session& from, int n) {
  const auto* other = dynamic_cast<const GpuSession*>(&from);
  LY_CHECK(other != nullptr && &other->runner_ == &runner_, ErrorCode::kInvalidArgument,
           "a GPU session copies a prefix only from a session of the same runner");
  LY_CHECK(n <= capacity_, ErrorCode::kCapacity, "a prefix of {} tokens exceeds the session's {} tokens", n,
           capacity_);
  commit_pending();
  runner_.share_prefix(other->seq_, seq_, n);
  logits_valid_ = false;
  if (policy_ != nullptr) policy_->reset();
}

void GpuSession::set_policy(AttentionPolicy* policy) {
  runner_.set_policy(policy != nullptr ? policy->spec() : full_spec(runner_.config()));
  policy_epoch_ = runner_.policy_epoch();
  policy_ = policy;
  if (policy_ != nullptr) policy_->reset();
}

}  // namespace lychee
