// dsrun's job supervisor: starts N ranks of one program on this node, relays their output, and
// shuts the whole job down when any rank fails or dsrun is interrupted.
//
// Exit status of run_job() (dsrun's own exit status):
//   0        every rank exited 0
//   S        the first failing rank exited with status S (non-zero)
//   128+N    the first failing rank was killed by signal N, or dsrun received signal N
//   2        nothing was started: bad option, port in use, program missing (message on stderr)
//   1        the launcher itself failed (fork, pipe)
#pragma once
#include <string>
#include <vector>

namespace deepspeed {
namespace launcher {

struct LaunchOptions {
  int num_procs = 1;                      // ranks to start (--num_procs / --num_gpus)
  std::string master_addr = "127.0.0.1";  // rank 0's rendezvous address (--master_addr)
  int master_port = 29500;                // rank 0's rendezvous port (--master_port)
  bool append_local_rank = true;          // add --local_rank=K to the argv (off: --no_local_rank)
  std::string log_dir;                    // per-rank log files here when non-empty
  double kill_grace_s = 5.0;         // SIGTERM → SIGKILL delay (--kill_grace, DSRUN_KILL_GRACE_S)
  std::vector<std::string> command;  // PROGRAM ARGS...; REQUIRES: non-empty
};

// Runs the job to completion and returns dsrun's exit status (see above). Installs SIGINT/SIGTERM/
// SIGCHLD handlers for its duration. Call from a single-threaded process, once at a time.
int run_job(const LaunchOptions& options);

}  // namespace launcher
}  // namespace deepspeed
