// Fuzz target: the safetensors parser must reject any malformed input with lychee::Error and
// never crash or read out of bounds.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const lychee::SafetensorsFile f = lychee::SafetensorsFile::parse({data, size}, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors())
      if (t.n_bytes > 0) sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
  } catch (const lychee::Error&) {
  }
  return 0;
}
