// dsrun's job supervisor: starts N ranks of one program on this node, relays their output, and
// shuts the whole job down when any rank fails or dsrun is interrupted.
//
// Exit status of run_job() (dsrun's own exit status):
//   0        every rank exited 0
//   S        the first failing rank exited with status S (non-zero)
//   128+N    the first failing rank was killed by signal N, or dsrun received signal N (INT,
//            TERM, HUP, QUIT: forwarded to every rank's process group), also after a rank
//            failed (the signal then wins: JobOutcome::interrupted)
//   2        nothing was started: bad option, port in use, program missing (message on stderr);
//            a rank's own exit status 2 is reported as 2 too (JobOutcome::started tells them apart)
//   129      (agent mode, --watch_stdin) the launcher went away: stdin reached EOF
//   1        the launcher itself failed (fork, pipe)
#pragma once
#include <string>
#include <vector>

namespace deepspeed {
namespace launcher {

// Where this node's ranks sit in a multi-node job (a node agent: dsrun --node_rank K --world_info W).
// Single-node runs leave host empty: ranks are 0..num_procs-1 and output is prefixed "[rank K] ".
struct NodeInfo {
  std::string host;             // this node's name in the hostfile; prefixes output "[host rank K] "
  int node_rank = 0;            // NODE_RANK, GROUP_RANK, CROSS_RANK
  int num_nodes = 1;            // CROSS_SIZE
  int first_rank = 0;           // RANK of local rank 0
  int world_size = 0;           // WORLD_SIZE; 0 = num_procs (single node)
  std::vector<int> slots;       // CUDA_VISIBLE_DEVICES (DeepSpeed's GPU ids); empty = not set
};

struct LaunchOptions {
  int num_procs = 1;                      // ranks to start (--num_procs / --num_gpus)
  std::string master_addr = "127.0.0.1";  // rank 0's rendezvous address (--master_addr)
  int master_port = 29500;                // rank 0's rendezvous port (--master_port)
  bool append_local_rank = true;          // add --local_rank=K to the argv (off: --no_local_rank)
  std::string log_dir;                    // per-rank log files here when non-empty
  double kill_grace_s = 5.0;         // SIGTERM → SIGKILL delay (--kill_grace, DSRUN_KILL_GRACE_S)
  std::vector<std::string> command;  // PROGRAM ARGS...; REQUIRES: non-empty
  NodeInfo node;                     // multi-node placement (agent mode)
  bool check_port = true;            // bind-test master_addr:master_port first (node 0 only)
  bool watch_stdin = false;          // stop the ranks when stdin reaches EOF (the launcher is gone)
  int restart_count = 0;             // DSRUN_RESTART_COUNT for the ranks
};

// How one attempt of a job ended.
struct JobOutcome {
  int exit_status = 0;       // dsrun's exit status (see above)
  bool started = true;       // false: dsrun's own error before anything started (a bad option,
                             // a missing program: exit status 2), which a restart would repeat
  bool interrupted = false;  // dsrun itself got a stop signal (SIGINT/SIGTERM/SIGHUP/SIGQUIT),
                             // which --max_restarts does not restart
};

// Runs the job to completion. Installs the SignalScope handlers for its duration. Call from a
// single-threaded process, once at a time.
JobOutcome run_job(const LaunchOptions& options);

}  // namespace launcher
}  // namespace deepspeed
