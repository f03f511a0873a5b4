// The built-in word lists and the made-up word generators (see words.h).
#include "eval/words.h"

#include <vector>

namespace lychee {
namespace {

// Written for lychee; checked by tests/test_eval_tasks.cpp (distinct, no word inside another).
constexpr std::string_view kKeyWords[] = {
    "apple", "anchor", "autumn", "badge", "bakery", "balloon", "bamboo", "banana", "barrel",
    "basket", "beacon", "berry", "blanket", "bottle", "bracelet", "bridge", "bright", "bronze",
    "bubble", "bucket", "butter", "cabin", "cactus", "camera", "candle", "canyon", "carpet",
    "castle", "cherry", "circle", "clever", "cloud", "coffee", "comet", "copper", "cotton",
    "crystal", "curtain", "daisy", "desert", "diamond", "dolphin", "dragon", "eager", "eagle",
    "echo", "elbow", "ember", "engine", "falcon", "feather", "fierce", "forest", "fossil",
    "fountain", "galaxy", "garden", "garlic", "gentle", "giant", "ginger", "glacier", "golden",
    "granite", "gravel", "harbor", "hammer", "harvest", "hidden", "honey", "horizon", "humble",
    "island", "ivory", "jacket", "jungle", "kettle", "kitten", "ladder", "lantern", "lemon",
    "lively", "lizard", "marble", "meadow", "mellow", "mirror", "monkey", "mountain", "muffin",
    "narrow", "needle", "noble", "ocean", "orange", "orchid", "oyster", "paddle", "palace",
    "panda", "parrot", "pebble", "pepper", "pillow", "planet", "pocket", "polite", "potato",
    "pumpkin", "puzzle", "quiet", "rabbit", "radish", "rapid", "raven", "ribbon", "river",
    "rocket", "rustic", "saddle", "salmon", "scarlet", "shadow", "silver", "simple", "sleepy",
    "spider", "spring", "steady", "stone", "sturdy", "sugar", "summer", "sunset", "swift",
    "tablet", "tender", "thunder", "tiger", "timber", "tomato", "tulip", "turtle", "velvet",
    "violet", "walnut", "window", "winter", "wizard", "yellow", "zebra", "amber", "bold", "brave",
    "calm", "cozy", "crisp", "dusty", "fancy", "fluffy", "frozen", "glossy", "grumpy", "hollow",
    "jolly", "keen", "lucky", "mighty", "misty", "modest", "nimble", "patient", "proud", "royal",
    "rusty", "sandy", "shiny", "silky", "smooth", "snowy", "sparkling", "spicy", "stormy",
    "sunny", "tidy", "tiny", "vivid", "wild", "windy", "wise", "wooden", "zesty", "acorn",
    "beetle", "biscuit", "compass", "meteor", "napkin", "pirate", "quartz", "robin", "sapphire",
    "trumpet", "umbrella", "violin", "whistle", "yogurt"
};
constexpr std::string_view kListWords[] = {
    "ability", "action", "adult", "advice", "airport", "alarm", "album", "animal", "answer",
    "army", "artist", "author", "avenue", "baby", "bag", "band", "bank", "bath", "beach", "bean",
    "bear", "bed", "bell", "bicycle", "bird", "blade", "board", "boat", "body", "bone", "book",
    "boot", "bowl", "box", "brain", "branch", "bread", "brick", "brother", "brush", "building",
    "bus", "cable", "cake", "camp", "card", "cart", "cat", "chain", "chair", "chalk", "cheese",
    "chest", "chicken", "child", "church", "city", "class", "clock", "coat", "coin", "college",
    "color", "corner", "country", "cousin", "cow", "crane", "cream", "crowd", "cup", "dance",
    "daughter", "deer", "dentist", "desk", "dinner", "doctor", "dog", "door", "dream", "dress",
    "drum", "duck", "earth", "egg", "energy", "event", "eye", "face", "factory", "family", "farm",
    "father", "fence", "field", "finger", "fire", "fish", "flag", "flame", "floor", "flower",
    "flute", "fog", "food", "foot", "fork", "fox", "friend", "frog", "fruit", "game", "gate",
    "ghost", "gift", "girl", "glass", "glove", "goat", "grape", "grass", "guitar", "hall", "hand",
    "hat", "head", "heart", "hill", "hole", "horse", "hospital", "hotel", "house", "idea", "ink",
    "insect", "iron", "jar", "jelly", "jewel", "judge", "juice", "king", "kitchen", "kite",
    "knee", "knife", "lake", "lamp", "leaf", "letter", "library", "light", "lion", "lunch",
    "machine", "map", "market", "mask", "meal", "milk", "mind", "mint", "money", "moon",
    "morning", "mother", "mouse", "mouth", "movie", "mud", "music", "nail", "neck", "nest",
    "night", "nose", "note", "nurse", "oak", "office", "oil", "onion", "page", "paint", "paper",
    "party", "pasta", "path", "pear", "pencil", "piano", "picture", "pie", "pig", "pilot", "pine",
    "pipe", "plate", "poem", "police", "pond", "pool", "price", "prince", "queen", "road", "roof",
    "room", "root", "rope", "rose", "salt", "school", "sea", "seed", "sheep", "shell", "ship",
    "shirt", "shoe", "shop", "singer", "sister", "skirt", "sky", "snake", "soap", "sock", "sofa",
    "soldier", "song", "soup", "spoon", "square", "stage", "star", "station", "steam", "story",
    "street", "student", "tail", "teacher", "tent", "theater", "thread", "throat", "toast", "toe",
    "tongue", "tooth", "towel", "tower", "town", "toy", "train", "truck", "uncle", "valley",
    "van", "vase", "village", "wagon", "wall", "watch", "water", "wave", "wheel", "whale", "wine",
    "wing", "wolf", "wool", "worm", "yard", "garage", "helmet", "hunter", "jeans", "lawyer",
    "magnet", "medal", "motor", "orbit", "oven", "parcel", "pickle", "puppy", "saucer", "scarf",
    "sponge", "statue", "tunnel", "vessel", "warrior", "cookie", "lobster", "plumber", "tractor"
};

}  // namespace

std::span<const std::string_view> key_words() { return kKeyWords; }

std::span<const std::string_view> list_words() {
  static const std::vector<std::string_view> words = [] {
    std::vector<std::string_view> all(std::begin(kKeyWords), std::end(kKeyWords));
    all.insert(all.end(), std::begin(kListWords), std::end(kListWords));
    return all;
  }();
  return words;
}

std::string coded_word(SampleRng& rng) {
  static constexpr std::string_view kConsonants = "bcdfghjklmnprstvz";
  static constexpr std::string_view kVowels = "aeiou";
  std::string word;
  for (int i = 0; i < 5; ++i) {
    const std::string_view set = i % 2 == 0 ? kConsonants : kVowels;
    word += set[rng.below(set.size())];
  }
  return word;
}

std::string variable_name(SampleRng& rng) {
  std::string name;
  for (int i = 0; i < 5; ++i) name += char('A' + rng.below(26));
  return name;
}

std::string random_number(SampleRng& rng, int n_digits) {
  LY_CHECK(n_digits >= 1 && n_digits <= 18, ErrorCode::kInvalidArgument,
           "random_number: n_digits must be in [1, 18], got {}", n_digits);
  int64_t lo = 1;
  for (int i = 1; i < n_digits; ++i) lo *= 10;
  return std::to_string(rng.between(n_digits == 1 ? 0 : lo, lo * 10 - 1));
}

}  // namespace lychee
