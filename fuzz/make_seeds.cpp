// Writes small valid seed files for the fuzzers: make_seeds gguf|safetensors DIR.
#include <cstdio>
#include <string>
#include <vector>

#include "gguf_builder.h"
#include "model/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds gguf|safetensors DIR\n");
    return 2;
  }
  const std::string kind = argv[1], dir = argv[2];
  auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    if (f == nullptr) return false;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return true;
  };
  if (kind == "gguf") {
    lychee::test::GgufBuilder g;
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.block_count", 1);
    g.kv_f32("llama.rope.freq_base", 10000.0f);
    g.kv_bool("tokenizer.ggml.add_bos_token", false);
    g.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
    g.kv_i32_array("tokenizer.ggml.token_type", {1, 1, 1});
    g.tensor_f32("token_embd.weight", {4, 3});
    g.tensor({"q8", {32, 1}, 8, std::vector<uint8_t>(34, 1)});
    g.tensor({"q4", {32}, 3, std::vector<uint8_t>(20, 7)});
    // k-quant super-blocks (ggml types 12..15: Q4_K, Q5_K, Q6_K, Q8_K), one or two per tensor,
    // with bytes that vary so that every packed scale field takes several values.
    lychee::test::GgufBuilder k;
    k.kv_str("general.architecture", "qwen3");
    const struct { uint32_t type; uint64_t block_bytes; uint64_t n_blocks; } kq[] = {
        {12, 144, 2}, {13, 176, 1}, {14, 210, 1}, {15, 292, 1}};
    for (const auto& q : kq) {
      std::vector<uint8_t> bytes(q.block_bytes * q.n_blocks);
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 37 + q.type);
      k.tensor({"k" + std::to_string(q.type), {256, q.n_blocks}, q.type, std::move(bytes)});
    }
    return write("seed1.gguf", g.build()) && write("seed2.gguf", lychee::test::GgufBuilder().build()) &&
                   write("seed3.gguf", k.build())
               ? 0
               : 1;
  }
  if (kind == "safetensors") {
    const std::string path = dir + "/seed1.safetensors";
    std::vector<float> a = {1, 2, 3, 4}, b = {5, 6};
    const lychee::SafetensorsWriteItem items[] = {{"a", {2, 2}, a}, {"b", {2}, b}};
    lychee::write_safetensors_f32(path, items);
    const std::string hdr = R"({"__metadata__":{"format":"pt"},"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
    std::vector<uint8_t> bytes(8);
    const uint64_t n = hdr.size();
    std::memcpy(bytes.data(), &n, 8);
    bytes.insert(bytes.end(), hdr.begin(), hdr.end());
    bytes.insert(bytes.end(), {0, 0x3f, 0, 0x40});
    return write("seed2.safetensors", bytes) ? 0 : 1;
  }
  std::fprintf(stderr, "unknown kind %s\n", kind.c_str());
  return 2;
}
