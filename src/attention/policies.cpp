#include "attention/policies.h"

#include <atomic>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"

namespace lychee {

const char* policy_kind_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::kFull: return "full";
    case PolicyKind::kLychee: return "lychee";
    case PolicyKind::kTidal: return "tidal";
    case PolicyKind::kQuest: return "quest";
    case PolicyKind::kDuo: return "duo";
  }
  return "?";
}

PolicyKind parse_policy_kind(const std::string& name) {
  for (PolicyKind k : {PolicyKind::kFull, PolicyKind::kLychee, PolicyKind::kTidal, PolicyKind::kQuest, PolicyKind::kDuo})
    if (name == policy_kind_name(k)) return k;
  fail(ErrorCode::kInvalidArgument, "unknown policy '{}' (full, lychee, tidal, quest, duo)", name);
}

std::vector<int> default_tidal_layers(int n_layers) {
  const int reselect = std::min(n_layers - 1, int(std::lround(13.0 * n_layers / 32.0)));
  std::vector<int> layers = {std::min(2, n_layers - 1)};
  if (reselect > layers[0]) layers.push_back(reselect);
  return layers;
}

void PolicyOptions::validate(const ModelConfig& c) const {
  select.validate();
  LY_CHECK(block_size >= 1, ErrorCode::kInvalidArgument, "--block-size must be >= 1, got {}", block_size);
  LY_CHECK(quest_page >= 1, ErrorCode::kInvalidArgument, "quest page size must be >= 1, got {}", quest_page);
  LY_CHECK(tidal_dense_layers >= 0 && quest_dense_layers >= 0, ErrorCode::kInvalidArgument,
           "dense layer counts must be >= 0");
  LY_CHECK(duo_sink >= 0 && duo_recent >= 1, ErrorCode::kInvalidArgument,
           "duo sink must be >= 0 and recent >= 1, got {} and {}", duo_sink, duo_recent);
  if (roles) roles->validate(c, "head roles");
  if (kind == PolicyKind::kTidal || kind == PolicyKind::kQuest)
    LY_CHECK(select.strategy == SelectStrategy::kTopK, ErrorCode::kInvalidArgument,
             "--select {} applies to lychee only; {} selects by top-k budget",
             select_strategy_name(select.strategy), policy_kind_name(kind));
}

std::string PolicyOptions::label() const {
  switch (kind) {
    case PolicyKind::kFull: return "full";
    case PolicyKind::kLychee: {
      std::string sel = select.strategy == SelectStrategy::kTopK
                            ? fmt::format("topk {}", select.budget)
                            : fmt::format("{} {}", select_strategy_name(select.strategy), select.value);
      std::string gran = block_size == 1 ? "token" : fmt::format("block {}", block_size);
      std::string forced = select.sink > 0 || select.recent > 0
                               ? fmt::format(" sink {} recent {}", select.sink, select.recent)
                               : std::string();
      return fmt::format("lychee {} {}{}", sel, gran, forced);
    }
    case PolicyKind::kTidal: return fmt::format("tidal topk {}", select.budget);
    case PolicyKind::kQuest: return fmt::format("quest topk {} page {}", select.budget, quest_page);
    case PolicyKind::kDuo: return fmt::format("duo sink {} recent {}", duo_sink, duo_recent);
  }
  return "?";
}

DecodeSpec full_spec(const ModelConfig& c) { return DecodeSpecBuilder(c, "full").finish(); }

// The method table: a new method is a compiler in its own file and one case here.
DecodeSpec compile_policy(const PolicyOptions& o, const ModelConfig& c) {
  o.validate(c);
  auto roles = [&] {
    if (o.roles) return *o.roles;
    HeadRoles stand_in = default_head_roles(c);
    std::vector<int> layers;
    for (int l = 0; l < c.n_layers; ++l)
      if (stand_in.is_retrieval(l, 0)) layers.push_back(l);
    static std::atomic<bool> warned{false};  // once per process, however many specs are compiled
    if (!warned.exchange(true))
      LY_LOG_WARN("no head-role file given (--heads): using the TidalDecode-matched stand-in "
                  "(every KV head of layers {} is a retrieval head)", fmt::join(layers, ", "));
    return stand_in;
  };
  switch (o.kind) {
    case PolicyKind::kFull: return full_spec(c);
    case PolicyKind::kLychee: return lychee_spec(c, roles(), o.block_size, o.select);
    case PolicyKind::kTidal:
      return tidal_spec(c, o.select.budget, o.tidal_layers.empty() ? default_tidal_layers(c.n_layers) : o.tidal_layers,
                        o.tidal_dense_layers);
    case PolicyKind::kQuest: return quest_spec(c, o.select.budget, o.quest_page, o.quest_dense_layers);
    case PolicyKind::kDuo: return duo_spec(c, roles(), o.duo_sink, o.duo_recent);
  }
  fail(ErrorCode::kInternal, "unhandled policy kind");
}

std::unique_ptr<AttentionPolicy> make_policy(const PolicyOptions& o, const ModelConfig& c) {
  return std::make_unique<SpecPolicy>(compile_policy(o, c));
}

}  // namespace lychee
