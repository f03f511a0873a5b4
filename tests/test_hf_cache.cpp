// Hugging Face cache ids (model/hf_cache.h) on a cache laid out as huggingface_hub lays it out
// (blobs/, snapshots/<commit>/ of relative links, refs/main); tests/python/test_hf_cache.py checks
// the same layout against huggingface_hub itself and chats through the Python package.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unistd.h>

#include "core/error.h"
#include "model/hf_cache.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lychee {
namespace {

// A temporary cache folder, removed at the end.
class HfCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lychee_hf_cache_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Adds repo's file at snapshot `commit` as huggingface_hub does: the bytes in blobs/<name>, a
  // relative link in snapshots/<commit>/<file>.
  void add(const std::string& repo, const std::string& commit, const std::string& file,
           const std::string& bytes = "x", const fs::path& target = {}) {
    const fs::path dir = repo_dir(repo);
    const std::string blob_name = std::to_string(std::hash<std::string>{}(repo + commit + file));
    const fs::path blob = dir / "blobs" / blob_name;
    fs::create_directories(blob.parent_path());
    if (target.empty()) {
      std::ofstream(blob) << bytes;
    } else {
      fs::create_symlink(fs::absolute(target), blob);
    }
    const fs::path link = dir / "snapshots" / commit / file;
    fs::create_directories(link.parent_path());
    fs::create_symlink(fs::relative(blob, link.parent_path()), link);
  }
  void set_main(const std::string& repo, const std::string& commit) {
    fs::create_directories(repo_dir(repo) / "refs");
    std::ofstream(repo_dir(repo) / "refs" / "main") << commit;  // no newline, as huggingface_hub writes it
  }
  fs::path repo_dir(const std::string& repo) const {
    const size_t s = repo.find('/');
    return root_ / ("models--" + repo.substr(0, s) + "--" + repo.substr(s + 1));
  }
  fs::path snapshot(const std::string& repo, const std::string& commit) const {
    return repo_dir(repo) / "snapshots" / commit;
  }
  std::string resolve(const std::string& text) const {
    return resolve_hf_model(*parse_hf_model_id(text), {(root_ / "elsewhere").string(), root_.string()});
  }

  fs::path root_;
};

TEST(HfModelId, Parse) {
  const auto id = parse_hf_model_id("HuggingFaceTB/SmolLM2-135M-Instruct");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->repo, "HuggingFaceTB/SmolLM2-135M-Instruct");
  EXPECT_EQ(id->quant, "");
  const auto q = parse_hf_model_id("bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->repo, "bartowski/Qwen2.5-7B-Instruct-GGUF");
  EXPECT_EQ(q->quant, "Q4_K_M");
  for (const char* not_id : {"model.gguf", "/abs/org/name", "./org/name", "../org/name", "a/b/c", "org/", "/name",
                             "org/name:", "org/na me", "org/..", "org/name:Q4/x", ""})
    EXPECT_FALSE(parse_hf_model_id(not_id)) << not_id;
}

