// GpuStudent's construction: checks, the weights' upload (fused Q/K/V and gate/up, the RoPE
// table) and every device buffer, reserved once from max_context and max_targets.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "cuda/train/student_impl.h"

namespace lychee::cuda {

namespace {

constexpr size_t kAbsent = ~size_t(0);  // arena offset of an optional tensor the model lacks

const float* need(const WeightSource& ws, WeightId id, int layer) {
  const float* p = ws(id, layer);
  LY_CHECK(p != nullptr, ErrorCode::kNotFound, "GpuStudent: weight {} of layer {} is missing",
           weight_hf_name(weight_spec(id), layer), layer);
  return p;
}

// Where each host tensor goes in the one device arena, filled in take() order.
struct ArenaPlan {
  struct Piece { const float* src; size_t n; size_t offset; };  // src null: zeros
  std::vector<Piece> pieces;
  size_t total = 0;  // floats

  // Places parts back to back (fused rows) and returns the offset of the first.
  size_t take(std::initializer_list<std::pair<const float*, size_t>> parts) {
    const size_t start = total;
    for (const auto& [src, n] : parts) {
      pieces.push_back({src, n, total});
      total += n;
    }
    total = round_up(total, 64);  // 256-byte aligned tensors
    return start;
  }

  void upload(DeviceBuffer<float>& arena) const {
    arena = DeviceBuffer<float>(total);
    for (const Piece& p : pieces) {
      if (p.src != nullptr) {
        LY_CUDA_CHECK(cudaMemcpy(arena.data() + p.offset, p.src, p.n * sizeof(float), cudaMemcpyHostToDevice));
      } else {
        LY_CUDA_CHECK(cudaMemset(arena.data() + p.offset, 0, p.n * sizeof(float)));
      }
    }
  }
};

// Arena offsets of one layer's tensors in LayerWeights order, kAbsent for those it lacks.
using LayerOffsets = std::array<size_t, 12>;

LayerOffsets take_layer(ArenaPlan& arena, const WeightSource& ws, const ModelConfig& c, int l) {
  const size_t sd = size_t(c.d_model), sq = size_t(c.q_dim()), skv = size_t(c.kv_dim()), sff = size_t(c.d_ff),
               shd = size_t(c.head_dim);
  auto need_w = [&](WeightId id) { return need(ws, id, l); };
  auto opt_w = [&](WeightId id) { return ws(id, l); };
  const float *bq = opt_w(WeightId::kBq), *bk = opt_w(WeightId::kBk), *bv = opt_w(WeightId::kBv);
  const float *bg = opt_w(WeightId::kBGate), *bu = opt_w(WeightId::kBUp);
  LayerOffsets o;
  o[0] = arena.take({{need_w(WeightId::kAttnNorm), sd}});
  o[1] = arena.take(
      {{need_w(WeightId::kWq), sq * sd}, {need_w(WeightId::kWk), skv * sd}, {need_w(WeightId::kWv), skv * sd}});
  o[2] = bq || bk || bv ? arena.take({{bq, sq}, {bk, skv}, {bv, skv}}) : kAbsent;
  o[3] = c.qk_norm ? arena.take({{need_w(WeightId::kQNorm), shd}}) : kAbsent;
  o[4] = c.qk_norm ? arena.take({{need_w(WeightId::kKNorm), shd}}) : kAbsent;
  o[5] = arena.take({{need_w(WeightId::kWo), sd * sq}});
  o[6] = opt_w(WeightId::kBo) ? arena.take({{opt_w(WeightId::kBo), sd}}) : kAbsent;
  o[7] = arena.take({{need_w(WeightId::kFfnNorm), sd}});
  o[8] = arena.take({{need_w(WeightId::kWGate), sff * sd}, {need_w(WeightId::kWUp), sff * sd}});
  o[9] = bg || bu ? arena.take({{bg, sff}, {bu, sff}}) : kAbsent;
  o[10] = arena.take({{need_w(WeightId::kWDown), sd * sff}});
  o[11] = opt_w(WeightId::kBDown) ? arena.take({{opt_w(WeightId::kBDown), sd}}) : kAbsent;
  return o;
}

// RoPE tables cs, sn [max_context, hd / 2] f32: angle pos · inv_freq in double (as the fp64 oracle
// CpuStudent<double>; the f32 product of transformers differs by up to half an f32 ulp of the
// angle, 3e-5 rad at 700).
void rope_tables(const ModelConfig& c, const WeightSource& ws, int hd, int max_context, std::vector<float>& cs,
                 std::vector<float>& sn) {
  std::vector<float> inv_freq = rope_inv_freq(c);
  if (const float* factors = ws(WeightId::kRopeFreqs, 0))  // GGUF llama3 frequency factors
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] /= factors[i];
  const int half = hd / 2;
  cs.assign(size_t(max_context) * half, 0.0f);
  sn.assign(cs.size(), 0.0f);
  for (int pos = 0; pos < max_context; ++pos)
    for (int i = 0; i < half; ++i) {
      const double angle = double(pos) * double(inv_freq[size_t(i)]);
      cs[size_t(pos) * half + i] = float(std::cos(angle));
      sn[size_t(pos) * half + i] = float(std::sin(angle));
    }
}

}  // namespace

