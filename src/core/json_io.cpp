#include "core/json_io.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace lychee {

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_json_file(const std::string& path, const nlohmann::json& j, int indent) {
  std::ofstream out(path);
  LY_CHECK(out.good(), ErrorCode::kNotFound, "cannot write {}: {}", path, std::strerror(errno));
  out << dump_json(j, indent) << "\n";
  out.flush();
  LY_CHECK(out.good(), ErrorCode::kInternal, "writing {} failed: {}", path, std::strerror(errno));
}

}  // namespace lychee
