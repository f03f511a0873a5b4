// lychee: long-context LLM inference with hybrid-head sparse decoding.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "app.h"
#include "cmd_heads.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/threads.h"

int main(int argc, char** argv) {
  lychee::reexec_with_short_spin_wait(argv);  // before any OpenMP region (runtime/threads.h)
  CLI::App app{"lychee: long-context LLM inference with LycheeDecode hybrid-head sparse decoding"};
  app.require_subcommand(1);
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "Log progress and details to stderr");
  app.add_flag("-q,--quiet", quiet, "Log only errors");
  app.parse_complete_callback([&] {
    lychee::set_log_level(verbose ? lychee::LogLevel::kInfo
                                  : quiet ? lychee::LogLevel::kError : lychee::LogLevel::kWarn);
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
  try {
    app.parse(argc, argv);
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
