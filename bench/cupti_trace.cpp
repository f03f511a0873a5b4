#include "cupti_trace.h"

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

namespace lychee::bench {

namespace {

std::mutex g_mutex;
std::vector<TraceRecord> g_records;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  throw std::runtime_error(std::string("CUPTI ") + what + ": " + (msg ? msg : "unknown error"));
}

// "void ns::kernel<128, 64>(Args)" -> "ns::kernel<128, 64>"
std::string kernel_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  for (const std::string drop : {"(anonymous namespace)::", "void "})
    for (size_t at; (at = s.find(drop)) != std::string::npos;) s.erase(at, drop.size());
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) return s.substr(0, i);
  }
  return s;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy other";
  }
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<TraceRecord> got;
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    TraceRecord t{};
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        t = {TraceRecord::kKernel, kernel_name(k->name), k->start, k->end, 0, int(k->deviceId)};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        t = {TraceRecord::kMemcpy, copy_kind(m->copyKind), m->start, m->end, m->bytes, int(m->deviceId)};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        t = {TraceRecord::kMemset, "memset", m->start, m->end, m->bytes, int(m->deviceId)};
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        const char* name = nullptr;
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
        std::string n = name != nullptr ? name : "?";
        if (const size_t v = n.find("_v"); v != std::string::npos) n = n.substr(0, v);  // cudaMemcpy_v3020
        const bool sync = n.find("Synchronize") != std::string::npos || n == "cudaMemcpy" ||
                          n == "cudaMemset" || n == "cudaMalloc" || n == "cudaFree";
        t = {sync ? TraceRecord::kSync : TraceRecord::kRuntime, n, a->start, a->end, 0, -1};
        break;
      }
      default: continue;
    }
    got.push_back(std::move(t));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.insert(g_records.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
}

}  // namespace

void CuptiTrace::start() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
  }
  static bool registered = false;
  if (!registered) {
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
    registered = true;
  }
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copies");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memsets");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API");
}

void CuptiTrace::stop() {
  check(cuptiActivityFlushAll(1), "flush");
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
  check(cuptiActivityFlushAll(1), "flush");
}

const std::vector<TraceRecord>& CuptiTrace::records() const { return g_records; }

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

nlohmann::json CuptiTrace::summary(int steps) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  const double per = 1.0 / std::max(steps, 1);
  std::map<std::string, Acc> syncs, calls;
  std::vector<const TraceRecord*> all;
  std::map<int, std::vector<const TraceRecord*>> by_device;
  for (const TraceRecord& r : g_records) {
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
