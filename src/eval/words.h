// Word sources for the retrieval tasks: built-in English word lists (needle keys, the common-words
// vocabulary) and generators of made-up words (coded words, variable names).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "eval/rng.h"

namespace lychee {

// ~200 common English nouns and adjectives: the keys of the magic-number needles.
std::span<const std::string_view> key_words();
// key_words() followed by ~300 more common nouns: the vocabulary of the common-words task. All
// distinct, lowercase ASCII, and no word is a substring of another, so a substring match of one
// word can never be satisfied by answering a different word of the list.
std::span<const std::string_view> list_words();

// A pronounceable made-up lowercase word of five letters, consonant-vowel-consonant-vowel-consonant
// ("bavok"): the vocabulary of the frequent-words task.
std::string coded_word(SampleRng& rng);
// Five uppercase letters ("QZKRA"): a variable name of the variable-tracking task.
std::string variable_name(SampleRng& rng);
// A decimal number of exactly n_digits digits, no leading zero (1 <= n_digits <= 18).
std::string random_number(SampleRng& rng, int n_digits);

}  // namespace lychee
