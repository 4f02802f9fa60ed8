// Shell commands that run the built programs, for tests that drive them through std::system.
#pragma once
#include <string>

#include "support/files.h"
#include "support/ranks.h"

namespace dstest {

// "env OMP_NUM_THREADS=1 <bin>/dsrun --num_procs N --master_port P <bin>/<program_and_args>", on a
// port free a moment ago; `log` (when given) takes stdout and stderr. Starts with `env`, so
// "exec " + dsrun_command(...) replaces the shell with dsrun.
inline std::string dsrun_command(int procs, const std::string& program_and_args,
                                 const std::string& log = "") {
  std::string cmd = "env OMP_NUM_THREADS=1 " + bin_dir() + "/dsrun --num_procs " +
                    std::to_string(procs) + " --master_port " + std::to_string(free_tcp_port()) +
                    " " + bin_dir() + "/" + program_and_args;
  if (!log.empty()) cmd += " > " + log + " 2>&1";
  return cmd;
}

}  // namespace dstest
