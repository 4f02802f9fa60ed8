// How the launching dsrun starts a multi-node job through an existing engine (ssh, pdsh, OpenMPI's
// mpirun, Slurm's srun): the environment it forwards and the command lines it runs. Pure functions
// (no I/O besides reading .deepspeed_env files), unit-tested in tests/unit/dsrun_fanout_test.cpp.
//
// ssh and pdsh start one node agent per host (`dsrun --node_rank K --world_info W ... PROGRAM`),
// which starts that node's ranks as a single-node dsrun does. mpirun and srun start the ranks
// themselves (no agent), as DeepSpeed's OpenMPI and Slurm runners do; the ranks then read
// OMPI_COMM_WORLD_* / SLURM_* (src/comm/process_info.cpp).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "world.h"

namespace deepspeed {
namespace launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;  // in export order

// Variables of `environ` a remote node must see, DeepSpeed's list (NCCL*, PYTHON*, MV2*, UCX*,
// MLFLOW*) plus OMP_*, GLOO_*, MASTER_*, OPENBLAS_*, MKL_* and this project's DS_*, DEEPSPEED_*,
// DSRUN_*. Sorted by
// name, so command lines are reproducible.
EnvList forwarded_environment(const char* const* environ_list);

// `.deepspeed_env` text: one KEY=VALUE a line (the value may contain '='), blank lines and `#`
// comment lines skipped; spaces and tabs around KEY and VALUE dropped (DeepSpeed's key.strip(),
// var.strip()). The value is kept as written: the remote shell expands its `$VAR`s
// (agent_shell_command()). Throws LaunchError naming `path` and the line when it has no '=' or the
// key is not a shell variable name.
EnvList parse_deepspeed_env(const std::string& text, const std::string& path);

// The .deepspeed_env files to read, in order (a later file's keys win), as DeepSpeed's runner finds
// them (os.path.join(path, NAME) for path in ~ and .). `ds_env_file` is DS_ENV_FILE ("" when
// unset). An absolute path: that file alone. Otherwise NAME (DS_ENV_FILE, a bare name or a
// relative path, default ".deepspeed_env") in `home` (when not empty), then in `cwd`, those that
// exist (`is_file`); a relative NAME is not taken as relative to the process's working directory
// on its own. Throws LaunchError naming DS_ENV_FILE when it is an absolute path that is not a
// file: a typo there would otherwise silently drop the environment it was meant to carry.
std::vector<std::string> deepspeed_env_paths(const std::string& ds_env_file,
                                             const std::string& home, const std::string& cwd,
                                             const std::function<bool(const std::string&)>& is_file);

// `base` with `extra` appended, a key of `extra` replacing the same key of `base` (in place).
EnvList merge_env(EnvList base, const EnvList& extra);

// A word for /bin/sh: unchanged when it is made only of safe characters, else single-quoted.
std::string shell_quote(const std::string& word);
// `value` in double quotes for /bin/sh, `"`, `\` and backtick escaped: `$VAR` (and `$(...)`)
// stay live, as in DeepSpeed's `export K="V"` for .deepspeed_env lines.
std::string shell_double_quote(const std::string& value);

// --launcher_args split into words as a shell would (single/double quotes, backslash); no
// expansion. Throws LaunchError naming the text for an unterminated quote.
std::vector<std::string> split_words(const std::string& text);

// What every node agent runs, besides its node rank.
struct AgentJob {
  std::string dsrun_path;     // absolute path of dsrun (the same path on every host)
  std::string cwd;            // the launcher's working directory, entered first on every host
  EnvList exports;            // forwarded environment: single-quoted, exact values
  EnvList env_file;           // .deepspeed_env lines: exported after `exports` (a key here wins),
                              // double-quoted so the remote shell expands their $VARs
  std::string world_info;     // encode_world() of the selected hosts
  std::string master_addr;
  int master_port = 29500;
  std::vector<std::string> agent_flags;  // extra dsrun flags (--no_local_rank, --kill_grace S, ...)
  std::vector<std::string> command;      // PROGRAM ARGS...
};

// What a remote shell runs before dsrun on every host: `cd CWD && export K='V' ... && export
// K="V" ...`, every word quoted (`exports` with shell_quote(), `env_file` with
// shell_double_quote(); a key of `env_file` is not exported from `exports` as well); without the
// `cd` when `cwd` is empty ("" when there is nothing to do either). Shared by the
// job (agent_shell_command()) and the host check, so the check finds PROGRAM with the PATH the
// job will have, in the directory it will run in.
std::string remote_prelude(const std::string& cwd, const EnvList& exports, const EnvList& env_file);

// The remote shell command of one agent: `remote_prelude() && exec DSRUN --node_rank N
// --world_info W --master_addr A --master_port P --watch_stdin FLAGS... PROGRAM ARGS...`, every
// word quoted. `node_rank` is a number, or pdsh's "%n" (substituted by pdsh per host).
std::string agent_shell_command(const AgentJob& job, const std::string& node_rank);

// Options every ssh the launcher runs gets: no password prompt (BatchMode), a connection timeout,
// and keep-alives so a dead link ends the ssh within about 15 s instead of never.
std::vector<std::string> ssh_options(int ssh_port);

// `ssh OPTIONS LAUNCHER_ARGS HOST REMOTE_COMMAND`.
std::vector<std::string> ssh_argv(const std::string& host, int ssh_port,
                                  const std::vector<std::string>& launcher_args,
                                  const std::string& remote_command);

// `pdsh -S -f 1024 -R ssh -w HOST,HOST LAUNCHER_ARGS REMOTE_COMMAND` (DeepSpeed's pdsh runner;
// -S returns the largest remote exit status). pdsh's own ssh takes the ssh options from the
// environment variable PDSH_SSH_ARGS_APPEND, which pdsh_ssh_args() gives.
std::vector<std::string> pdsh_argv(const Resources& world,
                                   const std::vector<std::string>& launcher_args,
                                   const std::string& remote_command);
std::string pdsh_ssh_args(int ssh_port);

// `mpirun -n TOTAL -hostfile HOSTFILE --mca btl ^openib LAUNCHER_ARGS -x K=V ... -x MASTER_ADDR=A
// -x MASTER_PORT=P PROGRAM ARGS...` (DeepSpeed's OpenMPI runner; no --local_rank: OpenMPI ranks
// read OMPI_COMM_WORLD_LOCAL_RANK). `hostfile` is an OpenMPI hostfile of exactly `world`
// (mpi_hostfile_text()).
std::vector<std::string> mpirun_argv(const Resources& world, const std::string& hostfile,
                                     const std::vector<std::string>& launcher_args,
                                     const EnvList& exports, const std::string& master_addr,
                                     int master_port, const std::vector<std::string>& command);
std::string mpi_hostfile_text(const Resources& world);

// `launcher_args` for mpirun with --ssh_port: `--mca plm_rsh_args "RSH -p P"` in front, RSH being
// `user_rsh_args` (OMPI_MCA_plm_rsh_args, "" when unset), which that --mca would otherwise replace.
// Unchanged when ssh_port is 0. Throws LaunchError naming both when `launcher_args` sets
// plm_rsh_args itself (one would silently override the other).
std::vector<std::string> mpirun_ssh_port_args(int ssh_port, const std::string& user_rsh_args,
                                              const std::vector<std::string>& launcher_args);

// mpirun and srun start a host's ranks on its devices 0..k-1 (they set no CUDA_VISIBLE_DEVICES,
// and the ranks pick the device from their local rank), so they can run a selection only when
// every host keeps its first slots. Throws LaunchError naming --include/--exclude, `launcher`
// ("openmpi", "slurm") and the first host with other slots. (DeepSpeed's OpenMPI runner refuses
// any --include/--exclude, its Slurm runner any slot list.)
void require_first_slots(const Resources& world, const std::string& launcher);

// `srun -n TOTAL --nodes=N --ntasks-per-node=K --distribution=arbitrary LAUNCHER_ARGS
// --export=ALL,K=V,...,MASTER_ADDR=A,MASTER_PORT=P PROGRAM ARGS...`, run with SLURM_HOSTFILE
// naming a file of slurm_hostfile_text(world). DeepSpeed's Slurm runner passes --nodelist=H,H
// instead, but Slurm sorts a node list and places tasks in its own order, so rank 0 could land on
// another host than MASTER_ADDR; the arbitrary distribution places task i on line i of
// SLURM_HOSTFILE (srun reads that file only when no --nodelist is given, hence none).
// REQUIRES: every host of `world` has the same number of slots (srun places K tasks per node);
// throws LaunchError naming the hosts otherwise, and for a value srun's --export cannot carry (a
// comma).
std::vector<std::string> srun_argv(const Resources& world,
                                   const std::vector<std::string>& launcher_args,
                                   const EnvList& exports, const std::string& master_addr,
                                   int master_port, const std::vector<std::string>& command);
// One line per task, in world order: each host's name once per slot ("h1\nh1\nh0\nh0\n").
std::string slurm_hostfile_text(const Resources& world);

}  // namespace launcher
}  // namespace deepspeed
