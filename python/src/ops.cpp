// lychee._ops: the hybrid-head decode attention (with its fused page/token scoring), its host
// planner and the GPU selection, on CUDA tensors handed over through DLPack (torch tensors via
// nb::ndarray: no copies) and launched on the caller's stream (the Python wrapper passes
// torch.cuda.current_stream().cuda_stream). Every tensor is checked here for dtype, device,
// rank and contiguity, and its shape against the others, before anything is launched; the
// kernels' own checks (check_decode_args, check_select_args) follow. Python users call
// lychee.ops, which builds the plan and the work buffers and checks list and score sizes
// against the plan.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "core/error.h"
#include "cuda/common/common.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/kernels/select.h"

namespace nb = nanobind;

namespace lychee::py {

namespace {

using Array = nb::ndarray<>;
namespace dl = nb::dlpack;

constexpr dl::dtype kBf16{uint8_t(dl::dtype_code::Bfloat), 16, 1};
constexpr dl::dtype kF32{uint8_t(dl::dtype_code::Float), 32, 1};
constexpr dl::dtype kI32{uint8_t(dl::dtype_code::Int), 32, 1};
// token_reads is int64 on the Python side (torch exports int64 through DLPack everywhere, uint64 not
// in every version); the kernel adds to it as unsigned long long, the same bits below 2^63.
constexpr dl::dtype kI64{uint8_t(dl::dtype_code::Int), 64, 1};
constexpr int kItemWords = int(sizeof(cuda::DecodeWorkItem) / sizeof(int32_t));
static_assert(sizeof(cuda::DecodeWorkItem) % sizeof(int32_t) == 0);

std::string dtype_name(dl::dtype t) {
  const char* code = t.code == uint8_t(dl::dtype_code::Int)      ? "int"
                     : t.code == uint8_t(dl::dtype_code::UInt)   ? "uint"
                     : t.code == uint8_t(dl::dtype_code::Float)  ? "float"
                     : t.code == uint8_t(dl::dtype_code::Bfloat) ? "bfloat"
                                                                 : "other";
  return fmt::format("{}{}", code, t.bits);
}

std::string shape_of(const Array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += fmt::format("{}{}", i ? ", " : "", a.shape(i));
  return s + "]";
}

// Checks one tensor: a CUDA tensor on `device` (the first tensor's, -1 = take it), of `dtype`,
// rank shape.size(), C-contiguous, each dimension equal to shape[i] unless that is -1.
// Error(kInvalidArgument) "op: name: expected ..., got ...".
void check(const char* op, const char* name, const Array& a, dl::dtype dtype, std::vector<int64_t> shape,
           int& device) {
  LY_CHECK(a.device_type() == nb::device::cuda::value, ErrorCode::kInvalidArgument,
           "{}: {} must be a CUDA tensor, got one on device type {} (1 = CPU)", op, name, a.device_type());
  if (device < 0) device = a.device_id();
  LY_CHECK(a.device_id() == device, ErrorCode::kInvalidArgument, "{}: {} is on cuda:{}, the other tensors on cuda:{}",
           op, name, a.device_id(), device);
  LY_CHECK(a.dtype() == dtype, ErrorCode::kInvalidArgument, "{}: {} must be {}, got {}", op, name, dtype_name(dtype),
           dtype_name(a.dtype()));
  LY_CHECK(a.ndim() == shape.size(), ErrorCode::kInvalidArgument, "{}: {} must have {} dimensions, got shape {}", op,
           name, shape.size(), shape_of(a));
  int64_t stride = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    LY_CHECK(shape[i] < 0 || int64_t(a.shape(i)) == shape[i], ErrorCode::kInvalidArgument,
             "{}: {} has shape {}; dimension {} must be {}", op, name, shape_of(a), i, shape[i]);
    LY_CHECK(a.shape(i) <= 1 || a.stride(i) == stride, ErrorCode::kInvalidArgument,
             "{}: {} must be contiguous (call .contiguous()), shape {}", op, name, shape_of(a));
    stride *= int64_t(a.shape(i));
  }
}

template <typename T>
T* ptr(const Array& a) {
  return static_cast<T*>(a.data());
}

// Runs `f` with `device` current, restoring the caller's device after.
template <typename F>
void on_device(int device, F&& f) {
  int previous = 0;
  LY_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device) LY_CUDA_CHECK(cudaSetDevice(device));
  try {
    f();
  } catch (...) {
    if (previous != device) cudaSetDevice(previous);
    throw;
  }
  if (previous != device) LY_CUDA_CHECK(cudaSetDevice(previous));
}

