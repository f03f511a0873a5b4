#include "attention/tp_assign.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace lychee {

namespace {

void check_roles_shape(const ModelConfig& c, const HeadRoles& roles) {
  LY_CHECK(roles.n_layers == c.n_layers && roles.n_kv_heads == c.n_kv_heads &&
               roles.retrieval.size() == size_t(c.n_layers) * size_t(c.n_kv_heads),
           ErrorCode::kInvalidArgument,
           "tensor parallel: head roles are {} layers x {} KV heads, the model {} layers x {} KV heads",
           roles.n_layers, roles.n_kv_heads, c.n_layers, c.n_kv_heads);
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The partition search of tp_assign_permutation. Groups are unlabelled: a head may join an open
// group or open the next one, so each partition is visited once. The bound is
// sum_l max(current max of layer l, ceil(r_l / N)), which only grows as heads are placed.
class PartitionSearch {
 public:
  PartitionSearch(const HeadRoles& roles, int n_gpus, uint64_t max_nodes)
      : L_(roles.n_layers), H_(roles.n_kv_heads), N_(n_gpus), k_(H_ / N_), max_nodes_(max_nodes),
        layers_of_(size_t(H_)), lb_(size_t(L_)), cnt_(size_t(L_) * size_t(N_), 0), cur_max_(size_t(L_), 0),
        group_(size_t(H_), -1), size_(size_t(N_), 0) {
    for (int l = 0; l < L_; ++l) {
      int r = 0;
      for (int h = 0; h < H_; ++h)
        if (roles.is_retrieval(l, h)) {
          layers_of_[size_t(h)].push_back(l);
          ++r;
        }
      lb_[size_t(l)] = ceil_div(r, N_);
      floor_ += lb_[size_t(l)];
    }
    bound_ = floor_;
    order_.resize(size_t(H_));
    std::iota(order_.begin(), order_.end(), 0);
    // Heads with many retrieval layers first: the bound rises early and prunes more.
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return layers_of_[size_t(a)].size() > layers_of_[size_t(b)].size(); });
  }

  int floor() const { return floor_; }

  // Improves on `best` (group per head, cost best_cost); returns whether the search finished.
  bool run(std::vector<int>& best, int& best_cost) {
    best_ = &best;
    best_cost_ = &best_cost;
    place(0, 0);
    return !aborted_;
  }

 private:
  void place(int depth, int n_open) {
    if (aborted_ || *best_cost_ == floor_) return;
    if (++nodes_ > max_nodes_) {
      aborted_ = true;
      return;
    }
    if (depth == H_) {
      *best_ = group_;
      *best_cost_ = bound_;  // complete: the bound is the cost
      return;
    }
    const int h = order_[size_t(depth)];
    for (int g = 0; g < std::min(n_open + 1, N_); ++g) {
      if (size_[size_t(g)] == k_) continue;
      const int saved_bound = bound_;
      add(h, g, +1);
      if (bound_ < *best_cost_) place(depth + 1, std::max(n_open, g + 1));
      add(h, g, -1);
      bound_ = saved_bound;
      if (aborted_) return;
    }
  }

  // Adds (+1) or removes (-1) head h to group g; adding keeps cur_max_ and bound_ current, removing
  // restores cur_max_ from the counts (the caller restores bound_).
  void add(int h, int g, int d) {
    group_[size_t(h)] = d > 0 ? g : -1;
    size_[size_t(g)] += d;
    for (int l : layers_of_[size_t(h)]) {
      int& c = cnt_[size_t(l) * size_t(N_) + size_t(g)];
      c += d;
      int& m = cur_max_[size_t(l)];
      if (d > 0 && c > m) {
        if (m >= lb_[size_t(l)]) ++bound_;
        m = c;
      } else if (d < 0 && c + 1 == m) {
        const int* row = &cnt_[size_t(l) * size_t(N_)];
        m = *std::max_element(row, row + N_);
      }
    }
  }

  int L_, H_, N_, k_;
  uint64_t max_nodes_, nodes_ = 0;
  bool aborted_ = false;
  std::vector<std::vector<int>> layers_of_;  // [H] the layers where head h is retrieval
  std::vector<int> lb_;                       // [L] ceil(r_l / N)
  std::vector<int> cnt_;                      // [L][N] retrieval heads of layer l in group g
  std::vector<int> cur_max_;                  // [L]
  std::vector<int> group_;                    // [H] group of head h, -1 unplaced
  std::vector<int> size_;                     // [N] heads in group g
  std::vector<int> order_;                    // [H] placement order
  int floor_ = 0, bound_ = 0;
  std::vector<int>* best_ = nullptr;
  int* best_cost_ = nullptr;
};