GpuStudent::Impl::Impl(const ModelConfig& config, const WeightSource& ws, const train::StudentOptions& o,
                       int mc, int mt, const GpuStudentTuning& tu)
    : c(config), opt(o), tuning(tu), max_context(mc), max_targets(mt) {
  LY_CHECK(c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 &&
               c.head_dim > 0 && c.head_dim % 2 == 0,
           ErrorCode::kInvalidArgument, "GpuStudent: bad model shape ({} layers, {} heads, {} KV heads, head_dim {})",
           c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
  LY_CHECK(max_context >= 2 && max_context <= c.max_context, ErrorCode::kInvalidArgument,
           "GpuStudent: max_context {} must be in [2, {}] (the model's context)", max_context, c.max_context);
  LY_CHECK(max_targets >= 1 && max_targets <= max_context, ErrorCode::kInvalidArgument,
           "GpuStudent: max_targets {} must be in [1, max_context {}]", max_targets, max_context);
  LY_CHECK(std::isfinite(opt.keep_ratio) && opt.keep_ratio > 0.0 && opt.keep_ratio <= 1.0,
           ErrorCode::kInvalidArgument, "GpuStudent: keep_ratio {} must be in (0, 1]", opt.keep_ratio);
  d = c.d_model, hd = c.head_dim, n_heads = c.n_heads, n_kv = c.n_kv_heads, group = c.group_size();
  q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = q_dim + 2 * kv_dim, ff = c.d_ff;
  vocab = c.vocab_size, n_layers = c.n_layers;
  scale = 1.0f / std::sqrt(float(hd));
  ld_max = int(round_up(size_t(max_context), 4));
  mask_words = (max_context + 31) / 32;
  use_flash = tuning.flash && opt.tf32 && ops::flash_supported(hd);
  const bool sdpa_shape = opt.tf32 && hd % 8 == 0 && hd <= 256;  // cuDNN's SDPA (validate_prefill_args)
  prefill_cudnn = tuning.prefill_cudnn && sdpa_shape;
  teacher_cudnn = tuning.teacher_cudnn && sdpa_shape;
  long_chunks = use_flash || prefill_cudnn;
  prefill_bf16 = tuning.prefill_bf16 && opt.tf32 && long_chunks;
  rows_mat = std::max(max_targets, std::min(kMinMaterialisedRows, max_context));
  act_rows = std::max(rows_mat, long_chunks ? std::min(kContextChunk, max_context) : 0);
  // The fused selection keeps the group sums of a row in shared memory up to ~56K columns (227
  // KiB per block on an H100), in a global scratch of n_kv × max_targets rows beyond; the separate
  // one (tuning.separate_selection) has its keys in the G buffer and the rows kernel the sets alone.
  const size_t smem_limit = ops::attention_forward_smem_limit();
  // The fused kernel at the longest rows: always with setting 0, never with 1; auto takes it only
  // where two of its blocks fit an SM, far below the limit.
  const size_t fused_smem_max = ops::attention_forward_smem_bytes(max_context, mask_words, true);
  const bool fused_at_max = !select_separately(tuning.separate_selection, fused_smem_max, device_info().smem_per_sm);
  keys_in_global = fused_at_max && fused_smem_max > smem_limit;
  const size_t sel_smem = ops::attention_forward_smem_bytes(max_context, mask_words, fused_at_max, !keys_in_global);
  LY_CHECK(sel_smem <= smem_limit, ErrorCode::kUnsupported,
           "GpuStudent: max_context {} needs {} KiB of shared memory per block for the selection's sets; "
           "this GPU allows {} KiB", max_context, sel_smem >> 10, smem_limit >> 10);

  LY_CUDA_CHECK(cudaGetDevice(&device));
  size_t free_before = 0, total_memory = 0;
  LY_CUDA_CHECK(cudaMemGetInfo(&free_before, &total_memory));
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : ev) LY_CUDA_CHECK(cudaEventCreate(&e));
  if (tuning.profile_layer >= 0)
    for (cudaEvent_t& e : marks) LY_CUDA_CHECK(cudaEventCreate(&e));
  check_blas(cublasCreate(&blas), "cublasCreate", __LINE__);
  check_blas(cublasSetStream(blas, stream), "cublasSetStream", __LINE__);
  blas_ws = DeviceBuffer<uint8_t>(kBlasWorkspaceBytes);
  check_blas(cublasSetWorkspace(blas, blas_ws.data(), blas_ws.bytes()), "cublasSetWorkspace", __LINE__);
  check_blas(cublasSetMathMode(blas, opt.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH),
             "cublasSetMathMode", __LINE__);
  try {
    upload_weights(ws);
    allocate();
  } catch (const Error& e) {  // a missing weight or no memory: the destructor of a half-built Impl never runs
    release();
    // Out of memory says what grows and what to cut, not only which cudaMalloc failed.
    const bool no_memory = e.code() == ErrorCode::kCuda &&
                           std::string_view(e.what()).find("cudaErrorMemoryAllocation") != std::string_view::npos;
    if (no_memory)
      fail(ErrorCode::kCapacity,
           "GpuStudent: out of memory on GPU {} ({:.1f} of {:.1f} GiB free before it) for samples of up to {} tokens "
           "with up to {} targets: the fp32 weights take {:.1f} GiB and the student's rows grow with context x "
           "targets; use fewer targets per sample or shorter samples (train-heads: --passkeys, --passkey-words, "
           "--max-len) or a GPU with more memory",
           device, double(free_before) / double(1ull << 30), double(total_memory) / double(1ull << 30), max_context,
           max_targets, double(c.n_params()) * 4.0 / double(1ull << 30));
    throw;
  } catch (...) {
    release();
    throw;
  }
}

