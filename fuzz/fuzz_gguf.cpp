// Fuzz target: the GGUF parser must reject any malformed input with lychee::Error and never
// crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const lychee::GgufFile g = lychee::GgufFile::parse({data, size}, "fuzz.gguf");
    // Touch what a loader reads: every tensor's bytes and the typed getters.
    volatile uint8_t sink = 0;
    for (const auto& t : g.tensors())
      if (t.n_bytes > 0) sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
    for (const auto& [key, value] : g.metadata()) {
      try {
        g.get_string(key);
      } catch (const lychee::Error&) {
      }
    }
  } catch (const lychee::Error&) {
  }
  return 0;
}
