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

nlohmann::json CuptiTrace::summary(int steps) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return summarize_trace(g_records, steps);
}

}  // namespace lychee::bench
