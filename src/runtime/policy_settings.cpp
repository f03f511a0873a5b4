#include "runtime/policy_settings.h"

#include "core/log.h"

namespace lychee {

PolicyOptions PolicySettings::options(const ModelConfig& c, PolicyKind kind) const {
  PolicyOptions o;
  o.kind = kind;
  o.block_size = block_size;
  o.select.strategy = parse_select_strategy(select);
  o.select.budget = budget;
  o.select.value = select_value;
  const bool lychee = kind == PolicyKind::kLychee;
  o.select.sink = sink >= 0 ? sink : lychee ? kLycheeDefaultSink : 0;
  o.select.recent = recent >= 0 ? recent : lychee ? kLycheeDefaultRecent : 0;
  if (!heads.empty() && (kind == PolicyKind::kLychee || kind == PolicyKind::kDuo)) {
    o.roles = load_head_roles(heads, c);
    if (o.roles->model.contains("name") && o.roles->model["name"] != c.name)
      LY_LOG_INFO("{}: written for '{}', used with '{}' (same shape)", heads,
                  o.roles->model["name"].get<std::string>(), c.name);
  }
  o.tidal_layers = tidal_layers;
  o.quest_page = quest_page;
  o.duo_sink = duo_sink;
  o.duo_recent = duo_recent;
  o.validate(c);
  return o;
}

}  // namespace lychee
