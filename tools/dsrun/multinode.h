// The launching side of a multi-node job: checks every host first (ssh reachable, dsrun and the
// program there, the rendezvous port free on node 0), then starts the job through ssh (one agent
// per node, each watched on its own), pdsh (one pdsh for all agents), mpirun or srun (the ranks
// directly), and tears everything down when any part fails.
//
// Teardown: node agents run with --watch_stdin, their stdin being the ssh channel from this
// process. Closing it (or this process dying, or its ssh being killed) makes each agent stop its
// ranks (SIGTERM, SIGKILL after the kill grace) and exit. After kill grace + kTeardownSlack the
// remaining ssh processes are killed as well, so a node behind a cut link cannot hold dsrun.
#pragma once
#include <string>
#include <vector>

#include "fanout.h"
#include "launcher.h"  // JobOutcome
#include "world.h"

namespace deepspeed {
namespace launcher {

enum class Backend { kSsh, kPdsh, kOpenMpi, kSlurm };

// "ssh", "pdsh", "openmpi", "slurm" (case-insensitive; "mpirun" = openmpi). Throws LaunchError
// naming the value otherwise.
Backend parse_backend(const std::string& name);

struct MultiNodeOptions {
  Resources world;                          // selected hosts and slots, in node-rank order
  Backend backend = Backend::kSsh;
  std::vector<std::string> launcher_args;   // --launcher_args, split into words
  int ssh_port = 0;                         // --ssh_port; 0 = ssh's default
  bool ssh_check = true;                    // off: --no_ssh_check
  std::string master_addr;                  // empty: node 0's first address (from the check)
  int master_port = 29500;
  double kill_grace_s = 5.0;
  std::vector<std::string> agent_flags;     // passed to every agent (--no_local_rank, ...)
  std::vector<std::string> command;         // PROGRAM ARGS...
  int restart_count = 0;                    // DSRUN_RESTART_COUNT of this attempt
  EnvList exports;                          // set by prepare_hosts(): the forwarded variables
  EnvList env_file;                         // set by prepare_hosts(): the .deepspeed_env lines
};

// Refuses a slot selection mpirun/srun cannot run (require_first_slots()), reads the environment
// every node gets, gives mpirun's ssh --ssh_port (mpirun_ssh_port_args(), into launcher_args),
// checks the hosts (unless ssh_check is off or the backend starts no agents: with the job's own
// cd and exports, a working directory a host lacks being an error) and fills in master_addr when
// empty. Throws LaunchError naming the host and what is wrong.
void prepare_hosts(MultiNodeOptions& options);

// Runs one attempt of the job (as run_job: exit status 0, the failing node's status, 128+signal;
// 2 and started=false for a problem found before anything started; interrupted: dsrun itself got
// a stop signal).
JobOutcome run_multinode(const MultiNodeOptions& options);

// `dsrun --preflight [--master_addr A] [--master_port P] PROGRAM`, run on each host over ssh by
// prepare_hosts(): checks PROGRAM (and, on node 0, the port), prints "dsrun-preflight addr=IP"
// (this host's first non-loopback IPv4 address, DeepSpeed's `hostname -I`). Returns 0 or 2.
int run_preflight(const std::string& program, const std::string& master_addr, int master_port);

}  // namespace launcher
}  // namespace deepspeed
