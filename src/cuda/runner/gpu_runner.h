// The GPU forward pass over the paged KV cache: dense prefill in chunks, batched decode steps
// (one token per sequence, sequences of different lengths), optionally replayed from a CUDA
// graph per batch size, and sampling on the device. The interface has no CUDA types, so the
// runtime layer can hold a runner without including CUDA headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention/decode_spec.h"
#include "core/kv_dtype.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace lychee::cuda {

class GpuWeights;

// The checkpoint's weights on the GPU: bf16 linear matrices, or FP8 e4m3 with row scales (the
// values of the CPU's WeightFormat::kFp8; gpu_weights.h).
std::shared_ptr<const GpuWeights> upload_weights(const Checkpoint& ck, GpuWeightFormat format = GpuWeightFormat::kBf16,
                                                 const Fp8Keep& keep = {});
std::shared_ptr<const GpuWeights> random_weights(const ModelConfig& c, uint64_t seed,
                                                 GpuWeightFormat format = GpuWeightFormat::kBf16,
                                                 const Fp8Keep& keep = {});
// Tensor parallelism (docs/scaling.md): rank r runs on CUDA device devices[r] and holds the KV
// heads kv_heads[r] of every layer (their query heads with them; attention/tp_assign.h's
// tp_rank_heads of an assignment) and slice r of the MLP.
struct TpPlan {
  std::vector<int> devices;
  std::vector<std::vector<int>> kv_heads;
};
using ShardedWeights = std::vector<std::shared_ptr<const GpuWeights>>;
// Every rank's part, each uploaded to its device: from the checkpoint (ck), or (ck null) the
// random weights random_weights(c, seed, ...) would make, sliced. Errors name what does not
// divide (tp_assign.h's check_tensor_parallel) or a device that does not exist.
ShardedWeights shard_weights(const Checkpoint* ck, const ModelConfig& c, uint64_t seed, GpuWeightFormat format,
                             const Fp8Keep& keep, const TpPlan& plan);

// Bytes of weights a decode step of `batch` sequences reads.
uint64_t weight_bytes_per_step(const GpuWeights& w, int batch);
size_t weight_bytes(const GpuWeights& w);

struct RunnerOptions;
// The most rows a verification pass returns logits for (GpuRunner::prefill with all_logits):
// speculative decoding's γ + 1 (runtime/speculative.h's kMaxSpeculate + 1).
inline constexpr int kMaxVerifyRows = 17;
// Logits rows the runner holds: a decode step's batch or a verification pass's kMaxVerifyRows;
// also the most rows of a verification step (GpuRunner::verify_step_fits), whose fused products
// run in chunks of at most kBf16GemvMaxRows past the fused rows (fused_verify_chunks).
int logit_rows(const RunnerOptions& o);
// The shape part of GpuRunner::verify_step_fits, given the runner's fused_decode_rows (0: not
// fused): batch 1..max_batch, rows_per_seq 1..kDecodeMaxVerifyRows, the fused layers on, batch x
// rows_per_seq within their rows or (rows_per_seq > 1, fused_verify_chunks) past them in chunks,
// and within logit_rows. Pure (the CPU tests check the bounds).
bool verify_step_rows_fit(const RunnerOptions& o, int fused_rows, int batch, int rows_per_seq);

// The passes GpuRunner::prefill cuts n prompt tokens into: max_tokens each and the rest
// (pow2_tail 0), or the largest power of two within the rest and max_tokens while the rest is
// longer than pow2_tail tokens, then the rest in one pass. Pure; sums to n.
std::vector<int> prefill_pass_sizes(int n, int max_tokens, int pow2_tail = 0);
// The parts a pass of n tokens runs its attention in (RunnerOptions::prefill_attn_pow2_tail):
// prefill_pass_sizes(n, n, pow2_tail), or {n} with pow2_tail 0. At most kMaxAttnParts. Pure.
std::vector<int> prefill_attention_parts(int n, int pow2_tail);

