// The safetensors parser and the checkpoint validator: every corruption gives one clear error
// naming the file, tensor or field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

std::vector<uint8_t> with_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0x3f);
  return out;
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    SafetensorsFile::parse(bytes, "x.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WritesAndReadsBack) {
  const std::string dir = test::temp_dir("st_roundtrip");
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7};
  const SafetensorsWriteItem items[] = {{"a", {2, 3}, a}, {"b", {1}, b}};
  write_safetensors_f32(dir + "/t.safetensors", items);
  const SafetensorsFile f = SafetensorsFile::open(dir + "/t.safetensors");
  const SafetensorsTensor* t = f.find("a");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->dtype, DType::kF32);
  float v;
  std::memcpy(&v, t->data + 5 * 4, 4);
  EXPECT_EQ(v, 6.0f);
}

TEST(Safetensors, EveryTruncationIsAnError) {
  const auto bytes = with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string err = parse_error({bytes.begin(), bytes.begin() + long(n)});
    EXPECT_NE(err.find("x.safetensors"), std::string::npos) << "prefix " << n << ": " << err;
  }
  EXPECT_EQ(parse_error(bytes), "");
}

TEST(Safetensors, HeaderErrors) {
  auto huge = with_header("{}", 0);
  const uint64_t n = 1000;
  std::memcpy(huge.data(), &n, 8);
  EXPECT_NE(parse_error(huge).find("runs past the end of the file"), std::string::npos);
  EXPECT_NE(parse_error(with_header("{\"a\": [", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(with_header("[1,2]", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", 4))
                .find("unknown dtype 'F17'"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4))
                .find("non-negative"),
            std::string::npos);
}

TEST(Safetensors, ShapeTimesDtypeMustEqualBytes) {
  const std::string err =
      parse_error(with_header(R"({"w":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,20]}})", 24));
  EXPECT_NE(err.find("tensor 'w'"), std::string::npos) << err;
  EXPECT_NE(err.find("expected 24"), std::string::npos) << err;
}

TEST(Safetensors, OffsetsOutOfRangeOrOverlapping) {
  EXPECT_NE(parse_error(with_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16))
                .find("outside the data section"),
            std::string::npos);
  EXPECT_NE(parse_error(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,0]}})", 16))
                .find("outside the data section"),
            std::string::npos);
  const std::string err = parse_error(with_header(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
}

// ---- Checkpoint validation against the weight table ----

std::string open_error(const std::string& path, ErrorCode* code = nullptr) {
  try {
    Checkpoint::open(path);
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(Checkpoint, TinyHfModelLoads) {
  const std::string dir = test::write_tiny_hf(test::temp_dir("ck_ok"), test::tiny_llama_config_json());
  const Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.config().n_layers, 2);
  EXPECT_EQ(ck.config().head_dim, 8);
  ASSERT_NE(ck.weight(WeightId::kWq, 1), nullptr);
  EXPECT_EQ(ck.weight(WeightId::kBq, 0), nullptr);
  const HostWeights w = HostWeights::load(ck);
  EXPECT_FLOAT_EQ(w.get(WeightId::kWDown, 1)[5], 0.01f);
}

TEST(Checkpoint, MissingTensorIsNamed) {
  const std::string dir = test::write_tiny_hf(test::temp_dir("ck_missing"), test::tiny_llama_config_json(),
                                              {.drop = "model.layers.1.mlp.up_proj.weight"});
  ErrorCode code{};
  const std::string err = open_error(dir, &code);
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_NE(err.find("missing tensor 'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("[24, 16]"), std::string::npos) << err;
}

TEST(Checkpoint, WrongShapeSaysExpectedAndGot) {
  const std::string dir = test::write_tiny_hf(test::temp_dir("ck_shape"), test::tiny_llama_config_json(),
                                              {.reshape = "model.layers.0.self_attn.k_proj.weight", .shape = {16, 16}});
  const std::string err = open_error(dir);
  EXPECT_NE(err.find("tensor 'model.layers.0.self_attn.k_proj.weight' has wrong shape; expected [8, 16], got [16, 16]"),
            std::string::npos) << err;
}

TEST(Checkpoint, ConfigErrors) {
  auto cfg = test::tiny_llama_config_json();
  cfg["architectures"] = {"GPT2LMHeadModel"};
  std::string dir = test::write_tiny_hf(test::temp_dir("ck_arch"), cfg);
  ErrorCode code{};
  EXPECT_NE(open_error(dir, &code).find("unknown architecture 'GPT2LMHeadModel'"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kUnsupported);

  cfg = test::tiny_llama_config_json();
  cfg.erase("hidden_size");
  dir = test::write_tiny_hf(test::temp_dir("ck_field"), cfg);
  EXPECT_NE(open_error(dir).find("missing field 'hidden_size'"), std::string::npos);

  cfg = test::tiny_llama_config_json();
  cfg["num_key_value_heads"] = 3;
  dir = test::write_tiny_hf(test::temp_dir("ck_gqa"), cfg);
  EXPECT_NE(open_error(dir).find("not a multiple of 3 key/value heads"), std::string::npos);

  dir = test::write_tiny_hf(test::temp_dir("ck_json"), test::tiny_llama_config_json());
  std::ofstream(dir + "/config.json") << "{\"hidden_size\": 16,";
  EXPECT_NE(open_error(dir).find("config.json: not valid JSON"), std::string::npos);

  EXPECT_NE(open_error("/nonexistent/model").find("no such file or directory"), std::string::npos);
}

TEST(Checkpoint, ShardIndexErrors) {
  const std::string dir = test::write_tiny_hf(test::temp_dir("ck_shards"), test::tiny_llama_config_json());
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})";
  EXPECT_NE(open_error(dir).find("model-00002-of-00002.safetensors: cannot open"), std::string::npos);
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "../../etc/passwd"}})";
  EXPECT_NE(open_error(dir).find("not a file in the directory"), std::string::npos);
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"no.such.tensor": "model.safetensors"}})";
  EXPECT_NE(open_error(dir).find("index says tensor 'no.such.tensor'"), std::string::npos);
}

