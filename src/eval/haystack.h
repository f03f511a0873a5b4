// The text that retrieval prompts hide their needles in: a corpus of words, read as an endless
// loop (a sample longer than the corpus wraps around to its start), with the sentence starts
// marked so needles go between sentences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lychee {

// A text placed into the haystack at a fraction of its length.
struct Insertion {
  double depth = 0.0;  // in [0, 1]: 0 = before the first word, 1 = after the last
  std::string text;
};

// Where k needles go for a sample of depth d: one needle at d; k > 1 needles evenly over a window
// of width 0.2 that holds d at its centre, shifted to stay inside [0, 1] (depth 0 -> 0, 0.067,
// 0.133, 0.2). Ascending.
std::vector<double> spread_depths(double depth, size_t n_needles);

// The Paul Graham essays' files: every *.txt file of dir, in sorted filename order. Error(kNotFound)
// naming dir when it is missing or holds no .txt file.
std::vector<std::string> essay_files(const std::string& dir);

class Haystack {
 public:
  // The Paul Graham essays: every *.txt file of dir in sorted filename order, concatenated.
  // Error(kNotFound) naming dir when it is missing or holds no .txt file.
  static Haystack essays(const std::string& dir);
  // Plain repeated filler sentences (no corpus needed): the easiest haystack.
  static Haystack synthetic();
  // Any text; name labels it in errors and reports. Error(kInvalidArgument) when it has no word.
  static Haystack from_text(const std::string& text, std::string name);

  const std::string& name() const { return name_; }
  size_t n_words() const { return word_begin_.size(); }
  size_t n_sentences() const { return sentence_words_.size(); }
  // The word index where sentence i (mod n_sentences) starts.
  size_t sentence_start(size_t i) const { return sentence_words_[i % n_sentences()]; }
  // Whether word w (mod n_words) starts a sentence.
  bool starts_sentence(size_t w) const { return sentence_start_[w % n_words()] != 0; }

  // n words from word `first` on (wrapping around), joined by single spaces, with each insertion
  // at the sentence boundary nearest depth * n (ties go to the earlier one; position 0 and n
  // count as boundaries); insertions at one boundary keep their order.
  std::string weave(size_t first, size_t n, std::span<const Insertion> insertions) const;

 private:
  Haystack() = default;
  std::string_view word(size_t w) const;
  size_t nearest_boundary(size_t first, size_t n, double depth) const;

  std::string name_;
  std::string text_;                     // whitespace collapsed to single spaces
  std::vector<uint32_t> word_begin_;     // [n_words] byte offset of each word in text_
  std::vector<uint32_t> word_end_;       // [n_words]
  std::vector<uint8_t> sentence_start_;  // [n_words] 1 where a sentence starts
  std::vector<size_t> sentence_words_;   // [n_sentences] word index of each sentence start
};

}  // namespace lychee
