// Fuzz target: the GGUF parser must reject any malformed input with lychee::Error and never
// crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const lychee::GgufFile g = lychee::GgufFile::parse({data, size}, "fuzz.gguf");
    // Touch what a loader reads: every tensor's bytes and the typed getters.
    volatile uint8_t sink = 0;
    for (const auto& t : g.tensors())
      if (t.n_bytes > 0) sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
    // Dequantise what a loader would (every block type, the k-quants' packed scales included):
    // the parser's size checks must keep the dequantisers inside each tensor's bytes. The data
    // lie inside the input, so n_elems is bounded by its size.
    std::vector<float> out;
    for (const auto& t : g.tensors()) {
      if (t.dtype == lychee::DType::kI32 || t.n_elems() > (int64_t(1) << 20)) continue;
      out.resize(size_t(t.n_elems()));
      lychee::convert_to_f32(t.dtype, t.data, t.n_elems(), out.data());
      sink = sink ^ uint8_t(out.back() > 0);
    }
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
