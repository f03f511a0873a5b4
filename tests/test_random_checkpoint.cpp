// scripts/gpu/make_random_checkpoint.py (issue 40's 8B-shaped checkpoint for timing train-heads
// through the real loader) copies the default model's tokenizer out of its GGUF into
// tokenizer.json: the Hugging Face tokenizer it writes must encode and decode exactly as the
// GGUF's own (the loader of an HF directory reads only tokenizer.json). Its files load through the
// real loader and train-heads trains on them, stops (--stop-after) and resumes: the same script
// at its "tiny" shape (plain Python random bits; the 8B shape needs torch or numpy and 16 GB: the
// GPU machine's bench-train stage runs it).
#include <gtest/gtest.h>

#include <filesystem>

#include "model/tokenizer.h"
#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

TEST(RandomCheckpoint, TokenizerCopiedFromTheGgufEncodesAsTheGguf) {
  LY_REQUIRE_DEFAULT_TOKENIZER(gguf_tok);
  const std::string dir = test::temp_dir("random_checkpoint_tokenizer");
  std::filesystem::remove_all(dir);
  const test::RunResult r = test::run_shell("python3 " + std::string(LYCHEE_SOURCE_DIR) +
                                            "/scripts/gpu/make_random_checkpoint.py --tokenizer-only "
                                            "--tokenizer-gguf " + gguf_tok_path_ + " --out " + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  const Tokenizer hf = Tokenizer::from_hf_dir(dir);
  EXPECT_EQ(hf.vocab_size(), gguf_tok.vocab_size());
  const std::string texts[] = {
      "Below is a long text. Hidden in it are 10 passkeys to a vault, each a sequence of 32 words.",
      "The first passkey to the vault is this sequence of words: golf kilo xray zulu.",
      "What is the 21st passkey?\nPasskey: alpha bravo  charlie\n\n",
      "Numbers 1234567890, 3.14159 and unicode: naïve café – 東京 🙂 <|im_start|>user\nhi<|im_end|>",
      "   leading spaces, tabs\tand\r\nCRLF; trailing   "};
  for (const std::string& t : texts) {
    const std::vector<int32_t> a = hf.encode(t, true), b = gguf_tok.encode(t, true);
    EXPECT_EQ(a, b) << "'" << t << "'";
    EXPECT_EQ(hf.decode(a), gguf_tok.decode(b)) << "'" << t << "'";
  }
  EXPECT_EQ(hf.bos_id(), gguf_tok.bos_id());
  EXPECT_EQ(hf.eos_id(), gguf_tok.eos_id());
}

TEST(RandomCheckpoint, TinyCheckpointLoadsTrainsStopsAndResumes) {
  LY_REQUIRE_DEFAULT_MODEL(gguf);
  const std::string dir = test::temp_dir("random_checkpoint_tiny");
  std::filesystem::remove_all(dir);
  const test::RunResult w = test::run_shell("python3 " + std::string(LYCHEE_SOURCE_DIR) +
                                            "/scripts/gpu/make_random_checkpoint.py --shape tiny --shard-gb 0.004 "
                                            "--tokenizer-gguf " + gguf + " --out " + dir + "/model");
  ASSERT_EQ(w.status, 0) << w.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model/model-00002-of-00002.safetensors")) << "sharded: " << w.output;
  const std::string args = "train-heads -m " + dir + "/model --device cpu --steps 4 --retrieval-heads 1 --min-len 400"
                           " --max-len 700 --haystack synthetic --passkeys 2 --passkey-words 4 --log-every 1 -o " +
                           dir + "/run";
  const test::RunResult a = test::run_cli(args + " --stop-after 2");
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("stopped; continue with --resume"), std::string::npos) << a.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/roles.json"));
  const test::RunResult b = test::run_cli(args + " --resume");
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("resuming from step 2 of 4"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("step 4/4"), std::string::npos) << b.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/roles.json"));
  EXPECT_EQ(test::read_json(dir + "/run/summary.json")["steps_this_run"], 2);
}

}  // namespace
}  // namespace lychee