TEST(HfModelId, CacheDirsFollowTheEnvironment) {
  const auto saved = [](const char* n) { const char* v = std::getenv(n); return v ? std::optional<std::string>(v) : std::nullopt; };
  const char* names[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> old;
  for (const char* n : names) old.push_back(saved(n));
  for (const char* n : names) ::unsetenv(n);
  ::setenv("HOME", "/h", 1);
  EXPECT_EQ(hf_cache_dirs(), std::vector<std::string>({"/h/.cache/huggingface/hub"}));
  ::setenv("HF_HOME", "/hf", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  ::setenv("HF_HUB_CACHE", "/hub", 1);
  EXPECT_EQ(hf_cache_dirs(),
            std::vector<std::string>({"/hub", "/hf/hub", "/xdg/huggingface/hub", "/h/.cache/huggingface/hub"}));
  for (size_t i = 0; i < old.size(); ++i) {
    if (old[i]) ::setenv(names[i], old[i]->c_str(), 1);
    else ::unsetenv(names[i]);
  }
}

TEST_F(HfCache, SafetensorsSnapshotByRefsMain) {
  add("org/model", "c1", "config.json");
  add("org/model", "c1", "model.safetensors");
  add("org/model", "c2", "config.json");
  add("org/model", "c2", "model-00001-of-00002.safetensors");
  add("org/model", "c2", "model-00002-of-00002.safetensors");
  add("org/model", "c2", "model.safetensors.index.json");
  set_main("org/model", "c2");
  EXPECT_EQ(resolve("org/model"), snapshot("org/model", "c2").string());
  set_main("org/model", "c1");
  EXPECT_EQ(resolve("org/model"), snapshot("org/model", "c1").string());
  set_main("org/model", "c3");
  test::expect_error([&] { resolve("org/model"); }, ErrorCode::kNotFound, "refs/main names snapshot 'c3'");
}

TEST_F(HfCache, OnlySnapshotWithoutRefs) {
  add("org/model", "c1", "config.json");
  add("org/model", "c1", "model.safetensors");
  EXPECT_EQ(resolve("org/model"), snapshot("org/model", "c1").string());
  add("org/model", "c2", "config.json");
  test::expect_error([&] { resolve("org/model"); }, ErrorCode::kInvalidArgument, "no refs/main", "c1, c2");
}

TEST_F(HfCache, GgufByQuantCaseInsensitive) {
  const std::string repo = "org/Model-GGUF";
  for (const char* f : {"Model.Q4_1.gguf", "Model-Q4_K_M.gguf", "model-q8_0.gguf", "mmproj-Model-Q8_0.gguf",
                        "Q6_K/Model-Q6_K-00001-of-00002.gguf", "Q6_K/Model-Q6_K-00002-of-00002.gguf", "README.md"})
    add(repo, "c1", f);
  set_main(repo, "c1");
  const fs::path s = snapshot(repo, "c1");
  EXPECT_EQ(resolve(repo + ":q4_1"), (s / "Model.Q4_1.gguf").string());
  EXPECT_EQ(resolve(repo + ":Q4_K_M"), (s / "Model-Q4_K_M.gguf").string());
  EXPECT_EQ(resolve(repo + ":Q8_0"), (s / "model-q8_0.gguf").string());  // not the projector
  test::expect_error([&] { resolve(repo + ":Q6_K"); }, ErrorCode::kUnsupported, "split in 2 files");
  test::expect_error([&] { resolve(repo + ":Q5_K_M"); }, ErrorCode::kInvalidArgument, "'Q5_K_M'", "Model.Q4_1.gguf",
                     "model-q8_0.gguf");
  test::expect_error([&] { resolve(repo + ":K_M"); }, ErrorCode::kInvalidArgument, "'K_M'");  // not a whole name
  test::expect_error([&] { resolve(repo); }, ErrorCode::kInvalidArgument, "GGUF files", ":QUANT");
}

TEST_F(HfCache, AmbiguousQuantAndTheOnlyGguf) {
  add("org/a", "c1", "a-Q4_0.gguf");
  add("org/a", "c1", "b-Q4_0.gguf");
  set_main("org/a", "c1");
  test::expect_error([&] { resolve("org/a:Q4_0"); }, ErrorCode::kInvalidArgument, "several", "a-Q4_0.gguf",
                     "b-Q4_0.gguf");
  add("org/b", "c1", "only.Q4_0.gguf");
  set_main("org/b", "c1");
  EXPECT_EQ(resolve("org/b"), (snapshot("org/b", "c1") / "only.Q4_0.gguf").string());
}

TEST_F(HfCache, MissingModelSaysWhereAndHow) {
  test::expect_error([&] { resolve("HuggingFaceTB/SmolLM2-135M-Instruct"); }, ErrorCode::kNotFound,
                     "no such file or directory", (root_ / "elsewhere" / "models--HuggingFaceTB--SmolLM2-135M-Instruct").string(),
                     (root_ / "models--HuggingFaceTB--SmolLM2-135M-Instruct").string(),
                     "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct");
  test::expect_error([&] { resolve("org/x-GGUF:Q4_K_M"); }, ErrorCode::kNotFound,
                     "huggingface-cli download org/x-GGUF --include \"*Q4_K_M*.gguf\"");
}

// resolve_model_path: an existing path wins over the cache; text that is not an id is unchanged.
TEST_F(HfCache, ExistingPathsAreNotIds) {
  EXPECT_EQ(resolve_model_path(""), "");
  EXPECT_EQ(resolve_model_path("no-such-model.gguf"), "no-such-model.gguf");
  const fs::path local = root_ / "org" / "model";
  fs::create_directories(local);
  const fs::path cwd = fs::current_path();
  fs::current_path(root_);
  EXPECT_EQ(resolve_model_path("org/model"), "org/model");
  fs::current_path(cwd);
}

// The default model's GGUF in a cache, chosen by :q4_1, loads and chats through the CLI exactly
// as the file itself does.
TEST_F(HfCache, DefaultModelChatsThroughTheCache) {
  LY_REQUIRE_DEFAULT_MODEL(gguf);
  const std::string repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";
  add(repo, "0123abcd", "SmolLM2-135M-Instruct.Q4_1.gguf", "", gguf);
  add(repo, "0123abcd", "SmolLM2-135M-Instruct.Q8_0.gguf", "never opened");
  set_main(repo, "0123abcd");
  const std::string args = " --chat -p 'Name a colour.' -n 6 --device cpu";
  const test::RunResult direct = test::run_cli("generate -m " + gguf + args);
  ASSERT_EQ(direct.status, 0) << direct.output;
  const char* old = std::getenv("HF_HUB_CACHE");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("HF_HUB_CACHE", root_.c_str(), 1);  // the CLI inherits it
  const test::RunResult via = test::run_cli("generate -m " + repo + ":q4_1" + args);
  const test::RunResult missing = test::run_cli("generate -m " + repo + ":Q5_K_M" + args);
  if (saved) ::setenv("HF_HUB_CACHE", saved->c_str(), 1);
  else ::unsetenv("HF_HUB_CACHE");
  ASSERT_EQ(via.status, 0) << via.output;
  EXPECT_EQ(via.output, direct.output);
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("SmolLM2-135M-Instruct.Q4_1.gguf"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace lychee
