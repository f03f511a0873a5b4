// Compute-thread count resolution (runtime/threads.h) and the CLI's --threads.
#include <gtest/gtest.h>

#include <omp.h>

#include "runtime/threads.h"
#include "test_util.h"

namespace lychee {
namespace {

TEST(Threads, ResolvesTheDefaultToTheAvailableCores) {
  EXPECT_GE(available_cores(), 1);
  EXPECT_EQ(resolve_compute_threads(0), available_cores());
  EXPECT_EQ(resolve_compute_threads(1), 1);
  EXPECT_EQ(resolve_compute_threads(3), 3);
}

TEST(Threads, SetsOpenMpToTheCount) {
  const int before = omp_get_max_threads();
  EXPECT_EQ(set_compute_threads(1), 1);
  EXPECT_EQ(compute_threads(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1);
  set_compute_threads(before);
  EXPECT_EQ(omp_get_max_threads(), before);
}

TEST(Threads, CliGeneratesWithOneThreadAndRejectsZero) {
  const std::string model = " -m " + test::golden_dir() + "/models/qwen3_tied_bf16";
  const test::RunResult r = test::run_cli("generate" + model + " --device cpu --threads 1 -p 'The quick' -n 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find_first_not_of(" \t\r\n"), std::string::npos) << "no text generated";
  const test::RunResult bad = test::run_cli("generate" + model + " --threads 0 -p hi");
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("--threads"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace lychee
