// The benchmarks' trace summary (bench/trace_summary.h): busy, idle and span of a device timeline,
// and each kernel's own and exposed time when kernels overlap as they do under programmatic
// dependent launch (a kernel starts while its predecessor drains and waits inside).
#include <gtest/gtest.h>

#include <string>

#include "trace_summary.h"

namespace lychee::bench {
namespace {

constexpr uint64_t kUs = 1000;  // records are in ns

TraceRecord kernel(const std::string& name, double start_us, double end_us, int device = 0) {
  return {TraceRecord::kKernel, name, uint64_t(start_us * kUs), uint64_t(end_us * kUs), 0, device};
}

const nlohmann::json& row(const nlohmann::json& table, const std::string& name) {
  for (const nlohmann::json& r : table)
    if (r["name"] == name) return r;
  ADD_FAILURE() << "no row " << name;
  static const nlohmann::json none = {{"us_per_step", -1.0}, {"exposed_us_per_step", -1.0}, {"calls_per_step", -1.0}};
  return none;
}

// Two steps of: A [0, 10); B starts inside A and waits for it [8, 14); a side-branch kernel S
// inside A [9, 12); 2 µs idle; C [16, 20); the token's copy [20, 21). Exposed: A 10, B 4 (its part
// past A), S 0 (covered), C 4, copy 1: they add up to the busy time, 19 of the 21 µs span.
TEST(TraceSummary, ExposedTimeIsEachKernelsShareOfTheSpan) {
  std::vector<TraceRecord> recs;
  for (int step = 0; step < 2; ++step) {
    const double t0 = 100.0 * step;
    recs.push_back(kernel("A", t0 + 0, t0 + 10));
    recs.push_back(kernel("B", t0 + 8, t0 + 14));
    recs.push_back(kernel("S", t0 + 9, t0 + 12));
    recs.push_back(kernel("C", t0 + 16, t0 + 20));
    recs.push_back({TraceRecord::kMemcpy, "memcpy DtoH", uint64_t((t0 + 20) * kUs), uint64_t((t0 + 21) * kUs), 4, 0});
    recs.push_back({TraceRecord::kSync, "cudaEventSynchronize", uint64_t((t0 + 30) * kUs), uint64_t((t0 + 50) * kUs), 0, -1});
  }
  const nlohmann::json s = summarize_trace(recs, 2);
  EXPECT_EQ(s["steps"], 2);
  EXPECT_DOUBLE_EQ(s["device_busy_us_per_step"].get<double>(), 19.0);
  // Idle: 2 µs inside each step, and the 79 µs between the steps' timelines.
  EXPECT_DOUBLE_EQ(s["device_idle_us_per_step"].get<double>(), (2.0 * 2 + 79.0) / 2);
  EXPECT_DOUBLE_EQ(s["idle_gaps_over_5us_per_step"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["span_us_per_step"].get<double>(), 121.0 / 2);
  EXPECT_DOUBLE_EQ(s["device_activities_per_step"].get<double>(), 5.0);
  const nlohmann::json& dev = s["device"];
  const double own[] = {10, 6, 3, 4, 1}, exposed[] = {10, 4, 0, 4, 1};
  const char* names[] = {"A", "B", "S", "C", "memcpy DtoH"};
  double exposed_sum = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(row(dev, names[i])["us_per_step"].get<double>(), own[i]) << names[i];
    EXPECT_DOUBLE_EQ(row(dev, names[i])["exposed_us_per_step"].get<double>(), exposed[i]) << names[i];
    EXPECT_DOUBLE_EQ(row(dev, names[i])["calls_per_step"].get<double>(), 1.0) << names[i];
    exposed_sum += row(dev, names[i])["exposed_us_per_step"].get<double>();
  }
  EXPECT_DOUBLE_EQ(exposed_sum, s["device_busy_us_per_step"].get<double>());
  EXPECT_EQ(dev[0]["name"], "A");  // rows by own time, largest first
  ASSERT_EQ(s["host_syncs"].size(), 1u);
  EXPECT_DOUBLE_EQ(s["host_syncs"][0]["us_per_step"].get<double>(), 20.0);
  EXPECT_FALSE(s.contains("per_device"));
}

// A kernel that starts before and ends after everything else takes the whole span; records of a
// second device give a summary per device as well.
TEST(TraceSummary, EnclosingKernelsAndSeveralDevices) {
  const std::vector<TraceRecord> recs = {kernel("long", 0, 50), kernel("inner", 10, 20), kernel("other", 5, 15, 1)};
  const nlohmann::json s = summarize_trace(recs, 1);
  EXPECT_DOUBLE_EQ(s["device_busy_us_per_step"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(row(s["device"], "long")["exposed_us_per_step"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(row(s["device"], "inner")["exposed_us_per_step"].get<double>(), 0.0);
  ASSERT_TRUE(s.contains("per_device"));
  ASSERT_EQ(s["per_device"].size(), 2u);
  for (const nlohmann::json& d : s["per_device"]) {
    const double busy = d["cuda_device"] == 0 ? 50.0 : 10.0;
    EXPECT_DOUBLE_EQ(d["device_busy_us_per_step"].get<double>(), busy) << d["cuda_device"];
  }
  EXPECT_TRUE(summarize_trace({}, 3)["device"].empty());
  EXPECT_DOUBLE_EQ(summarize_trace({}, 3)["span_us_per_step"].get<double>(), 0.0);
}

}  // namespace
}  // namespace lychee::bench
