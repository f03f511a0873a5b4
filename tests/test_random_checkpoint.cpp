// scripts/gpu/make_random_checkpoint.py (issue 40's 8B-shaped checkpoint for timing train-heads
// through the real loader) copies the default model's tokenizer out of its GGUF into
// tokenizer.json: the Hugging Face tokenizer it writes must encode and decode exactly as the
// GGUF's own (the loader of an HF directory reads only tokenizer.json). The weights it writes need
// torch or numpy and 16 GB: the GPU machine's bench-train stage runs them.
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

}  // namespace
}  // namespace lychee
