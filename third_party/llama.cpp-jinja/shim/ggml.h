// lychee's stand-in for ggml.h: the vendored common/json.cpp includes ggml.h only for
// GGML_ASSERT (its JSON_ASSERT), and lychee does not link ggml.
#pragma once

#include <cstdio>
#include <cstdlib>

#define GGML_ASSERT(x)                                                                      \
  do {                                                                                      \
    if (!(x)) {                                                                             \
      std::fprintf(stderr, "%s:%d: GGML_ASSERT(%s) failed\n", __FILE__, __LINE__, #x);     \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
