// lychee: long-context LLM inference with hybrid-head sparse decoding.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "app.h"
#include "build_info.h"
#include "cmd_heads.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/threads.h"

namespace {

// llama.cpp spells its GPU-layer option "-ngl", which CLI11 reads as -n (lychee's --max-tokens)
// with the value "gl": CLI11 short names are one letter. Rewritten to --n-gpu-layers (app_common.cpp)
// before parsing; any other argument is left as it is.
std::vector<std::string> rewrite_llama_cpp_spellings(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ngl") a = "--n-gpu-layers";
    else if (a.rfind("-ngl=", 0) == 0) a = "--n-gpu-layers=" + a.substr(5);
    args.push_back(a);
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  lychee::reexec_with_short_spin_wait(argv);  // before any OpenMP region (runtime/threads.h)
  CLI::App app{"lychee: long-context LLM inference with LycheeDecode hybrid-head sparse decoding", "lychee"};
  app.require_subcommand(1);
  // Every option's default shows in --help; subcommands inherit both settings, and fallthrough lets
  // the global options below come after the subcommand too (`lychee generate -v ...`).
  app.option_defaults()->always_capture_default();
  app.fallthrough();
  bool verbose = false, quiet = false;
  std::string level_name;
  int threads = 0;
  const char* kGlobal = "Global (before or after the subcommand)";
  // CLI11 prints the text and a newline, then exits 0; version_text() ends with its own newline.
  app.set_version_flag(
         "--version",
         [] {
           std::string text = lychee::app::version_text();
           if (!text.empty() && text.back() == '\n') text.pop_back();
           return text;
         },
         "Print the version, commit and GPU libraries")
      ->group(kGlobal);
  app.add_flag("-v,--verbose", verbose, "Log progress and details (--log-level info)")->group(kGlobal);
  app.add_flag("-q,--quiet", quiet, "Log only errors (--log-level error)")->group(kGlobal);
  app.add_option("--log-level", level_name, "debug, info, warn, error or off")
      ->default_str("warn")->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}))->group(kGlobal);
  app.add_option("--threads", threads, "CPU compute threads for OpenMP and BLAS")
      ->default_str("the cores this process may use")->check(lychee::app::positive_int())->group(kGlobal);
  app.parse_complete_callback([&] {
    // Before any subcommand runs (CLI11 runs this callback first).
    lychee::LogLevel level = verbose ? lychee::LogLevel::kInfo : quiet ? lychee::LogLevel::kError : lychee::LogLevel::kWarn;
    if (!level_name.empty()) level = *lychee::log_level_from_name(level_name);
    lychee::set_log_level(level);
    lychee::set_compute_threads(threads);
    lychee::app::warn_deprecated_options();
  });
  lychee::app::register_generate(app);
  lychee::app::register_chat(app);
  lychee::app::register_bench(app);
  lychee::app::register_inspect(app);
  lychee::app::register_eval(app);
  lychee::app::register_heads(app);
  lychee::app::register_train(app);
  lychee::app::register_serve(app);
  lychee::app::register_perplexity(app);
  lychee::app::register_version(app);
  // Set after the subcommands exist (they would inherit it). A subcommand's --help lists its own
  // options only: its footer names the global ones.
  app.footer("Global options may come before or after the subcommand. `lychee SUBCOMMAND --help` lists a\n"
             "subcommand's options; docs/cli-options.md describes them at length.");
  const std::string global_footer =
      "Global options (before or after the subcommand): -v, -q, --log-level LEVEL, --threads N.\n"
      "Every option at length: docs/cli-options.md.";
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    sub->footer(sub->get_footer().empty() ? global_footer : sub->get_footer() + "\n" + global_footer);
  try {
    std::vector<std::string> args = rewrite_llama_cpp_spellings(argc, argv);
    std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lychee::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "lychee: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "lychee: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