// The most sequences a batch-invariant decode step takes (GpuRunner::decode): rows whose products
// all take the same path whatever their number.
int batch_invariant_rows(const RunnerOptions& o);

struct RunnerOptions {
  int page_size = 64;
  double kv_memory_gib = 0.0;  // 0: what max_batch sequences of max_context tokens need, capped by free memory
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBf16;  // the pages' element type (core/kv_dtype.h)
  int max_batch = 8;
  // Tokens per prefill forward (longer prompts are chunked). One prompt alone is faster in larger
  // passes (H200, 8B shape, 32K prompt: 1328 ms in passes of 2048, 1276 of 8192), but the server's
  // chunks are not multiples of a pass, and a pass's attention runs cuDNN's graph for its length
  // rounded up to a power of two (prefill_q_bucket) over the padded rows too: a 12812-token prompt
  // in one attention run per 8192-token pass spent 140 ms in attention against 101 in passes of
  // 2048, and the serving sweep at 16 clients x 32K gave 19.7 output tok/s against 21.7
  // (docs/results/gpu/session18/). With the attention in parts (prefill_attn_pow2_tail 512) that
  // prompt takes 388 ms against 393 in 2048-token passes and 435 without the parts, and the sweep
  // 22.5 against 21.8 tok/s at 16 clients, 20.7 against 21.1 at 4 (docs/results/gpu/session19/):
  // 8192 with the parts is the default.
  int max_prefill_tokens = 8192;
  // > 0: passes of power-of-two lengths down to this tail (prefill_pass_sizes): no padded query
  // rows in cuDNN's graph but the tail pass's, one more weight read per extra pass; 0: off. Lab
  // knob LYCHEE_PREFILL_POW2=<tail tokens> (512: 400 ms for the 12812-token prompt, session 19).
  int prefill_pow2_tail = 0;
  // > 0: a pass's attention alone in parts of power-of-two lengths down to this tail (the same
  // prefill_pass_sizes cut, each part a cuDNN run over the cache up to its own end; the products
  // stay one pass): no padded query rows but the tail part's, no extra weight reads; 0: one run per
  // pass. Lab knob LYCHEE_PREFILL_ATTN_POW2=<tail tokens>.
  int prefill_attn_pow2_tail = 512;
  int max_context = 0;            // 0: the model's
  bool cuda_graphs = true;
  // FP8 weights: decode-sized products through the FP8 GEMV (true), or every product through the
  // bf16 widening and cuBLASLt (false: the path bf16 weights take; the tests' reference and an A/B).
  bool fp8_gemv = true;
  // FP8 weights, products of more rows than the FP8 GEMV takes (prefill chunks): false (default)
  // widens the matrix to bf16 and runs cuBLASLt in bf16; true quantises the activation rows to
  // e4m3 too (a scale per row, quantize_activations_e4m3) and runs cuBLASLt's FP8 GEMM with per-row scales
  // on both operands (no widening pass: 1 byte per weight instead of 5), falling back to the
  // widening where cuBLASLt offers no such product. Opt-in until its quality (one more rounding
  // of every input row) and speed are measured; LYCHEE_FP8_PREFILL_GEMM=1 turns it on for the
  // engine (lab knob for that A/B).
  bool fp8_prefill_gemm = false;
  // bf16 weights: products of up to this many rows (decode steps, short prefill chunks) through
  // the engine's bf16 GEMV (cuda/kernels/bf16_gemv.h) instead of cuBLASLt; 0: cuBLASLt always.
  // LYCHEE_BF16_GEMV_ROWS=<0..8> in the environment replaces it (lab A/B).
  int bf16_gemv_max_rows = 8;
  // One GPU (bf16 weights, or FP8 ones with fp8_gemv: the same kernel reads the codes): decode
  // steps of up to this many rows run each layer as four products
  // with the per-token work folded in (bf16_gemv.h): the residual adds (and output/down biases) in
  // the output and down products' epilogues, which also write the next RMSNorm's weighted inputs
  // and sums of squares; the norm factors in the QKV, gate/up and LM-head products; SwiGLU in the
  // gate/up product's epilogue; no add_rmsnorm (but the first layer's) or silu_mul kernels.
  // 0: the unfused path. LYCHEE_FUSED_DECODE_ROWS=<0..8> replaces it (lab A/B).
  int fused_decode_max_rows = 8;
  // A verification step (GpuRunner::verify, rows_per_seq > 1) of more rows than
  // fused_decode_max_rows: true runs the fused decode layers anyway, every product as
  // ceil(rows / fused_decode_max_rows) calls on chunks of rows (a row's bits depend only on k,
  // bf16_gemv.h), so each row still equals a one-row Full decode step bit for bit and the step is
  // taken up to the logits rows (batch 4 x γ + 1 = 3: 12 rows) instead of the prefill pass's
  // verification. Compiled, not yet measured or verified on a GPU. false: such steps are refused
  // (verify_step_fits) and the prefill pass verifies. LYCHEE_FUSED_VERIFY=0|1 replaces it (lab A/B).
  bool fused_verify_chunks = true;
  // Fused decode layers: the products launched with programmatic dependent launch whatever their
  // size, as a mask of kPdlQkv, kPdlOutput, kPdlGateUp, kPdlDown (others: by size and grid,
  // bf16_gemv.h: the 8B's down product, a single wave, is launched with PDL that way).
  // Default: all but the down product, whose predecessor (gate/up) is the only multi-wave grid of
  // a layer. Measured on the H100, 8B shape, alternated (docs/results/gpu/decode_step/gemv_pdl/
  // per_product/): LycheeDecode b1 128K 6.98 -> 6.93 ms, b1 32K 6.35 -> 6.22, b4 32K 7.53 ->
  // 7.47; Full unchanged (11.49); the output product alone under PDL was slower (Full 11.55).
  // LYCHEE_FUSED_PDL=qkv,o,gate_up,down (any of them, or "none") replaces it (lab A/B).
  static constexpr int kPdlQkv = 1, kPdlOutput = 2, kPdlGateUp = 4, kPdlDown = 8;
  int fused_pdl_products = kPdlQkv | kPdlOutput | kPdlGateUp;
  // The mask of a comma-separated list of qkv, o, gate_up, down (or "none": 0), as
  // LYCHEE_FUSED_PDL gives it; kInvalidArgument naming the bad entry. Pure.
  static int parse_pdl_products(const std::string& list);
  // Fused decode layers: the QKV product's epilogue adds the bias, applies RoPE and writes Q and
  // the token's K/V into the pools (bf16_gemv.h's kQkvRope), where qkv_rope_append ran after it
  // (models with q/k norms keep that kernel). Measured (alternated twice): 8B b1 128K
  // LycheeDecode 6.93 -> 6.86 ms on the H100 (bf16), 3.93 -> 3.88 on the H200 (FP8); the default
  // model 1507 -> 1561 tok/s (H100); at 32K LycheeDecode 0.5-0.9% slower, not explained
  // (docs/results/gpu/decode_step/fused_rope/).
  // LYCHEE_FUSED_ROPE=0|1 replaces it (lab A/B).
  bool fused_qkv_rope = true;
  // Where the decode layers are not fused (tensor parallelism: the residual adds sit where the
  // all-reduces are; batches past fused_decode_max_rows) but the bf16 GEMV takes a product (rows
  // within bf16_gemv_max_rows; FP8 weights with fp8_gemv): the epilogues it still takes, as a mask
  // of kEpilogueRope (the QKV product's bias + RoPE + K/V append, kQkvRope, for models without q/k
  // norms, in place of qkv_rope_append) and kEpilogueSwiGlu (the gate/up product's SwiGLU, in place
  // of silu_mul). LYCHEE_GEMV_EPILOGUES=rope,swiglu (either, or "none") replaces it (lab A/B).
  static constexpr int kEpilogueRope = 1, kEpilogueSwiGlu = 2;
  int gemv_epilogues = kEpilogueRope | kEpilogueSwiGlu;
  // The mask of a comma-separated list of rope, swiglu (or "none": 0), as LYCHEE_GEMV_EPILOGUES
  // gives it; kInvalidArgument naming the bad entry. Pure.
  static int parse_gemv_epilogues(const std::string& list);
  // One GPU: run the all-reduces through NCCL anyway (a communicator of one rank: they change
  // nothing), so the tensor-parallel path is tested on one GPU.
  bool nccl = false;
  // Tests: ranks that share one device (a TpPlan naming a device more than once), their
  // all-reduce done without NCCL by a sum kernel and copies (for two ranks the very rounding of
  // NCCL's bf16 sum), steps run eagerly (cuda_graphs must be false: each rank's step is its own
  // graph, which cannot wait on another's). The sharded forward checked on one GPU.
  bool tp_one_device = false;
  // Tensor parallelism: the LM head split by vocabulary (rank r computes the logits of rows
  // [r V', (r + 1) V') of the output matrix, V' = ceil(V / N), gathered to rank 0 by an NCCL
  // all-gather), the default; false: computed whole by rank 0. Measured on two H200 (8B shape,
  // batch 1, 128K; docs/scaling.md): the split is 0.13 ms (Full) and 0.10 ms (LycheeDecode) per
  // token faster. With the FP8 lab LM head (LYCHEE_FP8_LM_HEAD) the split reads the bf16 matrix.
  bool tp_split_lm_head = true;
};

