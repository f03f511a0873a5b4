// Shared pieces of the Python module lychee._lychee (python/CMakeLists.txt): each source binds
// one part of the runtime; module.cpp assembles them and maps lychee::Error to exceptions.
#pragma once

#include <stdexcept>
#include <string_view>

#include <nanobind/nanobind.h>
#include <nlohmann/json.hpp>

namespace lychee::py {

namespace nb = nanobind;

// UTF-8 bytes as a str, invalid sequences replaced by U+FFFD (a token's bytes may end inside a
// character; detokenize of an arbitrary id list may too).
nb::str utf8_str(std::string_view bytes);

// A JSON value as the Python object json.loads gives (invalid UTF-8 in strings becomes U+FFFD).
nb::object json_to_python(const nlohmann::json& j);

// An engine asked for a request while a stream's generation holds it: lychee.EngineBusyError
// (module.cpp), a lychee.Error and a RuntimeError.
struct EngineBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void bind_engine(nb::module_& m);  // engine.cpp: Engine, Completion, Stream, Request, PolicySettings
void bind_roles(nb::module_& m);   // tools.cpp: HeadRoles, train_heads, evaluate, weights

}  // namespace lychee::py
