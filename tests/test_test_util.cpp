// The comparison helpers of test_util.h, each with its defect planted: a short or empty result,
// a NaN or an infinity in either input, one wrong element. The helpers must report the failure
// themselves (EXPECT_NONFATAL_FAILURE sees it) and return a value no tolerance accepts.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

namespace lychee {
namespace {

const std::vector<float> kRef = {1.0f, -2.0f, 3.0f, 0.5f};

TEST(RelError, EqualInputsAreZero) { EXPECT_EQ(test::rel_error(kRef, kRef), 0.0); }

TEST(RelError, OneWrongElementIsMeasured) {
  std::vector<float> got = kRef;
  got[2] = 3.5f;  // ‖Δ‖ = 0.5, ‖ref‖ = sqrt(14.25)
  EXPECT_NEAR(test::rel_error(got, kRef), 0.5 / std::sqrt(14.25), 1e-12);
  EXPECT_NONFATAL_FAILURE(EXPECT_LT(test::rel_error(got, kRef), 1e-2), "rel_error");
}

TEST(RelError, ShortOrEmptyResultFails) {
  const std::vector<float> short_got(kRef.begin(), kRef.begin() + 2), empty;
  double r = 0.0;
  EXPECT_NONFATAL_FAILURE(r = test::rel_error(short_got, kRef), "sizes differ: 2 values against 4");
  EXPECT_EQ(r, INFINITY);
  r = 0.0;
  EXPECT_NONFATAL_FAILURE(r = test::rel_error(empty, kRef), "sizes differ: 0 values against 4");
  EXPECT_EQ(r, INFINITY);
  // A longer result is as wrong as a shorter one (the old helper read only b.size() values).
  std::vector<float> longer = kRef;
  longer.push_back(7.0f);
  EXPECT_NONFATAL_FAILURE(r = test::rel_error(longer, kRef), "sizes differ: 5 values against 4");
  EXPECT_EQ(r, INFINITY);
}

TEST(RelError, NanOrInfInEitherInputFails) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> got = kRef;
    got[3] = bad;
    double r = 0.0;
    EXPECT_NONFATAL_FAILURE(r = test::rel_error(got, kRef), "non-finite value");
    EXPECT_EQ(r, INFINITY);
    EXPECT_NONFATAL_FAILURE(r = test::rel_error(kRef, got), "non-finite reference value");
    EXPECT_EQ(r, INFINITY);
  }
}

TEST(Deviation, OneWrongElementIsFoundWithItsIndex) {
  std::vector<float> got = kRef;
  got[1] = -2.25f;
  const test::Deviation d = test::deviation(got, kRef);
  EXPECT_TRUE(d.problem.empty());
  EXPECT_EQ(d.max_abs, 0.25);
  EXPECT_EQ(d.ref_max, 3.0);
  EXPECT_EQ(d.worst, 1u);
  EXPECT_NONFATAL_FAILURE(EXPECT_LE(test::deviation(got, kRef).relative(), 1e-2), "relative()");
}

TEST(Deviation, ShortOrEmptyResultFails) {
  const std::vector<float> short_got(kRef.begin(), kRef.begin() + 3), empty;
  test::Deviation d;
  EXPECT_NONFATAL_FAILURE(d = test::deviation(short_got, kRef), "sizes differ: 3 values against 4");
  EXPECT_EQ(d.max_abs, INFINITY);
  EXPECT_FALSE(d.problem.empty());
  d = {};
  EXPECT_NONFATAL_FAILURE(d = test::deviation(empty, kRef), "sizes differ: 0 values against 4");
  EXPECT_EQ(d.max_abs, INFINITY);
  EXPECT_NONFATAL_FAILURE(d = test::deviation(kRef, empty), "sizes differ: 4 values against 0");
  EXPECT_EQ(d.max_abs, INFINITY);
}

TEST(Deviation, NanOrInfInEitherInputFails) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    // The bad value first, then larger errors after it: it must not be dropped by a later max.
    std::vector<float> got = {bad, 100.0f, -100.0f, 50.0f};
    test::Deviation d;
    EXPECT_NONFATAL_FAILURE(d = test::deviation(got, kRef), "non-finite value");
    EXPECT_EQ(d.max_abs, INFINITY);
    EXPECT_NONFATAL_FAILURE(d = test::deviation(kRef, got), "non-finite reference value");
    EXPECT_EQ(d.max_abs, INFINITY);
  }
}

}  // namespace
}  // namespace lychee
