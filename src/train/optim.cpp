#include "train/optim.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lychee::train {

void AdamWOptions::validate() const {
  LY_CHECK(beta1 >= 0.0 && beta1 < 1.0, ErrorCode::kInvalidArgument, "AdamW beta1 must be in [0, 1), got {}", beta1);
  LY_CHECK(beta2 >= 0.0 && beta2 < 1.0, ErrorCode::kInvalidArgument, "AdamW beta2 must be in [0, 1), got {}", beta2);
  LY_CHECK(std::isfinite(eps) && eps > 0.0, ErrorCode::kInvalidArgument, "AdamW eps must be > 0, got {}", eps);
  LY_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, ErrorCode::kInvalidArgument,
           "AdamW weight_decay must be >= 0, got {}", weight_decay);
}

AdamW::AdamW(int n_params, const AdamWOptions& options) : options_(options) {
  LY_CHECK(n_params >= 0, ErrorCode::kInvalidArgument, "AdamW: n_params must be >= 0, got {}", n_params);
  options_.validate();
  m_.assign(size_t(n_params), 0.0);
  v_.assign(size_t(n_params), 0.0);
}

void AdamW::step(std::span<double> params, std::span<const double> grad, double lr) {
  LY_CHECK(params.size() == m_.size() && grad.size() == m_.size(), ErrorCode::kInvalidArgument,
           "AdamW: params and grad have {} and {} entries, expected n_params = {}", params.size(), grad.size(),
           m_.size());
  LY_CHECK(std::isfinite(lr) && lr >= 0.0, ErrorCode::kInvalidArgument, "AdamW: lr must be >= 0, got {}", lr);
  for (size_t i = 0; i < grad.size(); ++i)
    LY_CHECK(std::isfinite(grad[i]), ErrorCode::kInvalidArgument, "AdamW: grad[{}] is {}", i, grad[i]);
  ++step_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias1 = 1.0 - std::pow(b1, double(step_));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(b2, double(step_)));
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] *= 1.0 - lr * options_.weight_decay;
    m_[i] = b1 * m_[i] + (1.0 - b1) * grad[i];
    v_[i] = b2 * v_[i] + (1.0 - b2) * grad[i] * grad[i];
    params[i] -= lr / bias1 * m_[i] / (std::sqrt(v_[i]) / bias2_sqrt + options_.eps);
  }
}

nlohmann::json AdamW::to_json() const {
  return nlohmann::json{{"step", step_}, {"m", m_}, {"v", v_}};
}

namespace {

std::vector<double> read_moment(const nlohmann::json& s, const char* key, size_t n, std::string_view source) {
  const nlohmann::json& a = s.at(key);
  LY_CHECK(a.is_array(), ErrorCode::kInvalidFile, "{}: optimizer.{} must be an array", source, key);
  LY_CHECK(a.size() == n, ErrorCode::kInvalidFile, "{}: optimizer.{} has {} entries, expected n_params = {}", source,
           key, a.size(), n);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    LY_CHECK(a[i].is_number(), ErrorCode::kInvalidFile, "{}: optimizer.{}[{}] is not a number", source, key, i);
    out[i] = a[i].get<double>();
    LY_CHECK(std::isfinite(out[i]), ErrorCode::kInvalidFile, "{}: optimizer.{}[{}] is {}", source, key, i, out[i]);
  }
  return out;
}

}  // namespace

void AdamW::load_json(const nlohmann::json& s, std::string_view source) {
  LY_CHECK(s.is_object(), ErrorCode::kInvalidFile, "{}: optimizer state must be an object", source);
  for (const char* key : {"step", "m", "v"})
    LY_CHECK(s.contains(key), ErrorCode::kInvalidFile, "{}: optimizer state has no '{}'", source, key);
  for (const auto& item : s.items())
    LY_CHECK(item.key() == "step" || item.key() == "m" || item.key() == "v", ErrorCode::kInvalidFile,
             "{}: unknown optimizer state key '{}' (allowed: step, m, v)", source, item.key());
  LY_CHECK(s["step"].is_number_integer() && s["step"].get<int64_t>() >= 0, ErrorCode::kInvalidFile,
           "{}: optimizer.step must be an integer >= 0, got {}", source, s["step"].dump());
  std::vector<double> m = read_moment(s, "m", m_.size(), source);
  std::vector<double> v = read_moment(s, "v", v_.size(), source);
  for (size_t i = 0; i < v.size(); ++i)
    LY_CHECK(v[i] >= 0.0, ErrorCode::kInvalidFile, "{}: optimizer.v[{}] must be >= 0, got {}", source, i, v[i]);
  step_ = s["step"].get<int64_t>();
  m_ = std::move(m);
  v_ = std::move(v);
}

double lr_factor(int64_t step, int64_t n_steps, double warmup_frac, double decay_frac, double floor) {
  LY_CHECK(n_steps >= 1 && step >= 0 && step < n_steps, ErrorCode::kInvalidArgument,
           "lr_factor: step {} is outside [0, n_steps = {})", step, n_steps);
  LY_CHECK(warmup_frac >= 0.0 && warmup_frac <= 1.0 && decay_frac >= 0.0 && decay_frac <= 1.0,
           ErrorCode::kInvalidArgument, "lr_factor: warmup_frac {} and decay_frac {} must be in [0, 1]", warmup_frac,
           decay_frac);
  LY_CHECK(floor >= 0.0 && floor <= 1.0, ErrorCode::kInvalidArgument, "lr_factor: floor must be in [0, 1], got {}",
           floor);
  const double n = double(n_steps);
  double f = 1.0;
  if (warmup_frac > 0.0) f = std::min(f, std::max((double(step) + 1.0) / (n * warmup_frac), floor));
  if (decay_frac > 0.0) f = std::min(f, std::max((n - double(step)) / (n * decay_frac), floor));
  return f;
}

void Lagrangian::update(double constraint) {
  LY_CHECK(std::isfinite(constraint), ErrorCode::kInvalidArgument, "Lagrangian: constraint is {}", constraint);
  lambda = std::max(0.0, lambda + lr * constraint);
}

}  // namespace lychee::train
