// Builds GGUF files in memory for tests: metadata of any type and tensors with raw bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace lychee::test {

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order
    uint32_t ggml_type;
    std::vector<uint8_t> data;
    int64_t offset_override = -1;  // to write corrupt offsets
  };

  uint32_t version = 3;
  std::string magic = "GGUF";
  uint32_t alignment = 32;

  void kv_u32(const std::string& key, uint32_t v) { kv_scalar(key, 4, &v, 4); }
  void kv_f32(const std::string& key, float v) { kv_scalar(key, 6, &v, 4); }
  void kv_bool(const std::string& key, bool v) { uint8_t b = v; kv_scalar(key, 7, &b, 1); }
  void kv_str(const std::string& key, const std::string& v) {
    put_str(kv_, key);
    put<uint32_t>(kv_, 8);
    put_str(kv_, v);
    ++n_kv_;
  }
  void kv_str_array(const std::string& key, const std::vector<std::string>& vs) {
    put_str(kv_, key);
    put<uint32_t>(kv_, 9);
    put<uint32_t>(kv_, 8);
    put<uint64_t>(kv_, vs.size());
    for (const auto& v : vs) put_str(kv_, v);
    ++n_kv_;
  }
  void kv_i32_array(const std::string& key, const std::vector<int32_t>& vs) {
    put_str(kv_, key);
    put<uint32_t>(kv_, 9);
    put<uint32_t>(kv_, 5);
    put<uint64_t>(kv_, vs.size());
    for (int32_t v : vs) put<int32_t>(kv_, v);
    ++n_kv_;
  }
  void kv_f32_array(const std::string& key, const std::vector<float>& vs) {
    put_str(kv_, key);
    put<uint32_t>(kv_, 9);
    put<uint32_t>(kv_, 6);
    put<uint64_t>(kv_, vs.size());
    for (float v : vs) put<float>(kv_, v);
    ++n_kv_;
  }
  void tensor(Tensor t) { tensors_.push_back(std::move(t)); }
  // A plain F32 tensor with the given ggml-order shape and values 0, 1, 2, ...
  void tensor_f32(const std::string& name, std::vector<uint64_t> ne) {
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    std::vector<uint8_t> bytes(n * 4);
    for (uint64_t i = 0; i < n; ++i) {
      const float f = float(i % 97) * 0.01f;
      std::memcpy(&bytes[i * 4], &f, 4);
    }
    tensors_.push_back({name, std::move(ne), 0, std::move(bytes)});
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out(magic.begin(), magic.end());
    put<uint32_t>(out, version);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      put_str(out, t.name);
      put<uint32_t>(out, uint32_t(t.ne.size()));
      for (auto d : t.ne) put<uint64_t>(out, d);
      put<uint32_t>(out, t.ggml_type);
      const uint64_t off = t.offset_override >= 0 ? uint64_t(t.offset_override) : offset;
      put<uint64_t>(out, off);
      offsets.push_back(off);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment != 0) out.push_back(0);
    const size_t data_start = out.size();
    out.resize(data_start + offset, 0);
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (tensors_[i].offset_override < 0)
        std::memcpy(out.data() + data_start + offsets[i], tensors_[i].data.data(), tensors_[i].data.size());
    return out;
  }

 private:
  template <typename T>
  static void put(std::vector<uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void put_str(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void kv_scalar(const std::string& key, uint32_t type, const void* v, size_t n) {
    put_str(kv_, key);
    put<uint32_t>(kv_, type);
    const auto* p = static_cast<const uint8_t*>(v);
    kv_.insert(kv_.end(), p, p + n);
    ++n_kv_;
  }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace lychee::test