// sum_l max_g (retrieval heads of layer l in group g) of a partition (group per head).
int partition_cost(const HeadRoles& roles, const std::vector<int>& group, int n_gpus) {
  int cost = 0;
  std::vector<int> cnt(static_cast<size_t>(n_gpus));
  for (int l = 0; l < roles.n_layers; ++l) {
    std::fill(cnt.begin(), cnt.end(), 0);
    for (int h = 0; h < roles.n_kv_heads; ++h)
      if (roles.is_retrieval(l, h)) ++cnt[size_t(group[size_t(h)])];
    cost += *std::max_element(cnt.begin(), cnt.end());
  }
  return cost;
}

// Pairwise swaps between groups while one lowers the cost (first improvement, fixed order).
void swap_descent(const HeadRoles& roles, std::vector<int>& group, int& cost, int n_gpus) {
  for (bool improved = true; improved;) {
    improved = false;
    for (int a = 0; a < roles.n_kv_heads; ++a)
      for (int b = a + 1; b < roles.n_kv_heads; ++b) {
        if (group[size_t(a)] == group[size_t(b)]) continue;
        std::swap(group[size_t(a)], group[size_t(b)]);
        const int c = partition_cost(roles, group, n_gpus);
        if (c < cost) {
          cost = c;
          improved = true;
        } else {
          std::swap(group[size_t(a)], group[size_t(b)]);
        }
      }
  }
}

// GPU labels in order of each group's lowest KV-head index (GPU 0 owns head 0).
std::vector<int> canonical_labels(const std::vector<int>& group, int n_gpus) {
  std::vector<int> label(size_t(n_gpus), -1), out(group.size());
  int next = 0;
  for (size_t h = 0; h < group.size(); ++h) {
    int& lab = label[size_t(group[h])];
    if (lab < 0) lab = next++;
    out[h] = lab;
  }
  return out;
}

TpAssignment from_partition(const ModelConfig& c, int n_gpus, TpRule rule, const std::vector<int>& group) {
  TpAssignment a;
  a.rule = rule;
  a.n_gpus = n_gpus;
  a.n_layers = c.n_layers;
  a.n_kv_heads = c.n_kv_heads;
  a.gpu.reserve(size_t(c.n_layers) * size_t(c.n_kv_heads));
  for (int l = 0; l < c.n_layers; ++l) a.gpu.insert(a.gpu.end(), group.begin(), group.end());
  return a;
}

}  // namespace

const char* tp_rule_name(TpRule r) {
  switch (r) {
    case TpRule::kContiguous: return "contiguous";
    case TpRule::kPermutation: return "permutation";
    case TpRule::kPerLayer: return "per-layer";
  }
  return "?";
}

std::vector<int> TpAssignment::local_heads(int layer, int g) const {
  std::vector<int> out;
  for (int h = 0; h < n_kv_heads; ++h)
    if (gpu_of(layer, h) == g) out.push_back(h);
  return out;
}

bool TpAssignment::same_in_every_layer() const {
  for (int l = 1; l < n_layers; ++l)
    for (int h = 0; h < n_kv_heads; ++h)
      if (gpu_of(l, h) != gpu_of(0, h)) return false;
  return true;
}

void check_tensor_parallel(const ModelConfig& c, int n_gpus) {
  LY_CHECK(n_gpus >= 1, ErrorCode::kInvalidArgument, "tensor parallel: {} GPUs: need at least 1", n_gpus);
  LY_CHECK(c.n_kv_heads > 0 && c.n_kv_heads % n_gpus == 0, ErrorCode::kInvalidArgument,
           "tensor parallel over {} GPUs: the model has {} KV heads, which {} does not divide (each GPU owns "
           "whole KV heads)",
           n_gpus, c.n_kv_heads, n_gpus);
  LY_CHECK(c.d_ff % n_gpus == 0, ErrorCode::kInvalidArgument,
           "tensor parallel over {} GPUs: the MLP width {} is not a multiple of {}", n_gpus, c.d_ff, n_gpus);
}

TpAssignment tp_assign_contiguous(const ModelConfig& c, int n_gpus) {
  check_tensor_parallel(c, n_gpus);
  const int k = c.n_kv_heads / n_gpus;
  std::vector<int> group(size_t(c.n_kv_heads));
  for (int h = 0; h < c.n_kv_heads; ++h) group[size_t(h)] = h / k;
  return from_partition(c, n_gpus, TpRule::kContiguous, group);
}