// What tensor parallelism moved: all-reduces run (two per layer per forward pass, graph replays
// included) and their bytes per rank (payload; on the wire, 2 (N-1)/N x payload on a ring).
struct TpStats {
  int ranks = 1;
  uint64_t all_reduces = 0;
  uint64_t payload_bytes = 0;
  double wire_bytes = 0;
  uint64_t selection_bytes = 0;  // selection sets sent between GPUs: none (each rank owns its KV-head indices)
  uint64_t lm_gathers = 0, lm_gather_bytes = 0;  // split LM head: all-gathers and their payload per rank
};

// A sequence's state: its pages (block table row) and length.
struct GpuSeq {
  std::vector<int32_t> pages;
  int length = 0;
  int quest_from = 0;   // page-bound metadata: the first position whose chunk metadata is not final ...
  int quest_epoch = -1; // ... as of this policy setting of the runner (set_policy starts a new one)
  // Identifies `pages` to the runner's device-side block table (0: not sent yet, or changed
  // other than by appending). A copy gets a new identity; a move keeps it.
  uint64_t table_id = 0;

  GpuSeq() = default;
  GpuSeq(const GpuSeq& o) : pages(o.pages), length(o.length), quest_from(o.quest_from), quest_epoch(o.quest_epoch) {}
  GpuSeq& operator=(const GpuSeq& o) {
    if (this != &o) *this = GpuSeq(o);
    return *this;
  }
  GpuSeq(GpuSeq&&) = default;
  GpuSeq& operator=(GpuSeq&&) = default;
};

