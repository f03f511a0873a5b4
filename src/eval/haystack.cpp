// Haystack corpora and needle placement (see haystack.h).
#include "eval/haystack.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/mmap_file.h"

namespace lychee {
namespace {

namespace fs = std::filesystem;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v';
}

// A word ends a sentence when its last character, after closing quotes and brackets, is . ! or ?
bool ends_sentence(std::string_view w) {
  while (!w.empty() && (w.back() == '"' || w.back() == '\'' || w.back() == ')' || w.back() == ']'))
    w.remove_suffix(1);
  return !w.empty() && (w.back() == '.' || w.back() == '!' || w.back() == '?');
}

// ... and the next word starts one when it opens with a capital, a digit or a quote (so "e.g. x"
// and "3.5 m" stay inside their sentence).
bool opens_sentence(std::string_view w) {
  const char c = w.empty() ? ' ' : w.front();
  return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '"' || c == '\'' || c == '(' ||
         c == '[';
}

// Written for lychee: short, plain and true, so they never compete with a needle.
constexpr std::string_view kSyntheticText =
    "The river runs down to the sea. The hills are quiet today. A bird sings in the old tree. "
    "Clouds drift over the town. Time moves on. ";

}  // namespace

std::vector<double> spread_depths(double depth, size_t n_needles) {
  if (n_needles <= 1) return std::vector<double>(n_needles, depth);
  constexpr double kWindow = 0.2;
  const double lo = std::clamp(depth - kWindow / 2, 0.0, 1.0 - kWindow);
  std::vector<double> depths(n_needles);
  for (size_t i = 0; i < n_needles; ++i)
    depths[i] = lo + kWindow * double(i) / double(n_needles - 1);
  return depths;
}

Haystack Haystack::from_text(const std::string& text, std::string name) {
  Haystack h;
  h.name_ = std::move(name);
  h.text_.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t begin = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i == begin) break;
    if (!h.text_.empty()) h.text_ += ' ';
    h.word_begin_.push_back(uint32_t(h.text_.size()));
    h.text_.append(text, begin, i - begin);
    h.word_end_.push_back(uint32_t(h.text_.size()));
  }
  LY_CHECK(!h.word_begin_.empty(), ErrorCode::kInvalidArgument, "haystack '{}' has no words",
           h.name_);
  LY_CHECK(h.text_.size() < UINT32_MAX, ErrorCode::kInvalidArgument,
           "haystack '{}' is too large: {} bytes", h.name_, h.text_.size());
  const size_t n = h.word_begin_.size();
  h.sentence_start_.assign(n, 0);
  for (size_t w = 0; w < n; ++w) {
    const bool starts = w == 0 || (ends_sentence(h.word(w - 1)) && opens_sentence(h.word(w)));
    h.sentence_start_[w] = starts ? 1 : 0;
    if (starts) h.sentence_words_.push_back(w);
  }
  return h;
}

std::vector<std::string> essay_files(const std::string& dir) {
  LY_CHECK(fs::is_directory(dir), ErrorCode::kNotFound,
           "haystack essays directory not found: {} (run scripts/fetch_assets.sh)", dir);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".txt")
      files.push_back(entry.path().string());
  LY_CHECK(!files.empty(), ErrorCode::kNotFound, "no .txt essays in haystack directory {}", dir);
  std::sort(files.begin(), files.end());
  return files;
}

Haystack Haystack::essays(const std::string& dir) {
  std::string text;
  for (const std::string& f : essay_files(dir)) {
    text += read_text_file(f);
    text += '\n';
  }
  return from_text(text, "essays");
}

Haystack Haystack::synthetic() { return from_text(std::string(kSyntheticText), "synthetic"); }

std::string_view Haystack::word(size_t w) const {
  w %= n_words();
  return std::string_view(text_).substr(word_begin_[w], word_end_[w] - word_begin_[w]);
}

size_t Haystack::nearest_boundary(size_t first, size_t n, double depth) const {
  const auto target = size_t(std::llround(std::clamp(depth, 0.0, 1.0) * double(n)));
  auto is_boundary = [&](size_t k) { return k == 0 || k == n || starts_sentence(first + k); };
  for (size_t d = 0;; ++d) {
    if (d <= target && is_boundary(target - d)) return target - d;
    if (target + d <= n && is_boundary(target + d)) return target + d;
  }
}

std::string Haystack::weave(size_t first, size_t n, std::span<const Insertion> insertions) const {
  std::vector<std::pair<size_t, size_t>> at;  // (boundary, insertion index), ordered
  for (size_t i = 0; i < insertions.size(); ++i)
    at.emplace_back(nearest_boundary(first, n, insertions[i].depth), i);
  std::stable_sort(at.begin(), at.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  out.reserve((text_.size() / n_words() + 1) * n + 256);
  auto append = [&out](std::string_view s) {
    if (!out.empty()) out += ' ';
    out += s;
  };
  size_t next = 0;
  for (size_t k = 0; k <= n; ++k) {
    for (; next < at.size() && at[next].first == k; ++next)
      append(insertions[at[next].second].text);
    if (k < n) append(word(first + k));
  }
  return out;
}

}  // namespace lychee