TpAssignment tp_assign_permutation(const ModelConfig& c, const HeadRoles& roles, int n_gpus, uint64_t max_nodes) {
  check_tensor_parallel(c, n_gpus);
  check_roles_shape(c, roles);
  std::vector<int> best = tp_assign_contiguous(c, n_gpus).gpu;
  best.resize(size_t(c.n_kv_heads));
  int best_cost = partition_cost(roles, best, n_gpus);
  std::vector<int> local = best;
  int local_cost = best_cost;
  swap_descent(roles, local, local_cost, n_gpus);
  if (local_cost < best_cost) {
    best = local;
    best_cost = local_cost;
  }
  PartitionSearch search(roles, n_gpus, max_nodes);
  const bool finished = search.run(best, best_cost);
  TpAssignment a = from_partition(c, n_gpus, TpRule::kPermutation, canonical_labels(best, n_gpus));
  a.optimal = finished || best_cost == search.floor();
  return a;
}

TpAssignment tp_assign_per_layer(const ModelConfig& c, const HeadRoles& roles, int n_gpus) {
  TpAssignment a = tp_assign_permutation(c, roles, n_gpus);
  a.rule = TpRule::kPerLayer;
  a.optimal = true;  // every layer reaches ceil(r_l / N) below
  const int H = c.n_kv_heads;
  std::vector<int> cnt(static_cast<size_t>(n_gpus));
  for (int l = 0; l < c.n_layers; ++l) {
    int* row = &a.gpu[size_t(l) * size_t(H)];
    std::fill(cnt.begin(), cnt.end(), 0);
    int r = 0;
    for (int h = 0; h < H; ++h)
      if (roles.is_retrieval(l, h)) {
        ++cnt[size_t(row[h])];
        ++r;
      }
    const int target = ceil_div(r, n_gpus);
    for (int g = 0; g < n_gpus; ++g)
      while (cnt[size_t(g)] > target) {
        // sum cnt = r <= N * target, so some GPU is below target, and it has a sparse head
        // (cnt < target <= heads per GPU).
        const int u = int(std::find_if(cnt.begin(), cnt.end(), [&](int x) { return x < target; }) - cnt.begin());
        int from = -1, to = -1;
        for (int h = 0; h < H && (from < 0 || to < 0); ++h) {
          if (from < 0 && row[h] == g && roles.is_retrieval(l, h)) from = h;
          if (to < 0 && row[h] == u && !roles.is_retrieval(l, h)) to = h;
        }
        LY_ASSERT(u < n_gpus && from >= 0 && to >= 0);
        std::swap(row[from], row[to]);
        --cnt[size_t(g)];
        ++cnt[size_t(u)];
      }
  }
  return a;
}

TpAssignment tp_assign(const ModelConfig& c, const HeadRoles& roles, int n_gpus, TpRule rule) {
  switch (rule) {
    case TpRule::kContiguous: return tp_assign_contiguous(c, n_gpus);
    case TpRule::kPermutation: return tp_assign_permutation(c, roles, n_gpus);
    case TpRule::kPerLayer: return tp_assign_per_layer(c, roles, n_gpus);
  }
  fail(ErrorCode::kInternal, "tensor parallel: unknown rule {}", int(rule));
}

TpBalance tp_balance(const TpAssignment& a, const HeadRoles& roles) {
  LY_CHECK(roles.n_layers == a.n_layers && roles.n_kv_heads == a.n_kv_heads, ErrorCode::kInvalidArgument,
           "tensor parallel: head roles are {} layers x {} KV heads, the assignment {} x {}", roles.n_layers,
           roles.n_kv_heads, a.n_layers, a.n_kv_heads);
  TpBalance b;
  const int N = a.n_gpus;
  std::vector<int> cnt(static_cast<size_t>(N));
  for (int l = 0; l < a.n_layers; ++l) {
    std::fill(cnt.begin(), cnt.end(), 0);
    int r = 0;
    for (int h = 0; h < a.n_kv_heads; ++h)
      if (roles.is_retrieval(l, h)) {
        ++cnt[size_t(a.gpu_of(l, h))];
        ++r;
      }
    const int m = *std::max_element(cnt.begin(), cnt.end());
    b.retrieval.push_back(r);
    b.max_on_gpu.push_back(m);
    b.sum_max += m;
    b.sum_bound += ceil_div(r, N);
    b.sum_mean += double(r) / N;
    if (m > ceil_div(r, N)) ++b.layers_above_bound;
  }
  // Walk each KV index through the layers: the writer is its last retrieval head that selects;
  // a sparse head on another GPU needs the writer's set there (once per writer and GPU).
  std::vector<char> sent(static_cast<size_t>(N));
  for (int h = 0; h < a.n_kv_heads; ++h) {
    int writer_gpu = -1;
    for (int l = 0; l < a.n_layers; ++l) {
      const int g = a.gpu_of(l, h);
      if (roles.is_retrieval(l, h)) {
        writer_gpu = g;
        std::fill(sent.begin(), sent.end(), 0);
      } else if (writer_gpu >= 0 && g != writer_gpu && !sent[size_t(g)]) {
        sent[size_t(g)] = 1;
        ++b.selection_transfers;
      }
    }
  }
  return b;
}