cuda::ListKind list_kind(int v) {
  LY_CHECK(v >= 0 && v <= 2, ErrorCode::kInvalidArgument, "plan_decode: kind {} (0 dense, 1 units, 2 window)", v);
  return cuda::ListKind(v);
}
cuda::ScoreKind score_kind(int v) {
  LY_CHECK(v >= 0 && v <= 3, ErrorCode::kInvalidArgument,
           "plan_decode: score {} (0 none, 1 group_chunk16, 2 group_token, 3 row_token)", v);
  return cuda::ScoreKind(v);
}

using HeadTuple = std::tuple<int, int, int, int, int, int, int, int, int, int>;
// (seq, kv_head, n_entries, unit, row_begin, n_rows, kind, score, list, count)

// The host planner over heads given as tuples; returns (items as n_items * kItemWords int32
// words, merge_begin, merge_count, n_slots).
nb::tuple plan(const std::vector<HeadTuple>& heads, int batch, int n_heads, int n_kv_heads, int sm_count,
               int ctas_per_sm, int min_tokens_per_split, int max_items) {
  std::vector<cuda::DecodeHeadWork> work;
  work.reserve(heads.size());
  for (const auto& [seq, kv, n, unit, row_begin, n_rows, kind, score, list, count] : heads) {
    LY_CHECK(seq >= 0 && seq < batch && kv >= 0 && kv < n_kv_heads, ErrorCode::kInvalidArgument,
             "plan_decode: head (seq {}, kv_head {}) outside batch {} x {} KV heads", seq, kv, batch, n_kv_heads);
    LY_CHECK(n >= 0 && unit >= 1, ErrorCode::kInvalidArgument, "plan_decode: head (seq {}, kv_head {}): n_entries {} "
             "must be >= 0 and unit {} >= 1", seq, kv, n, unit);
    cuda::DecodeHeadWork w;
    w.seq = seq, w.kv_head = kv, w.n_entries = n, w.unit = unit, w.row_begin = row_begin, w.n_rows = n_rows;
    w.kind = list_kind(kind), w.score = score_kind(score), w.list = list, w.count = count;
    work.push_back(w);
  }
  const cuda::DecodePlan p = cuda::plan_decode(work, batch, n_heads, n_kv_heads, sm_count, ctas_per_sm,
                                               min_tokens_per_split, max_items);
  std::vector<int32_t> words(p.items.size() * kItemWords);
  std::memcpy(words.data(), p.items.data(), words.size() * sizeof(int32_t));
  return nb::make_tuple(words, p.merge_begin, p.merge_count, p.n_slots);
}

std::vector<HeadTuple> dense_heads(const std::vector<int32_t>& seq_lens, int n_kv_heads, int group, int page_size,
                                   int max_pages) {
  std::vector<HeadTuple> out;
  for (const cuda::DecodeHeadWork& w : cuda::dense_decode_heads(seq_lens, n_kv_heads, group, page_size, max_pages))
    out.emplace_back(w.seq, w.kv_head, w.n_entries, w.unit, w.row_begin, w.n_rows, int(w.kind), int(w.score), w.list,
                     w.count);
  return out;
}