TEST(Checkpoint, GgufMissingAndMisshapenTensors) {
  const std::string dir = test::temp_dir("ck_gguf");
  const std::string ok = test::write_bytes(dir + "/ok.gguf", test::tiny_llama_gguf().build());
  const Checkpoint ck = Checkpoint::open(ok);
  EXPECT_EQ(ck.config().n_kv_heads, 1);
  EXPECT_FALSE(ck.config().tie_embeddings);

  const std::string missing = test::write_bytes(dir + "/missing.gguf",
                                                test::tiny_llama_gguf({.drop = "blk.1.ffn_down.weight"}).build());
  EXPECT_NE(open_error(missing).find("missing tensor 'blk.1.ffn_down.weight'"), std::string::npos);

  const std::string shape = test::write_bytes(
      dir + "/shape.gguf", test::tiny_llama_gguf({.reshape = "blk.0.attn_q.weight", .shape = {16, 8}}).build());
  EXPECT_NE(open_error(shape).find("tensor 'blk.0.attn_q.weight' has wrong shape; expected [16, 16], got [8, 16]"),
            std::string::npos) << open_error(shape);

  const std::string arch = test::write_bytes(dir + "/arch.gguf", [&] {
    test::GgufBuilder b;
    b.kv_str("general.architecture", "gpt2");
    return b.build();
  }());
  EXPECT_NE(open_error(arch).find("GGUF architecture 'gpt2' is not supported"), std::string::npos);
  EXPECT_NE(open_error(test::write_bytes(dir + "/junk.bin", {1, 2, 3})).find("neither a model directory"),
            std::string::npos);
}

// llama.cpp stores Q/K rows interleaved per head; the loader must give back HF's order.
TEST(Checkpoint, GgufQkRowsAreUnpermuted) {
  const ModelConfig c = test::tiny_llama_config();
  const int hd = c.head_dim;
  // HF-order Wk [kv_dim=8, 16] with row r filled with value r; permute as the converter does.
  std::vector<float> file_rows(size_t(c.kv_dim()) * c.d_model);
  for (int h = 0; h < c.n_kv_heads; ++h)
    for (int i = 0; i < hd / 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int col = 0; col < c.d_model; ++col)
          file_rows[size_t((h * hd + 2 * i + j) * c.d_model + col)] = float(h * hd + j * hd / 2 + i);
  test::GgufBuilder g = test::tiny_llama_gguf({.drop = "blk.0.attn_k.weight"});
  std::vector<uint8_t> bytes(file_rows.size() * 4);
  std::memcpy(bytes.data(), file_rows.data(), bytes.size());
  g.tensor({"blk.0.attn_k.weight", {uint64_t(c.d_model), uint64_t(c.kv_dim())}, 0, bytes});
  const std::string path = test::write_bytes(test::temp_dir("ck_perm") + "/p.gguf", g.build());
  const Checkpoint ck = Checkpoint::open(path);
  std::vector<float> wk(file_rows.size());
  ck.read_f32(WeightId::kWk, 0, wk.data());
  for (int r = 0; r < c.kv_dim(); ++r) EXPECT_EQ(wk[size_t(r * c.d_model)], float(r)) << "row " << r;
}

}  // namespace
}  // namespace lychee
