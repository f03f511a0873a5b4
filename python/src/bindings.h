// Shared pieces of the Python module lychee._lychee (python/CMakeLists.txt): each source binds
// one part of the runtime; module.cpp assembles them and maps lychee::Error to exceptions.
#pragma once

#include <string_view>

#include <nanobind/nanobind.h>

namespace lychee::py {

namespace nb = nanobind;

// UTF-8 bytes as a str, invalid sequences replaced by U+FFFD (a token's bytes may end inside a
// character; detokenize of an arbitrary id list may too).
nb::str utf8_str(std::string_view bytes);

void bind_engine(nb::module_& m);  // engine.cpp: Engine, Completion, Stream, PolicySettings
void bind_roles(nb::module_& m);   // roles.cpp: HeadRoles, train_heads, evaluate, weights

}  // namespace lychee::py
