// lychee heads: show, import, export and make head-role files (docs/head-roles.md).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "attention/head_roles.h"

namespace lychee::app {

void register_heads(CLI::App& app);

// The role map, a one-line summary per gate array present and the provenance, for terminals.
std::string describe_head_roles(const HeadRoles& roles);
// Loads `path` validated against the model's config; warns (does not fail) when the file was
// made for a model of another name with the same shape.
HeadRoles load_head_roles_for(const std::string& path, const ModelConfig& c);

}  // namespace lychee::app
