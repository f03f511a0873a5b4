// The per-step summary of a trace's records (trace_summary.h): a pure function of the records,
// tested without a GPU (tests/test_trace_summary.cpp).
#include "trace_summary.h"

#include <algorithm>
#include <map>

namespace lychee::bench {

namespace {

struct Acc {
  double us = 0;
  int n = 0;
  double exposed = 0;  // device ops: the part of their time no earlier-starting op covers
};

nlohmann::json table(const std::map<std::string, Acc>& m, double per, bool exposed = false) {
  std::vector<std::pair<std::string, Acc>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, a] : v) {
    nlohmann::json row = {{"name", name}, {"us_per_step", a.us * per}, {"calls_per_step", a.n * per}};
    if (exposed) row["exposed_us_per_step"] = a.exposed * per;
    out.push_back(std::move(row));
  }
  return out;
}

// The device figures of `records` (kernels, copies, memsets): busy time (their union), the idle
// gaps between the first and the last, and the time per kernel name; per step. A name's exposed
// time is what its ops add to the union, taken in start order: under programmatic dependent
// launch a kernel starts while its predecessor runs and waits inside, so its own duration counts
// that wait twice, while exposed time is its share of the step's critical path on one stream
// (end minus the previous op's end); an op on a parallel branch is exposed only where it
// outlasts the others.
nlohmann::json device_summary(const std::vector<const TraceRecord*>& records, double per) {
  std::map<std::string, Acc> kernels;
  std::vector<const TraceRecord*> spans(records.begin(), records.end());
  for (const TraceRecord* r : records) {
    Acc& a = kernels[r->name];
    a.us += double(r->end_ns - r->start_ns) / 1e3;
    ++a.n;
  }
  std::sort(spans.begin(), spans.end(), [](const TraceRecord* a, const TraceRecord* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns < b->end_ns;
  });
  double busy = 0, idle = 0, idle_over_5us = 0;
  int gaps_over_5us = 0;
  uint64_t cur_end = 0;
  const uint64_t first = spans.empty() ? 0 : spans.front()->start_ns;
  for (const TraceRecord* r : spans) {
    const uint64_t s = r->start_ns, e = r->end_ns;
    if (cur_end != 0 && s > cur_end) {
      const double gap = double(s - cur_end) / 1e3;
      idle += gap;
      if (gap > 5.0) {
        idle_over_5us += gap;
        ++gaps_over_5us;
      }
    }
    double added = 0;
    if (cur_end == 0 || s > cur_end) {
      added = double(e - s) / 1e3;
      cur_end = e;
    } else if (e > cur_end) {
      added = double(e - cur_end) / 1e3;
      cur_end = e;
    }
    busy += added;
    kernels[r->name].exposed += added;
  }
  return {{"span_us_per_step", spans.empty() ? 0.0 : double(cur_end - first) / 1e3 * per},
          {"device_busy_us_per_step", busy * per},
          {"device_idle_us_per_step", idle * per},
          {"idle_gaps_over_5us_per_step", gaps_over_5us * per},
          {"idle_in_gaps_over_5us_per_step", idle_over_5us * per},
          {"device_activities_per_step", double(records.size()) * per},
          {"device", table(kernels, per, true)}};
}

}  // namespace

nlohmann::json summarize_trace(const std::vector<TraceRecord>& records, int steps) {
  const double per = 1.0 / std::max(steps, 1);
  std::map<std::string, Acc> syncs, calls;
  std::vector<const TraceRecord*> all;
  std::map<int, std::vector<const TraceRecord*>> by_device;
  for (const TraceRecord& r : records) {
    if (r.kind == TraceRecord::kSync || r.kind == TraceRecord::kRuntime) {
      Acc& a = (r.kind == TraceRecord::kSync ? syncs : calls)[r.name];
      a.us += double(r.end_ns - r.start_ns) / 1e3;
      ++a.n;
      continue;
    }
    all.push_back(&r);
    by_device[r.device].push_back(&r);
  }
  nlohmann::json out = device_summary(all, per);
  out["steps"] = steps;
  out["host_syncs"] = table(syncs, per);
  out["host_calls"] = table(calls, per);
  if (by_device.size() > 1) {
    out["per_device"] = nlohmann::json::array();
    for (const auto& [dev, recs] : by_device) {
      nlohmann::json d = device_summary(recs, per);
      d["cuda_device"] = dev;
      out["per_device"].push_back(d);
    }
  }
  return out;
}

}  // namespace lychee::bench
