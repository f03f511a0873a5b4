// A parsed request (schema.h) -> the engine's GenerationParams: the model name checked, chat
// messages rendered with the model's template and tokenized, the context checked before any
// work, sampling and the attention policy (the server's defaults with the request's "lychee"
// overrides) validated. Runs on the HTTP thread; throws ApiError.
#pragma once

#include <string>

#include "runtime/engine.h"
#include "runtime/policy_settings.h"
#include "server/scheduler.h"
#include "server/schema.h"

namespace lychee::server {

struct ServerModel {
  const Engine* engine = nullptr;
  std::string id;            // the name clients pass as "model"
  PolicySettings defaults;   // from the serve command's flags
  int context = 0;           // Scheduler::context()
  std::string fingerprint;   // responses' system_fingerprint (system_fingerprint below)
  std::string version;       // lychee's version (GET /server_info)
};

// OpenAI's system_fingerprint: "fp_" and 16 hex digits of a hash of what sets the numerics of
// the answers (lychee's version, the model file and its shape, the device and weight format, the
// KV page size and dtype (--kv-cache-dtype), whether every request is batch-invariant). Two servers that give the same
// fingerprint give a seeded request the same tokens.
std::string system_fingerprint(const Engine& engine, const std::string& settings);

GenerationParams make_params(const CompletionRequest& request, const ServerModel& model);
// The settings with the request's overrides applied.
PolicySettings apply_overrides(PolicySettings settings, const PolicyOverrides& o);

}  // namespace lychee::server