// One launch of the hybrid kernel and its merge. Shapes: q [batch][n_heads][head_dim] bf16,
// k_pool / v_pool [n_pages][n_kv_heads][page_size][head_dim] bf16, block_table [batch][max_pages]
// int32, seq_lens [batch] int32, items [max_items][kItemWords] int32 (a plan), n_items [1] int32,
// merge_begin / merge_count [batch * n_heads] int32, partial_o [slots][group][head_dim] f32,
// partial_lse [slots][group] f32, out [batch][n_heads][head_dim] bf16; unit_lists / list_counts
// int32 (1-D, or None), scores [rows][stride] f32 (or None: no item scores),
// token_reads [batch] int64 (or None).
void decode_attention_op(const Array& q, const Array& k_pool, const Array& v_pool, const Array& block_table,
                      const Array& seq_lens, const Array& items, const Array& n_items, const Array& merge_begin,
                      const Array& merge_count, const Array& partial_o, const Array& partial_lse, const Array& out,
                      const Array& unit_lists, const Array& list_counts, const Array& scores, const Array& token_reads,
                      int window_sink, int window_recent, float scale, uintptr_t stream) {
  const char* op = "decode_attention";
  int dev = -1;
  LY_CHECK(q.ndim() == 3, ErrorCode::kInvalidArgument, "{}: q must be [batch, n_heads, head_dim], got shape {}", op,
           shape_of(q));
  LY_CHECK(k_pool.ndim() == 4, ErrorCode::kInvalidArgument,
           "{}: k_cache must be [n_pages, n_kv_heads, page_size, head_dim], got shape {}", op, shape_of(k_pool));
  const int64_t batch = q.shape(0), n_heads = q.shape(1), d = q.shape(2);
  const int64_t n_pages = k_pool.shape(0), n_kv = k_pool.shape(1), ps = k_pool.shape(2);
  check(op, "q", q, kBf16, {-1, -1, -1}, dev);
  check(op, "k_cache", k_pool, kBf16, {-1, -1, -1, d}, dev);
  check(op, "v_cache", v_pool, kBf16, {n_pages, n_kv, ps, d}, dev);
  LY_CHECK(n_kv >= 1 && n_heads % n_kv == 0, ErrorCode::kInvalidArgument,
           "{}: q's {} heads are not a multiple of k_cache's {} KV heads", op, n_heads, n_kv);
  check(op, "block_table", block_table, kI32, {batch, -1}, dev);
  check(op, "seq_lens", seq_lens, kI32, {batch}, dev);
  check(op, "items", items, kI32, {-1, kItemWords}, dev);
  check(op, "n_items", n_items, kI32, {1}, dev);
  check(op, "merge_begin", merge_begin, kI32, {batch * n_heads}, dev);
  check(op, "merge_count", merge_count, kI32, {batch * n_heads}, dev);
  const int64_t group = n_heads / n_kv, max_items = items.shape(0);
  check(op, "partial_o", partial_o, kF32, {-1, group, d}, dev);
  check(op, "partial_lse", partial_lse, kF32, {int64_t(partial_o.shape(0)), group}, dev);
  LY_CHECK(int64_t(partial_o.shape(0)) >= max_items, ErrorCode::kInvalidArgument,
           "{}: partial_o has {} slots, fewer than the plan's {} items", op, partial_o.shape(0), max_items);
  check(op, "out", out, kBf16, {batch, n_heads, d}, dev);
  const bool lists = unit_lists.is_valid();
  if (lists) {
    LY_CHECK(list_counts.is_valid(), ErrorCode::kInvalidArgument, "{}: unit_lists needs list_counts", op);
    check(op, "unit_lists", unit_lists, kI32, {-1}, dev);
    check(op, "list_counts", list_counts, kI32, {-1}, dev);
  }
  const bool with_scores = scores.is_valid();
  if (with_scores) check(op, "scores", scores, kF32, {-1, -1}, dev);
  const bool reads = token_reads.is_valid();
  if (reads) check(op, "token_reads", token_reads, kI64, {batch}, dev);
  LY_CHECK(max_items >= 1, ErrorCode::kInvalidArgument, "{}: the plan has no work item", op);

  cuda::DecodeAttentionArgs a{};
  a.q = ptr<const cuda::bf16>(q);
  a.k_pool = ptr<const cuda::bf16>(k_pool);
  a.v_pool = ptr<const cuda::bf16>(v_pool);
  a.block_table = ptr<const int32_t>(block_table);
  a.unit_lists = lists ? ptr<const int32_t>(unit_lists) : nullptr;
  a.list_counts = lists ? ptr<const int32_t>(list_counts) : nullptr;
  a.seq_lens = ptr<const int32_t>(seq_lens);
  a.items = ptr<const cuda::DecodeWorkItem>(items);
  a.item_offset = nullptr;
  a.n_items = ptr<const int32_t>(n_items);
  a.merge_begin = ptr<const int32_t>(merge_begin);
  a.merge_count = ptr<const int32_t>(merge_count);
  a.partial_o = ptr<float>(partial_o);
  a.partial_lse = ptr<float>(partial_lse);
  a.out = ptr<cuda::bf16>(out);
  a.scores = with_scores ? ptr<float>(scores) : nullptr;
  a.score_stride = with_scores ? int(scores.shape(1)) : 0;
  a.token_reads = reads ? ptr<unsigned long long>(token_reads) : nullptr;
  a.window_sink = window_sink;
  a.window_recent = window_recent;
  a.batch = int(batch), a.n_heads = int(n_heads), a.n_kv_heads = int(n_kv), a.head_dim = int(d);
  a.page_size = int(ps), a.max_pages = int(block_table.shape(1));
  a.max_items = int(max_items);
  a.scale = scale;
  on_device(dev, [&] {
    nb::gil_scoped_release release;
    cuda::decode_attention(a, reinterpret_cast<cudaStream_t>(stream));
  });
}