// A queued device-to-host result (tokens or read counters): a slot of a small ring of pinned
// buffers and the event that says its copy is done.
struct Ticket {
  uint64_t id = 0;  // 0: none
  int batch = 0;
};
inline constexpr int kTicketRing = 64;

class GpuRunner {
 public:
  GpuRunner(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& options);
  // Tensor parallelism: one shard per rank (shard_weights), driven by this thread; NCCL
  // all-reduces join the ranks' partial outputs (cuda/common/nccl_comm.h). options.kv_memory_gib
  // is per GPU. Every other method works as with one GPU (sampling and logits on rank 0).
  GpuRunner(ShardedWeights shards, const RunnerOptions& options);
  ~GpuRunner();
  GpuRunner(const GpuRunner&) = delete;
  GpuRunner& operator=(const GpuRunner&) = delete;

  const ModelConfig& config() const;
  const RunnerOptions& options() const;
  int max_context() const;

  // Appends `tokens` to seq (dense causal attention, chunked); the last token's logits go to
  // logits row 0. all_logits (speculative verification): one forward pass over at most
  // kMaxVerifyRows tokens after a non-empty prefix, the logits of token i in row i. Its rows are
  // the prefill kernels' (a short chunk over a long cache: the split-KV fallback), equal to decode
  // steps of the same tokens within bf16 rounding, not bit for bit (CudaSpeculative tests).
  void prefill(GpuSeq& seq, std::span<const int32_t> tokens, bool all_logits = false);
  // One decode step: seqs[b] is fed tokens[b]; logits rows 0..B-1. With `tokens` empty, each
  // sequence is fed the token sampled for its row by the previous greedy()/sample() call (stays
  // on the device). With use_policy false the step attends densely whatever the policy.
  // batch_invariant: each sequence's logits are the same bits whatever else the batch holds (at
  // most batch_invariant_rows(options()) sequences; splits planned per head, fixed merge lanes):
  // what the server's seeded requests take.
  void decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, bool use_policy = true,
              bool batch_invariant = false);
  // Speculative verification as one decode step of R = rows_per_seq query positions per sequence:
  // seqs[b] is fed tokens[b R .. b R + R) at positions length .. length + R - 1 (K/V appended),
  // dense attention (the decode kernel's rows_per_seq: each sequence's KV read once, the R rows
  // causal among themselves), every product on the batch x R rows, the logits of token b R + r in
  // row b R + r; captured in a CUDA graph per (batch, R). Rows equal R successive dense decode
  // steps within bf16 rounding of another split-KV summation order (CudaSpeculative tests).
  // Where group x R passes one mma tile (16 rows) a head's positions are cut over several items,
  // each reading the KV (the 8B's group of 4: 4 positions an item). kUnsupported where
  // verify_step_fits says no (callers take prefill's all_logits pass then).
  void verify(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, int rows_per_seq);
  // Whether verify takes `batch` sequences of `rows_per_seq` rows: one GPU, bf16 KV pages (the FP8
  // reader serves 8 query rows), rows_per_seq <= kDecodeMaxVerifyRows, the fused decode layers on
  // (fused_decode_rows > 0), batch x rows_per_seq within their rows or, with
  // RunnerOptions::fused_verify_chunks and rows_per_seq > 1, past them (the products in chunks of
  // those rows: compiled, not yet verified on a GPU); each row then equals a Full decode step's bit
  // for bit. And within the logits rows and the activation buffers. Pure.
  bool verify_step_fits(int batch, int rows_per_seq) const;

  // The decode-attention policy of later steps (Full by default), as the backend-neutral
  // description every policy compiles to. Throws kUnsupported naming what the GPU path cannot
  // do (e.g. a LycheeDecode block size that does not divide the page), kInvalidArgument for a
  // spec that does not fit the model.
  void set_policy(const DecodeSpec& spec);
  // How many times decode steps rebuilt their split plans (they are reused while every head's
  // work is unchanged).
  int replans() const;
  // Changes with every set_policy, so that sessions sharing the runner can tell whether the
  // policy in force is still the one they set.
  int policy_epoch() const;
  // Forward passes run so far (prefill chunks and decode steps): the logits rows belong to the
  // last one.
  uint64_t forwards() const;
  // A caller that reads a logits row after later forward passes (a session sharing the runner,
  // GpuSession::keep_logits) registers f to run once, right before the next forward pass begins
  // (prefill or decode), while the rows still hold the last pass's logits. One function per owner:
  // a second registration replaces the first; cancel_before_next_forward drops it (an owner going
  // away).
  void call_before_next_forward(const void* owner, std::function<void()> f);
  void cancel_before_next_forward(const void* owner);
  // Tokens the policy's decode steps read per batch row since the last call (per layer and KV
  // head, the union over its query heads, as KvReadStats counts them); zeroes the counters.
  // Synchronises.
  std::vector<uint64_t> take_token_reads();
  // The same without waiting: queues the copy of the counters to the host and their reset on the
  // stream (so the counts are exactly those of the steps queued before); token_reads(ticket)
  // waits for that copy only.
  Ticket take_token_reads_async();
  std::vector<uint64_t> token_reads(const Ticket& t);

  // Device-side choice of the next token of rows 0..batch-1; copies the tokens to out.
  void greedy(int batch, std::span<int32_t> out);
  // Seeded draws: Philox(seed, row, counter), so a request's tokens depend on its seed and the
  // counter (sessions pass the sequence's length), not on other sampling on the device.
  void sample(int batch, float temperature, int top_k, float top_p, uint64_t seed, uint64_t counter,
              std::span<int32_t> out);
  // The same without waiting: the tokens are chosen and their copy to the host is queued; a
  // decode() with no tokens queued after this feeds them on the device. wait_tokens(ticket)
  // waits for that copy only, so a caller can queue the next step first and the device never
  // waits for the host (generate's pipelined loop). The last kTicketRing tickets stay readable.
  Ticket greedy_async(int batch);
  // Row `row` alone (batch 1 at that row, random subsequence 0: the same draw as the sequence
  // decoded by itself), its token left in that row for a device-side feed.
  Ticket greedy_row_async(int row);
  Ticket sample_row_async(int row, float temperature, int top_k, float top_p, uint64_t seed, uint64_t counter);
  Ticket sample_async(int batch, float temperature, int top_k, float top_p, uint64_t seed, uint64_t counter);
  void wait_tokens(const Ticket& t, std::span<int32_t> out);
  // Host waits on the device that found it still busy (metadata staging, plan uploads, token
  // and counter copies): a pipelined decode loop keeps this at zero in steady state.
  uint64_t host_stalls() const;
  // Copies logits row `row` ([vocab] f32) to the host.
  void copy_logits(int row, std::span<float> out);

  // Benchmarks only: take pages for `length` tokens without computing their K/V (the pool's
  // contents stand in; fill_kv_random makes them non-zero). Decode time does not depend on them.
  void assume_filled(GpuSeq& seq, int length);
  void fill_kv_random(uint64_t seed);

  void release(GpuSeq& seq);           // returns its pages to the pool
  // Prefix reuse: `to` (empty) takes the first n tokens of `from`: their full pages shared
  // (reference-counted), the partial last one copied to a page of its own.
  void share_prefix(const GpuSeq& from, GpuSeq& to, int n);
  int free_pages() const;
  void truncate(GpuSeq& seq, int n);   // keeps the first n tokens

  int n_pages() const;

  int tensor_parallel() const;
  // The most rows a decode step runs through the fused decode layers (RunnerOptions::
  // fused_decode_max_rows after the environment's override), or 0 where this runner cannot: a
  // product's input width not a multiple of 8 (16 for FP8 matrices), FP8 weights without the FP8
  // GEMV (RunnerOptions::fp8_gemv), tensor parallelism (or NCCL at one rank).
  int fused_decode_rows() const;
  TpStats tp_stats() const;
  // One decode step run eagerly (no graph) with each layer's attention timed on every rank (CUDA
  // events around the layer's selection-before and attention kernels): [rank][layer] ms. As
  // decode() otherwise; synchronises.
  std::vector<std::vector<float>> profile_decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens,
                                                 bool use_policy = true);
  // Tests: selection slot `slot` of batch row `row` after the last decode step (slot: a KV head
  // for per-KV-head sets, a query head for per-query-head ones, global numbering): its units,
  // sorted, and the score row the selection read (as the step's last scoring layer left it:
  // entry i covers tokens [i * score_unit, (i + 1) * score_unit); a unit scores the max of its
  // entries). Empty without sets. Synchronises.
  struct SelectionProbe {
    std::vector<int32_t> units;
    std::vector<float> scores;
    int score_unit = 1, unit = 1;
  };
  SelectionProbe selection(int row, int slot);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lychee::cuda
