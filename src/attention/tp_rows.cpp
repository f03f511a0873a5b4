#include "attention/tp_rows.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/error.h"

namespace lychee {

const char* tp_row_rule_name(TpRowRule r) {
  switch (r) {
    case TpRowRule::kSame: return "same";
    case TpRowRule::kMirrored: return "mirrored";
  }
  return "?";
}

std::vector<int> TpRowAssignment::groups_held(int g) const {
  const int N = base.n_gpus;
  std::vector<char> held(size_t(N), 0);
  for (int s : shift) held[size_t(((g - s) % N + N) % N)] = 1;  // row b gives GPU g group (g - shift) mod N
  std::vector<int> out;
  for (int j = 0; j < N; ++j)
    if (held[size_t(j)]) out.push_back(j);
  return out;
}

TpRowAssignment tp_assign_rows(const TpAssignment& base, const HeadRoles& roles, int batch, TpRowRule rule) {
  LY_CHECK(batch >= 1, ErrorCode::kInvalidArgument, "tensor parallel: a batch of {} rows: need at least 1", batch);
  LY_CHECK(roles.n_layers == base.n_layers && roles.n_kv_heads == base.n_kv_heads, ErrorCode::kInvalidArgument,
           "tensor parallel: head roles are {} layers x {} KV heads, the assignment {} x {}", roles.n_layers,
           roles.n_kv_heads, base.n_layers, base.n_kv_heads);
  TpRowAssignment a;
  a.base = base;
  a.rule = rule;
  a.shift.assign(size_t(batch), 0);
  if (rule == TpRowRule::kSame) return a;
  const int N = base.n_gpus, L = base.n_layers, H = base.n_kv_heads;
  // r[l][j]: retrieval heads of layer l in base group j; load[l][g]: dense heads on GPU g so far.
  std::vector<int> r(size_t(L) * size_t(N), 0), load(size_t(L) * size_t(N), 0);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      if (roles.is_retrieval(l, h)) ++r[size_t(l) * size_t(N) + size_t(base.gpu_of(l, h))];
  auto cost_with = [&](int s, int sign) {  // sum_l max_g load with one more row of shift s added
    int cost = 0;
    for (int l = 0; l < L; ++l) {
      int m = 0;
      for (int g = 0; g < N; ++g) {
        int& x = load[size_t(l) * size_t(N) + size_t(g)];
        x += sign * r[size_t(l) * size_t(N) + size_t(((g - s) % N + N) % N)];
        m = std::max(m, x);
      }
      cost += m;
    }
    return cost;
  };
  const int full = batch / N * N;
  for (int b = 0; b < batch; ++b) {
    int best = b % N;
    if (b >= full) {  // the remainder: the shift that least raises the cost
      int best_cost = INT32_MAX;
      for (int s = 0; s < N; ++s) {
        const int c = cost_with(s, +1);
        cost_with(s, -1);
        if (c < best_cost) best_cost = c, best = s;
      }
    }
    a.shift[size_t(b)] = best;
    cost_with(best, +1);
  }
  return a;
}

TpWorkBalance tp_work_balance(const TpRowAssignment& a, const HeadRoles& roles, int64_t context, int64_t budget) {
  const TpAssignment& base = a.base;
  LY_CHECK(roles.n_layers == base.n_layers && roles.n_kv_heads == base.n_kv_heads, ErrorCode::kInvalidArgument,
           "tensor parallel: head roles are {} layers x {} KV heads, the assignment {} x {}", roles.n_layers,
           roles.n_kv_heads, base.n_layers, base.n_kv_heads);
  LY_CHECK(context >= 1 && budget >= 1, ErrorCode::kInvalidArgument,
           "tensor parallel work balance: context {} and budget {} must be >= 1", context, budget);
  const int N = base.n_gpus;
  const double sparse = double(std::min(budget, context)), dense = double(context);
  TpWorkBalance w;
  for (int l = 0; l < base.n_layers; ++l) {
    std::vector<double> work(size_t(N), 0.0);
    std::vector<int> nd(size_t(N), 0);
    for (int b = 0; b < a.batch(); ++b)
      for (int h = 0; h < base.n_kv_heads; ++h) {
        const int g = a.gpu_of(b, l, h);
        const bool ret = roles.is_retrieval(l, h);
        work[size_t(g)] += ret ? dense : sparse;
        nd[size_t(g)] += ret ? 1 : 0;
      }
    const double mx = *std::max_element(work.begin(), work.end());
    const double mean = std::accumulate(work.begin(), work.end(), 0.0) / N;
    w.max_over_mean.push_back(mx / mean);
    if (mx / mean > w.worst) w.worst = mx / mean, w.worst_layer = l;
    w.sum_max += mx;
    w.sum_mean += mean;
    w.dense.push_back(nd);
  }
  for (int g = 0; g < N; ++g) w.groups_held.push_back(int(a.groups_held(g).size()));
  return w;
}

}  // namespace lychee