// The selection kernel: scores [rows][score_stride] f32, seq_lens [batch] int32, heads [n_select]
// int32, lists / unit_scores [rows][list_stride] (int32 / f32), counts [rows] int32, where rows =
// batch * row_heads.
void select_units_op(const Array& scores, int score_unit, int unit, const Array& seq_lens, const Array& heads,
                  int row_heads, const Array& lists, const Array& counts, const Array& unit_scores,
                  const std::string& strategy, int budget, double value, int sink, int recent, float scale,
                  uintptr_t stream) {
  const char* op = "select_units";
  int dev = -1;
  check(op, "seq_lens", seq_lens, kI32, {-1}, dev);
  const int64_t batch = seq_lens.shape(0);
  LY_CHECK(row_heads >= 1, ErrorCode::kInvalidArgument, "{}: row_heads must be >= 1, got {}", op, row_heads);
  check(op, "scores", scores, kF32, {batch * row_heads, -1}, dev);
  check(op, "heads", heads, kI32, {-1}, dev);
  check(op, "lists", lists, kI32, {batch * row_heads, -1}, dev);
  check(op, "counts", counts, kI32, {batch * row_heads}, dev);
  check(op, "unit_scores", unit_scores, kF32, {batch * row_heads, int64_t(lists.shape(1))}, dev);
  cuda::SelectArgs a{};
  a.scores = ptr<const float>(scores);
  a.score_stride = int(scores.shape(1));
  a.score_unit = score_unit;
  a.unit = unit;
  a.seq_lens = ptr<const int32_t>(seq_lens);
  a.heads = ptr<const int32_t>(heads);
  a.n_select = int(heads.shape(0));
  a.row_heads = row_heads;
  a.lists = ptr<int32_t>(lists);
  a.counts = ptr<int32_t>(counts);
  a.unit_scores = ptr<float>(unit_scores);
  a.list_stride = int(lists.shape(1));
  a.strategy = parse_select_strategy(strategy);
  a.budget = budget;
  a.value = value;
  a.sink = sink;
  a.recent = recent;
  a.scale = scale;
  if (a.n_select == 0 || batch == 0) return;
  on_device(dev, [&] {
    nb::gil_scoped_release release;
    cuda::select_units(a, int(batch), reinterpret_cast<cudaStream_t>(stream));
  });
}

}  // namespace

}  // namespace lychee::py

NB_MODULE(_ops, m) {
  using namespace lychee;
  using namespace lychee::py;
  m.doc() = "lychee's CUDA kernels on DLPack tensors (use lychee.ops)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      // lychee.ops imports lychee first, so its error classes exist: raise the same kinds.
      nb::module_ lychee_mod = nb::module_::import_("lychee._lychee");
      const char* names[] = {"InvalidArgumentError", "InvalidFileError", "NotFoundError", "UnsupportedError",
                             "CapacityError",        "CudaError",        "InternalError"};
      nb::object cls = lychee_mod.attr(names[int(e.code())]);
      PyErr_SetString(cls.ptr(), e.what());
    }
  });
  m.attr("ITEM_WORDS") = kItemWords;
  m.def("cuda_status", &cuda::cuda_device_status, "\"\" when a CUDA device is usable, else why not");
  m.def("sm_count", [] { return cuda::device_info().sm_count; }, "Streaming multiprocessors of the current device");
  m.def("ctas_per_sm", &cuda::decode_attention_ctas_per_sm, nb::arg("head_dim"), nb::arg("page_size"),
        "Resident attention CTAs per SM (the planner's ctas_per_sm)");
  m.def("plan_decode", &plan, nb::arg("heads"), nb::arg("batch"), nb::arg("n_heads"), nb::arg("n_kv_heads"),
        nb::arg("sm_count"), nb::arg("ctas_per_sm"), nb::arg("min_tokens_per_split"), nb::arg("max_items"),
        "The host planner (cuda/kernels/decode_attention.h): heads as (seq, kv_head, n_entries, unit, row_begin, "
        "n_rows, kind, score, list, count) -> (items as n * ITEM_WORDS int32 words, merge_begin, merge_count, n_slots)");
  m.def("dense_heads", &dense_heads, nb::arg("seq_lens"), nb::arg("n_kv_heads"), nb::arg("group"),
        nb::arg("page_size"), nb::arg("max_pages"), "Dense attention's heads for plan_decode");
  m.def("decode_attention", &decode_attention_op, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("block_table"), nb::arg("seq_lens"), nb::arg("items"), nb::arg("n_items"), nb::arg("merge_begin"),
        nb::arg("merge_count"), nb::arg("partial_o"), nb::arg("partial_lse"), nb::arg("out"),
        nb::arg("unit_lists").none(), nb::arg("list_counts").none(), nb::arg("scores").none(),
        nb::arg("token_reads").none(), nb::arg("window_sink"),
        nb::arg("window_recent"), nb::arg("scale"), nb::arg("stream"));
  m.def("select_units", &select_units_op, nb::arg("scores"), nb::arg("score_unit"), nb::arg("unit"), nb::arg("seq_lens"),
        nb::arg("heads"), nb::arg("row_heads"), nb::arg("lists"), nb::arg("counts"), nb::arg("unit_scores"),
        nb::arg("strategy"), nb::arg("budget"), nb::arg("value"), nb::arg("sink"), nb::arg("recent"),
        nb::arg("scale"), nb::arg("stream"));
}
