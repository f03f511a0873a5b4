// The GGUF parser: valid files, and every kind of corruption giving one clear error.
#include <gtest/gtest.h>

#include "core/error.h"
#include "gguf_builder.h"
#include "model/gguf.h"

namespace lychee {
namespace {

using test::GgufBuilder;

GgufBuilder sample() {
  GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.kv_u32("llama.block_count", 2);
  g.kv_f32("llama.rope.freq_base", 500000.0f);
  g.kv_bool("tokenizer.ggml.add_bos_token", true);
  g.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  g.kv_i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  g.tensor_f32("w1", {32, 3});
  g.tensor_f32("w2", {5});
  return g;
}

// Runs the parser and returns the error message (or "" when it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes, ErrorCode* code = nullptr) {
  try {
    GgufFile::parse(bytes, "test.gguf");
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(Gguf, ParsesMetadataAndTensors) {
  const auto bytes = sample().build();
  const GgufFile g = GgufFile::parse(bytes, "test.gguf");
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_uint("llama.block_count"), 2u);
  EXPECT_FLOAT_EQ(float(g.get_float("llama.rope.freq_base")), 500000.0f);
  EXPECT_EQ(g.get_bool_opt("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens").size(), 3u);
  EXPECT_EQ(g.get_int_array("tokenizer.ggml.token_type")[2], 3);
  ASSERT_EQ(g.tensors().size(), 2u);
  const GgufTensorInfo* w1 = g.find_tensor("w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->ne, (std::vector<int64_t>{32, 3}));
  EXPECT_EQ(w1->n_bytes, 32u * 3 * 4);
  float second;
  std::memcpy(&second, w1->data + 4, 4);
  EXPECT_FLOAT_EQ(second, 0.01f);
  EXPECT_THROW(g.get_uint("general.architecture"), Error);  // wrong type, named
  EXPECT_THROW(g.get_string("missing.key"), Error);
}

TEST(Gguf, EveryTruncationIsAnError) {
  const auto bytes = sample().build();
  // The file is valid up to the end of its last tensor's bytes (padding after it is optional).
  // Cutting into a tensor's data is caught by the range check; cutting the header anywhere by
  // the bounds-checked reader.
  const GgufFile full = GgufFile::parse(bytes, "test.gguf");
  const GgufTensorInfo* last = full.find_tensor("w2");
  const size_t needed = size_t(last->data - bytes.data()) + last->n_bytes;
  for (size_t n = 0; n < needed; ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    const std::string err = parse_error(cut);
    EXPECT_FALSE(err.empty()) << "prefix of " << n << " bytes parsed";
    EXPECT_NE(err.find("test.gguf"), std::string::npos) << err;
  }
}

TEST(Gguf, BadMagicAndVersion) {
  GgufBuilder g = sample();
  g.magic = "GGML";
  EXPECT_NE(parse_error(g.build()).find("not a GGUF file"), std::string::npos);
  for (uint32_t v : {1u, 4u, 0xffffffffu}) {
    g = sample();
    g.version = v;
    ErrorCode code{};
    const std::string err = parse_error(g.build(), &code);
    EXPECT_NE(err.find("version " + std::to_string(v)), std::string::npos) << err;
    EXPECT_EQ(code, ErrorCode::kUnsupported);
  }
}

TEST(Gguf, TensorOutsideTheFile) {
  GgufBuilder g = sample();
  g.tensor({"w3", {8}, 0, {}, /*offset_override=*/1 << 20});
  const std::string err = parse_error(g.build());
  EXPECT_NE(err.find("tensor 'w3'"), std::string::npos) << err;
  EXPECT_NE(err.find("data section"), std::string::npos) << err;
}

TEST(Gguf, OverlappingTensors) {
  GgufBuilder g = sample();
  g.tensor({"w3", {8}, 0, {}, /*offset_override=*/0});  // on top of w1
  const std::string err = parse_error(g.build());
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
}

TEST(Gguf, MisalignedOffset) {
  GgufBuilder g = sample();
  g.tensor({"w3", {8}, 0, {}, /*offset_override=*/4});
  EXPECT_NE(parse_error(g.build()).find("alignment"), std::string::npos);
}

TEST(Gguf, UnsupportedQuantisationNamesTheTensor) {
  GgufBuilder g = sample();
  g.tensor({"blk.0.ffn_up.weight", {256, 2}, 11, std::vector<uint8_t>(2 * 110)});
  ErrorCode code{};
  const std::string err = parse_error(g.build(), &code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(err.find("blk.0.ffn_up.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("Q3_K"), std::string::npos) << err;
}

// k-quant tensors: 256-element super-blocks; the byte count follows from the shape.
TEST(Gguf, KQuantTensorsAndTheirBlockSizes) {
  const struct {
    uint32_t ggml_type;
    const char* name;
    uint64_t block_bytes;
  } types[] = {{12, "Q4_K", 144}, {13, "Q5_K", 176}, {14, "Q6_K", 210}, {15, "Q8_K", 292}};
  for (const auto& t : types) {
    GgufBuilder g = sample();
    g.tensor({"blk.0.attn_output.weight", {512, 3}, t.ggml_type, std::vector<uint8_t>(6 * t.block_bytes)});
    const auto bytes = g.build();
    const GgufFile f = GgufFile::parse(bytes, "test.gguf");
    const GgufTensorInfo* w = f.find_tensor("blk.0.attn_output.weight");
    ASSERT_NE(w, nullptr) << t.name;
    EXPECT_EQ(dtype_name(w->dtype), t.name);
    EXPECT_EQ(w->n_bytes, 6 * t.block_bytes) << t.name;
    // A row of 384 is not a whole number of super-blocks: named with the tensor and the type.
    g = sample();
    g.tensor({"blk.1.ffn_down.weight", {384, 2}, t.ggml_type, std::vector<uint8_t>(3 * t.block_bytes)});
    const std::string err = parse_error(g.build());
    EXPECT_NE(err.find("tensor 'blk.1.ffn_down.weight' has row length 384, not a multiple of the " +
                       std::string(t.name) + " block size 256"),
              std::string::npos)
        << err;
    // Data cut short: the last super-block runs past the end of the file.
    g = sample();
    g.tensor({"blk.2.attn_v.weight", {256, 2}, t.ggml_type, std::vector<uint8_t>(2 * t.block_bytes)});
    auto cut = g.build();
    const GgufFile whole = GgufFile::parse(cut, "test.gguf");
    const GgufTensorInfo* v = whole.find_tensor("blk.2.attn_v.weight");
    EXPECT_EQ(v->n_bytes, 2 * t.block_bytes);
    cut.resize(size_t(v->data - cut.data()) + t.block_bytes);
    EXPECT_NE(parse_error(cut).find("tensor 'blk.2.attn_v.weight' spans bytes"), std::string::npos)
        << t.name;
  }
}

TEST(Gguf, BadDimensionsAndRowLengths) {
  GgufBuilder g = sample();
  g.tensor({"w3", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4)});
  EXPECT_NE(parse_error(g.build()).find("5 dimensions"), std::string::npos);
  g = sample();
  g.tensor({"q", {20, 2}, 8, std::vector<uint8_t>(68)});  // Q8_0 rows must be multiples of 32
  EXPECT_NE(parse_error(g.build()).find("multiple of the Q8_0 block size"), std::string::npos);
  g = sample();
  g.tensor({"z", {0}, 0, {}});
  EXPECT_NE(parse_error(g.build()).find("invalid dimension"), std::string::npos);
}

TEST(Gguf, HugeCountsAreRejectedBeforeAllocating) {
  GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  auto bytes = g.build();
  // Patch the metadata count (bytes 16..23) to 2^60.
  const uint64_t huge = uint64_t(1) << 60;
  std::memcpy(bytes.data() + 16, &huge, 8);
  EXPECT_NE(parse_error(bytes).find("more than the file can hold"), std::string::npos);
}

TEST(Gguf, DuplicateKeysAndBadBools) {
  GgufBuilder g = sample();
  g.kv_u32("llama.block_count", 3);
  EXPECT_NE(parse_error(g.build()).find("duplicate metadata key"), std::string::npos);
  GgufBuilder b;
  b.kv_bool("flag", true);
  auto bytes = b.build();
  // Set the bool byte (right after "flag" + type) to 2.
  const size_t pos = 4 + 4 + 8 + 8 + 8 + 4 + 4;
  bytes[pos] = 2;
  EXPECT_NE(parse_error(bytes).find("bool value 2"), std::string::npos);
}

}  // namespace
}  // namespace lychee