std::vector<std::vector<int>> tp_rank_heads(const TpAssignment& a) {
  LY_CHECK(a.same_in_every_layer(), ErrorCode::kUnsupported,
           "tensor parallel: the {} assignment puts a KV-head index on different GPUs in different layers, which "
           "would send LycheeDecode's selection sets between GPUs; the runner takes contiguous or permutation",
           tp_rule_name(a.rule));
  std::vector<std::vector<int>> heads(size_t(a.n_gpus));
  for (int g = 0; g < a.n_gpus; ++g) heads[size_t(g)] = a.local_heads(0, g);
  return heads;
}

TpVocabRows tp_vocab_rows(int vocab, int n_gpus, int rank) {
  LY_CHECK(vocab >= 1 && n_gpus >= 1 && rank >= 0 && rank < n_gpus, ErrorCode::kInvalidArgument,
           "tensor parallel: vocabulary rows of rank {} of {} (vocabulary {})", rank, n_gpus, vocab);
  TpVocabRows r;
  r.part = (vocab + n_gpus - 1) / n_gpus;
  r.first = rank * r.part;
  r.count = std::max(0, std::min(vocab - r.first, r.part));
  return r;
}

TpShardShape tp_shard_shape(const ModelConfig& c, const std::vector<int>& kv_heads, int rank, int n_gpus) {
  check_tensor_parallel(c, n_gpus);
  LY_CHECK(rank >= 0 && rank < n_gpus && int(kv_heads.size()) * n_gpus == c.n_kv_heads, ErrorCode::kInvalidArgument,
           "tensor parallel: rank {} of {} holds {} KV heads; the model has {}", rank, n_gpus, kv_heads.size(),
           c.n_kv_heads);
  for (int h : kv_heads)
    LY_CHECK(h >= 0 && h < c.n_kv_heads, ErrorCode::kInvalidArgument, "tensor parallel: KV head {} (the model has {})",
             h, c.n_kv_heads);
  TpShardShape s;
  s.config = c;
  const int g = c.group_size(), hd = c.head_dim, k = int(kv_heads.size()), f = c.d_ff / n_gpus;
  s.config.n_heads = k * g;
  s.config.n_kv_heads = k;
  s.config.d_ff = f;
  const int q_local = k * g * hd, kv_local = k * hd;
  for (int j = 0; j < k; ++j) {
    const int h = kv_heads[size_t(j)];
    s.qkv_rows.push_back({h * g * hd, j * g * hd, g * hd});
    s.o_cols.push_back({h * g * hd, j * g * hd, g * hd});
  }
  for (int j = 0; j < k; ++j) s.qkv_rows.push_back({c.q_dim() + kv_heads[size_t(j)] * hd, q_local + j * hd, hd});
  for (int j = 0; j < k; ++j)
    s.qkv_rows.push_back({c.q_dim() + c.kv_dim() + kv_heads[size_t(j)] * hd, q_local + kv_local + j * hd, hd});
  s.gate_up_rows = {{rank * f, 0, f}, {c.d_ff + rank * f, f, f}};
  s.down_cols = {{rank * f, 0, f}};
  return s;
}

DecodeSpec tp_shard_spec(const DecodeSpec& spec, const std::vector<int>& kv_heads) {
  DecodeSpec out = spec;
  out.n_kv_heads = int(kv_heads.size());
  for (auto& pattern : out.patterns) {
    std::vector<HeadSpec> local;
    for (int h : kv_heads) {
      LY_CHECK(h >= 0 && h < int(pattern.size()), ErrorCode::kInvalidArgument,
               "tensor parallel: KV head {} of a policy over {} KV heads", h, pattern.size());
      local.push_back(pattern[size_t(h)]);
    }
    pattern = std::move(local);
  }
  return out;
}

}  // namespace lychee
