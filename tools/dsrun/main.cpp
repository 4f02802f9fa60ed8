// dsrun: DeepSpeed's `deepspeed` launcher for one node.
//   dsrun [--num_procs N | --num_gpus N] [--master_addr A] [--master_port P] [--no_local_rank]
//         [--enable_each_rank_log DIR] [--kill_grace S] PROGRAM ARGS...
// Options end at PROGRAM; everything after it is the program's. See docs/launcher.md.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher.h"

namespace {

using deepspeed::launcher::LaunchOptions;

constexpr int kUsageError = 2;
constexpr int kMaxProcs = 4096;  // a typo guard, far above any one node

// DSRUN_KILL_GRACE_S, if set and valid, replaces the built-in default (--kill_grace still wins).
bool grace_from_env(double* grace) {
  const char* env = std::getenv("DSRUN_KILL_GRACE_S");
  if (env == nullptr || *env == '\0') return true;
  char* end = nullptr;
  double v = std::strtod(env, &end);
  if (*end != '\0' || v < 0) {
    std::fprintf(stderr, "dsrun: DSRUN_KILL_GRACE_S='%s' is not a number of seconds >= 0\n", env);
    return false;
  }
  *grace = v;
  return true;
}

void add_options(CLI::App& app, LaunchOptions& o, int& num_gpus) {
  app.prefix_command();  // the first positional argument and all after it are PROGRAM ARGS...
  auto* procs =
      app.add_option("--num_procs", o.num_procs, "ranks to start on this node (default 1)")
          ->check(CLI::Range(1, kMaxProcs));
  app.add_option("--num_gpus,--num_accelerators", num_gpus,
                 "alias of --num_procs (this build runs ranks on the CPU)")
      ->check(CLI::Range(1, kMaxProcs))
      ->excludes(procs);
  app.add_option("--master_addr", o.master_addr, "rank 0's rendezvous address (default 127.0.0.1)");
  app.add_option("--master_port", o.master_port, "rank 0's rendezvous port (default 29500)")
      ->check(CLI::Range(1, 65535));
  app.add_flag("--no_local_rank", "do not pass --local_rank=K to the program");
  app.add_option("--enable_each_rank_log", o.log_dir,
                 "also write each rank's output to DIR/<timestamp>_rank<K>.log");
  app.add_option("--kill_grace", o.kill_grace_s,
                 "seconds between SIGTERM and SIGKILL when stopping ranks (default 5, env "
                 "DSRUN_KILL_GRACE_S)")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions options;
  if (!grace_from_env(&options.kill_grace_s)) return kUsageError;
  int num_gpus = 0;
  CLI::App app{"dsrun: start N ranks of PROGRAM on this node (DeepSpeed's `deepspeed` launcher)",
               "dsrun"};
  add_options(app, options, num_gpus);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "dsrun: %s\nRun 'dsrun --help' for usage.\n", e.what());
    return kUsageError;
  }
  if (num_gpus > 0) options.num_procs = num_gpus;
  options.append_local_rank = app.count("--no_local_rank") == 0;
  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--")
    options.command.erase(options.command.begin());
  if (options.command.empty()) {
    std::fprintf(stderr, "dsrun: no PROGRAM given\nRun 'dsrun --help' for usage.\n");
    return kUsageError;
  }
  if (options.command.front().rfind("-", 0) == 0) {
    std::fprintf(stderr, "dsrun: unknown option '%s' (PROGRAM must come after dsrun's options)\n",
                 options.command.front().c_str());
    return kUsageError;
  }
  return deepspeed::launcher::run_job(options);
}
