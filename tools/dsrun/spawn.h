// The pieces of starting a rank that do not need the supervisor: finding the program, checking the
// rendezvous port, building a rank's environment and argv, and fork/exec.
#pragma once
#include <sys/types.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace deepspeed {
namespace launcher {

// Thrown for problems found before any rank starts (dsrun then exits 2).
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The executable PROGRAM names: itself if it contains '/', else the first match on PATH.
// Throws LaunchError naming PROGRAM if it does not exist, is a directory or is not executable.
std::string resolve_program(const std::string& program);

// Throws LaunchError if addr:port cannot be bound here (in use, or addr is not local), so a clash
// is reported before the ranks start instead of as a rendezvous timeout inside them.
void check_port_free(const std::string& addr, int port);

// CPUs this process may run on (its affinity mask), at least 1.
int available_cpus();

// The GPUs the ranks would see, counted without loading CUDA (what torch.cuda.device_count()
// says): the non-empty entries of CUDA_VISIBLE_DEVICES when it is set (set but empty: none), else
// the /dev/nvidiaN device files. 0 on a machine without GPUs.
int visible_gpu_count();

// This machine's slots when there is no hostfile (DeepSpeed's pool {localhost: device count}):
// visible_gpu_count(), else its CPUs (available_cpus()), since ranks of a CPU build run on CPU
// cores. At least 1.
int local_slot_count();

// `base` (KEY=VALUE strings) with each of `overrides` replacing or adding its key.
std::vector<std::string> merge_environment(const char* const* base,
                                           const std::map<std::string, std::string>& overrides);

// What one rank runs.
struct RankCommand {
  std::string path;               // resolved executable
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // KEY=VALUE
};

// fork/exec of one rank: stdout/stderr onto out_fd/err_fd, stdin from in_fd (-1: /dev/null), in a
// new process group whose id is the returned pid, dying with dsrun (Linux parent-death signal).
// Throws LaunchError if fork fails. An exec failure shows as exit status 127 plus a message on
// the rank's stderr. (The multi-node launcher starts its ssh/pdsh/mpirun children the same way,
// in_fd being the pipe that tells a node agent the launcher is still there.)
pid_t spawn_rank(const RankCommand& cmd, int out_fd, int err_fd, int in_fd = -1);

// A child started by spawn_piped: its pid and the parent's ends of its pipes, which the caller
// owns (in_fd is -1 unless stdin was piped).
struct PipedChild {
  pid_t pid = -1;
  int out_fd = -1;  // read: the child's stdout
  int err_fd = -1;  // read: the child's stderr
  int in_fd = -1;   // write: the child's stdin
};

// spawn_rank with the child's stdout and stderr, and its stdin when `pipe_stdin`, on new pipes
// (close-on-exec in dsrun). The child's ends are closed here once it has them; when a pipe or the
// fork fails, every pipe made so far is closed and LaunchError thrown. The one way dsrun starts
// a child it reads: ranks (launcher.cpp), host checks (capture.cpp), node launchers
// (multinode.cpp).
PipedChild spawn_piped(const RankCommand& cmd, bool pipe_stdin = false);

}  // namespace launcher
}  // namespace deepspeed
