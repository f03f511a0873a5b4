// libFuzzer target for the server's request parser (src/server/schema.cpp): any bytes as the body
// of each endpoint must parse or fail with ApiError (a 400), never crash; what parses must build
// responses and SSE chunks, and the text stream must take any split of the bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/schema.h"
#include "server/text_stream.h"

using namespace lychee::server;

namespace {

void use(const CompletionRequest& r, std::string_view data) {
  const ResponseMeta meta{"id", 0, r.model};
  const ChoiceResult choice{std::string(data.substr(0, 64)), "stop", {{std::string(data.substr(0, 3)), -1.0f, {}}}};
  (void)sse_event(completion_response(r.endpoint, meta, choice, Usage{1, 1}, r.logprobs));
  (void)sse_event(stream_chunk(r.endpoint, meta, data.substr(0, 16), nullptr, "", true, r.include_usage));
  TextStream text(r.stop);
  std::string out;
  for (size_t i = 0; i < data.size() && !text.stopped(); i += 3) out += text.push(data.substr(i, 3));
  out += text.finish();
  if (out.size() > data.size()) __builtin_trap();  // the stream never invents text
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string_view data(reinterpret_cast<const char*>(bytes), size);
  for (Endpoint e : {Endpoint::kChat, Endpoint::kCompletion}) {
    try {
      use(parse_request(e, data), data);
    } catch (const ApiError& err) {
      if (err.status() != 400) __builtin_trap();
      (void)lychee::dump_json(err.body());
    }
  }
  try {
    (void)parse_tokenize_request(data);
  } catch (const ApiError&) {
  }
  try {
    (void)parse_detokenize_request(data);
  } catch (const ApiError&) {
  }
  return 0;
}
