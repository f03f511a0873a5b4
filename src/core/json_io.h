// JSON text that never throws on text lychee did not write itself. A model's output can end
// inside a UTF-8 character (a token is bytes, not characters), and nlohmann::json's dump() throws
// on invalid UTF-8 by default; these replace such bytes with U+FFFD instead, so an eval's records,
// a server response or a results file always come out.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace lychee {

// j as text (indent as nlohmann::json::dump: -1 compact), invalid UTF-8 replaced with U+FFFD.
std::string dump_json(const nlohmann::json& j, int indent = -1);

// Writes dump_json(j, indent) and a newline to path; kNotFound naming the path if it cannot be
// opened, kInternal if the write fails (a full disk).
void write_json_file(const std::string& path, const nlohmann::json& j, int indent = 1);

}  // namespace lychee