GpuStudent::Impl::~Impl() { release(); }

void GpuStudent::Impl::release() {
  if (stream != nullptr) cudaSetDevice(device);  // the buffers' destructors run after this, on it too
  if (stream != nullptr) cudaStreamSynchronize(stream);
  sdpa.reset();  // its cuDNN handle was bound to the stream
  if (blas != nullptr) cublasDestroy(blas);
  for (cudaEvent_t e : ev)
    if (e != nullptr) cudaEventDestroy(e);
  for (cudaEvent_t e : marks)
    if (e != nullptr) cudaEventDestroy(e);
  if (stream != nullptr) cudaStreamDestroy(stream);
  blas = nullptr, stream = nullptr;
  for (cudaEvent_t& e : ev) e = nullptr;
  for (cudaEvent_t& e : marks) e = nullptr;
}

// One arena: fused Q/K/V and gate/up rows, biases fused with zeros for absent parts.
void GpuStudent::Impl::upload_weights(const WeightSource& ws) {
  ArenaPlan arena;
  const size_t sd = size_t(d);
  const float* emb_src = need(ws, WeightId::kTokEmbd, 0);
  const float* out_src = need(ws, WeightId::kOutput, 0);
  const size_t o_embed = arena.take({{emb_src, size_t(vocab) * sd}});
  const size_t o_output = out_src == emb_src ? o_embed : arena.take({{out_src, size_t(vocab) * sd}});
  const size_t o_onorm = arena.take({{need(ws, WeightId::kOutputNorm, 0), sd}});
  std::vector<LayerOffsets> lo(static_cast<size_t>(n_layers));
  for (int l = 0; l < n_layers; ++l) lo[size_t(l)] = take_layer(arena, ws, c, l);
  arena.upload(weights);
  if (prefill_bf16) {  // the layers' tensors rounded on the device (the host never holds a bf16 copy)
    bf16_base = lo[0][0];  // the first layer's first tensor: the embedding and LM head come before
    weights_bf16 = DeviceBuffer<uint16_t>(weights.size() - bf16_base);
    ops::round_to_bf16(weights.data() + bf16_base, weights_bf16.data(), weights_bf16.size(), stream);
    LY_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  const float* base = weights.data();
  auto at = [&](size_t off) { return off == kAbsent ? nullptr : base + off; };
  embed = at(o_embed), output = at(o_output), out_norm = at(o_onorm);
  lw.resize(size_t(n_layers));
  for (int l = 0; l < n_layers; ++l) {
    const auto& o = lo[size_t(l)];
    lw[size_t(l)] = {at(o[0]), at(o[1]), at(o[2]), at(o[3]), at(o[4]), at(o[5]),
                     at(o[6]), at(o[7]), at(o[8]), at(o[9]), at(o[10]), at(o[11])};
  }

  std::vector<float> cs, sn;
  rope_tables(c, ws, hd, max_context, cs, sn);
  rope_cos = DeviceBuffer<float>(cs.size());
  rope_sin = DeviceBuffer<float>(sn.size());
  LY_CUDA_CHECK(cudaMemcpy(rope_cos.data(), cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(rope_sin.data(), sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice));
}

void GpuStudent::Impl::allocate() {
  const size_t R = size_t(act_rows), Tm = size_t(max_targets), NL = size_t(n_layers);
  kv = DeviceBuffer<float>(NL * 2 * n_kv * size_t(max_context) * hd);
  x = DeviceBuffer<float>(R * d);
  if (prefill_bf16) act_bf16 = DeviceBuffer<uint16_t>(R * size_t(std::max({d, q_dim, ff})));
  h = DeviceBuffer<float>(R * d);
  qkv = DeviceBuffer<float>(R * qkv_dim);
  q = DeviceBuffer<float>(R * q_dim);
  att = DeviceBuffer<float>(R * q_dim);
  gu = DeviceBuffer<float>(R * 2 * ff);
  m = DeviceBuffer<float>(R * ff);
  s_buf = DeviceBuffer<float>(size_t(n_heads) * rows_mat * ld_max);
  if (use_flash) flash_scratch = DeviceBuffer<float>(size_t(ops::kMaxFlashSplits) * Tm * (q_dim + 2 * n_heads));
  if (prefill_cudnn || teacher_cudnn) {
    sdpa = std::make_unique<PrefillAttention>();
    // cuDNN's graph pads the query rows to their power-of-two bucket (prefill_q_bucket).
    const size_t q_rows = size_t(prefill_q_bucket(int(R), int(round_up(size_t(max_context), 64))));
    q_bf16 = DeviceBuffer<uint16_t>(q_rows * q_dim);
    o_bf16 = DeviceBuffer<uint16_t>(q_rows * q_dim);
    ld_sdpa = int(round_up(size_t(max_context), 64));
    kv_bf16 = DeviceBuffer<uint16_t>(size_t(2) * n_kv * size_t(ld_sdpa) * hd);
    // Rows past a call's keys are read by whole tiles and masked: finite values there (0 · NaN is NaN).
    LY_CUDA_CHECK(cudaMemset(kv_bf16.data(), 0, kv_bf16.bytes()));
    LY_CUDA_CHECK(cudaMemset(q_bf16.data(), 0, q_bf16.bytes()));
    sdpa_meta = DeviceBuffer<int32_t>(3);
  }
  g_buf = DeviceBuffer<float>(size_t(n_heads) * Tm * ld_max);
  if (tuning.store_logits) s_store = DeviceBuffer<float>(NL * n_heads * Tm * ld_max);
  xs = DeviceBuffer<float>((NL + 1) * Tm * d);
  x2s = DeviceBuffer<float>(NL * Tm * d);
  qkvs = DeviceBuffer<float>(NL * Tm * qkv_dim);
  qs = DeviceBuffer<float>(NL * Tm * q_dim);
  gus = DeviceBuffer<float>(NL * Tm * 2 * ff);
  stats = DeviceBuffer<float4>(NL * n_heads * Tm);
  masks = DeviceBuffer<uint32_t>(NL * n_kv * Tm * mask_words);
  if (keys_in_global) select_keys = DeviceBuffer<float>(size_t(n_kv) * Tm * ld_max);
  hfin = DeviceBuffer<float>(Tm * d);
  const size_t out_width = opt.loss == train::DistillLoss::kLogits ? size_t(vocab) : size_t(d);
  if (opt.loss == train::DistillLoss::kLogits) logits = DeviceBuffer<float>(Tm * vocab);
  teacher_out = DeviceBuffer<float>(Tm * out_width);
  dx = DeviceBuffer<float>(Tm * d);
  dh = DeviceBuffer<float>(Tm * d);
  dqkv = DeviceBuffer<float>(Tm * qkv_dim);
  da = DeviceBuffer<float>(Tm * q_dim);
  dgu = DeviceBuffer<float>(Tm * 2 * ff);
  dm = DeviceBuffer<float>(Tm * ff);
  dq = DeviceBuffer<float>(Tm * q_dim);
  dk = DeviceBuffer<float>(Tm * kv_dim);
  dv = DeviceBuffer<float>(Tm * kv_dim);
  w_tail = DeviceBuffer<float>(size_t(n_heads) * Tm * Tm);
  dz_part = DeviceBuffer<float>(size_t(n_kv) * Tm);
  dz_dev = DeviceBuffer<float>(NL * n_kv);
  z_dev = DeviceBuffer<float>(NL * n_kv);
  loss_partials = DeviceBuffer<double>(ops::kLossBlocks);
  loss_dev = DeviceBuffer<double>(1);
  ctx_tokens = DeviceBuffer<int32_t>(size_t(max_context));
  tgt_tokens = DeviceBuffer<int32_t>(Tm);
  ctx_pinned = PinnedBuffer<int32_t>(size_t(max_context));
  tgt_pinned = PinnedBuffer<int32_t>(Tm);
  z_pinned = PinnedBuffer<float>(NL * n_kv);
  dz_pinned = PinnedBuffer<float>(NL * n_kv);
  loss_pinned = PinnedBuffer<double>(1);
}

GpuStudent::GpuStudent(const ModelConfig& config, const HostWeights& weights, const train::StudentOptions& options,
                       int max_context, int max_targets, const GpuStudentTuning& tuning)
    : GpuStudent(config, WeightSource([&weights](WeightId id, int layer) { return weights.get(id, layer); }),
                 options, max_context, max_targets, tuning) {}

GpuStudent::GpuStudent(const ModelConfig& config, const WeightSource& weights, const train::StudentOptions& options,
                       int max_context, int max_targets, const GpuStudentTuning& tuning)
    : impl_(std::make_unique<Impl>(config, weights, options, max_context, max_targets, tuning)) {}

GpuStudent::~GpuStudent() = default;

bool select_separately(int setting, size_t fused_smem_bytes, size_t smem_per_sm) {
  if (setting >= 0) return setting == 1;
  return 2 * fused_smem_bytes > smem_per_sm;
}

size_t GpuStudent::memory_bytes() const {
  const Impl& s = *impl_;  // host-side sizes only: no device call
  size_t total = s.blas_ws.bytes() + s.weights.bytes() + s.rope_cos.bytes() + s.rope_sin.bytes() + s.kv.bytes() +
                 s.weights_bf16.bytes() + s.act_bf16.bytes() + s.kv_bf16.bytes() + s.q_bf16.bytes() +
                 s.o_bf16.bytes() + s.sdpa_meta.bytes();
  for (const DeviceBuffer<float>* b : {&s.x, &s.h, &s.qkv, &s.q, &s.att, &s.gu, &s.m, &s.s_buf, &s.g_buf,
                                       &s.s_store, &s.xs, &s.x2s, &s.qkvs, &s.qs, &s.gus, &s.hfin, &s.logits,
                                       &s.teacher_out, &s.dx, &s.dh, &s.dqkv, &s.da, &s.dgu, &s.dm, &s.dq, &s.dk,
                                       &s.dv, &s.w_tail, &s.dz_part, &s.dz_dev, &s.z_dev, &s.flash_scratch,
                                       &s.select_keys})
    total += b->bytes();
  return total + s.stats.bytes() + s.masks.bytes() + s.ctx_tokens.bytes() + s.tgt_tokens.bytes();
}

}  // namespace lychee::cuda
