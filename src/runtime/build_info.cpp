#include "runtime/build_info.h"

#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#ifdef LYCHEE_HAS_CUDA
#include "runtime/cuda_backend.h"
#endif

#ifndef LYCHEE_CUDA_ARCHITECTURES
#define LYCHEE_CUDA_ARCHITECTURES ""
#endif

namespace lychee {

std::string cuda_architectures() {
#ifdef LYCHEE_HAS_CUDA
  return LYCHEE_CUDA_ARCHITECTURES;
#else
  return "";
#endif
}

namespace {

// Whether one CMAKE_CUDA_ARCHITECTURES entry runs on compute capability major.minor; nullopt-like
// -1 for an entry that cannot be judged (native, all, all-major, or not understood).
int entry_runs_on(const std::string& entry, int major, int minor) {
  size_t digits = 0;
  while (digits < entry.size() && std::isdigit(static_cast<unsigned char>(entry[digits]))) ++digits;
  if (digits < 2) return -1;
  const int number = std::stoi(entry.substr(0, digits));
  const int a_major = number / 10, a_minor = number % 10;
  const std::string suffix = entry.substr(digits);
  const int device = major * 10 + minor;
  const bool sass = a_major == major && minor >= a_minor;  // same major, newer or equal minor
  const bool ptx = device >= number;                        // JIT from PTX on a newer device
  if (suffix.empty()) return sass || ptx;
  if (suffix == "-real") return sass;
  if (suffix == "-virtual") return ptx;
  if (suffix == "a" || suffix == "a-real" || suffix == "a-virtual") return major == a_major && minor == a_minor;
  if (suffix == "f" || suffix == "f-real" || suffix == "f-virtual") return sass;
  return -1;
}

}  // namespace

std::string cuda_arch_mismatch(const std::string& archs, int major, int minor) {
  std::vector<std::string> entries;
  std::string cur;
  for (char ch : archs + ";") {
    if (ch == ';' || ch == ',' || std::isspace(static_cast<unsigned char>(ch))) {
      if (!cur.empty()) entries.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (entries.empty()) return "";
  for (const std::string& e : entries)
    if (entry_runs_on(e, major, minor) != 0) return "";  // runs there, or cannot be judged
  return fmt::format(
      "this GPU has compute capability {}.{} and lychee was built for CUDA architectures {} only, whose kernels "
      "cannot run on it; rebuild with cmake -DCMAKE_CUDA_ARCHITECTURES={}{} (the kernels are written for and "
      "tested on Hopper, 90a), or run on the CPU (--device cpu)",
      major, minor, fmt::join(entries, ", "), major, minor);
}

std::vector<std::pair<std::string, std::string>> gpu_library_versions() {
#ifdef LYCHEE_HAS_CUDA
  return cuda_backend_library_versions();
#else
  return {};
#endif
}

}  // namespace lychee
