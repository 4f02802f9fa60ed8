// dsrun: DeepSpeed's `deepspeed` launcher, for one node or many.
//   dsrun [--num_procs N | --num_gpus N] [--master_addr A] [--master_port P] [--no_local_rank]
//         [--enable_each_rank_log DIR] [--kill_grace S] [--max_restarts N]
//         [--hostfile F] [--include S | --exclude S] [--num_nodes N] [--force_multi]
//         [--launcher ssh|pdsh|openmpi|slurm] [--launcher_args "..."] [--ssh_port P]
//         [--no_ssh_check] PROGRAM ARGS...
// Internal modes (started by dsrun itself over ssh): --node_rank K --world_info W (a node agent),
// --preflight (a host check). Options end at PROGRAM; everything after it is the program's.
// See docs/launcher.md.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu_devices.h"
#include "job_signals.h"
#include "launcher.h"
#include "multinode.h"
#include "spawn.h"
#include "world.h"

namespace {

using namespace deepspeed::launcher;

constexpr int kUsageError = 2;
constexpr int kMaxProcs = 4096;  // a typo guard, far above any one node
constexpr const char* kDefaultHostfile = "/job/hostfile";  // DeepSpeed's default

// Everything the command line gives, before it is turned into one of the run modes.
struct Cli {
  LaunchOptions local;
  int num_gpus = 0;
  std::string hostfile, include, exclude, launcher = "ssh", launcher_args, world_info;
  int num_nodes = -1, ssh_port = 0, node_rank = -1, max_restarts = 0;
  bool no_ssh_check = false, force_multi = false, preflight = false;
  bool master_addr_given = false;
};

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

void add_options(CLI::App& app, Cli& c) {
  LaunchOptions& o = c.local;
  app.prefix_command();  // the first positional argument and all after it are PROGRAM ARGS...
  auto* procs = app.add_option("--num_procs", o.num_procs,
                               "ranks per node (default: one per visible GPU; without GPUs "
                               "LOCAL_SIZE, else one per NUMA node; with a hostfile: all of "
                               "its slots)")
                    ->check(CLI::Range(1, kMaxProcs));
  app.add_option("--num_gpus,--num_accelerators", c.num_gpus,
                 "alias of --num_procs")
      ->check(CLI::Range(1, kMaxProcs))
      ->excludes(procs);
  app.add_option("--master_addr", o.master_addr,
                 "rank 0's rendezvous address (default 127.0.0.1; multi-node: node 0's address)");
  app.add_option("--master_port", o.master_port, "rank 0's rendezvous port (default 29500)")
      ->check(CLI::Range(1, 65535));
  app.add_flag("--no_local_rank", "do not pass --local_rank=K to the program");
  app.add_option("--enable_each_rank_log", o.log_dir,
                 "also write each rank's output to DIR/<timestamp>_rank<K>.log");
  app.add_option("--kill_grace", o.kill_grace_s,
                 "seconds between SIGTERM and SIGKILL when stopping ranks (default 5, env "
                 "DSRUN_KILL_GRACE_S)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_restarts", c.max_restarts,
                 "after a failure, restart the whole job up to N times (DSRUN_RESTART_COUNT)")
      ->check(CLI::Range(0, 1000));
  // Multi-node (DeepSpeed's runner.py flags).
  app.add_option("-H,--hostfile", c.hostfile,
                 std::string("lines 'HOST slots=N' (default ") + kDefaultHostfile + " if present)");
  auto* inc = app.add_option("-i,--include", c.include, "hosts/slots to use: host1:0,1@host2");
  app.add_option("-e,--exclude", c.exclude, "hosts/slots to leave out: host1:0@host2")->excludes(inc);
  app.add_option("--num_nodes", c.num_nodes, "use the first N hosts of the hostfile")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--launcher", c.launcher, "ssh (default), pdsh, openmpi or slurm");
  app.add_option("--launcher_args", c.launcher_args, "extra arguments for ssh/pdsh/mpirun/srun");
  app.add_option("--ssh_port", c.ssh_port, "ssh port of every host")->check(CLI::Range(1, 65535));
  app.add_flag("--no_ssh_check", c.no_ssh_check, "skip the ssh check of every host");
  app.add_flag("--force_multi", c.force_multi, "use the multi-node launcher even for one host");
  // Set by the launching dsrun on each node (agent mode) or for its host check.
  app.add_option("--node_rank", c.node_rank, "(agent) this node's index in --world_info")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world_info", c.world_info, "(agent) hosts and slots: host:0,1@host2:0,1");
  app.add_flag("--watch_stdin", o.watch_stdin, "(agent) stop the ranks when stdin closes");
  app.add_option("--restart_count", o.restart_count, "(agent) DSRUN_RESTART_COUNT for the ranks");
  app.add_flag("--preflight", c.preflight, "(internal) check PROGRAM and the port on this host");
}

// DeepSpeed launcher flags a user may carry over, with what to do instead; null for others.
const char* unsupported_deepspeed_flag(const std::string& arg) {
  const std::string flag = arg.substr(0, arg.find('='));
  if (flag == "--autotuning") return "run the job with each config yourself";
  if (flag == "--elastic_training" || flag == "--min_elastic_nodes" ||
      flag == "--max_elastic_nodes")
    return "elastic training is not offered; --max_restarts restarts the whole job";
  if (flag == "--save_pid") return "dsrun's own pid is the job's ($! in the shell)";
  if (flag == "--no_ssh")
    return "run 'dsrun --node_rank K --world_info W --master_addr A PROGRAM' on each node "
           "(docs/launcher.md)";
  if (flag == "--module" || flag == "-m" || flag == "--no_python")
    return "PROGRAM is an executable, not a Python script";
  if (flag == "--bind_cores_to_rank" || flag == "--bind_core_list")
    return "no numactl binding; OMP_NUM_THREADS is set per rank";
  return nullptr;
}

// Restarts `attempt` (count -> JobOutcome) up to max_restarts times while the job fails, unless
// nothing started (dsrun's own error: it would only repeat) or dsrun itself was interrupted.
// A rank's exit status is not a sign of either: a rank may exit 2 like dsrun's usage error.
template <typename Attempt>
int with_restarts(int max_restarts, Attempt attempt) {
  for (int count = 0;; ++count) {
    JobOutcome job = attempt(count);
    if (job.exit_status == 0 || !job.started || job.interrupted || count >= max_restarts)
      return job.exit_status;
    say("the job failed (exit status " + std::to_string(job.exit_status) +
        "); restarting it (restart " + std::to_string(count + 1) + " of " +
        std::to_string(max_restarts) + ")");
  }
}

// Runs the job on this machine: num_procs ranks, or one per slot (CUDA_VISIBLE_DEVICES = the
// slot ids, as DeepSpeed's launch.py sets them) when slots are given.
int run_here(const Cli& c, const std::vector<int>& slots) {
  return with_restarts(c.max_restarts, [&](int count) {
    LaunchOptions o = c.local;
    if (!slots.empty()) o.num_procs = static_cast<int>(slots.size());
    o.node.slots = slots;
    o.restart_count = count;
    return run_job(o);
  });
}

// No hostfile: DeepSpeed's runner uses the pool {localhost: device count}; --num_nodes 1 and
// --include/--exclude apply to it. The pool has at least --num_procs slots (a CPU build may start
// more ranks than cores).
// --include/--exclude name device indices, which the ranks get as CUDA_VISIBLE_DEVICES; with
// the variable already set to anything but 0,1,..,n-1, index k is not entry k (DeepSpeed's
// runner has this trap, its issue #662): refused rather than run on the devices the user hid.
void refuse_renumbered_devices() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible || !*visible) return;
  std::string identity;
  for (int k = 0, n = local_slot_count(); k < n; ++k)
    identity += (k ? "," : "") + std::to_string(k);
  if (identity == visible) return;
  throw LaunchError(std::string("--include/--exclude select devices by index, but "
                                "CUDA_VISIBLE_DEVICES=") + visible +
                    " already chooses and renumbers them; unset it (the selection then sets it "
                    "for the ranks) or drop the selection");
}

int run_without_hostfile(const Cli& c, bool procs_given) {
  if (c.num_nodes > 1)
    throw LaunchError("--num_nodes " + std::to_string(c.num_nodes) +
                      " needs a --hostfile listing the hosts (there is no " + kDefaultHostfile +
                      "); without one dsrun runs on this machine only");
  if (c.force_multi)
    throw LaunchError(std::string("--force_multi needs a --hostfile (there is no ") +
                      kDefaultHostfile + ")");
  if (c.include.empty() && c.exclude.empty()) {
    // DeepSpeed's whole pool: one rank per visible GPU; without GPUs, one per CPU device of
    // DeepSpeed's CPU accelerator (LOCAL_SIZE, else one per NUMA node: cpu_devices.h).
    // CUDA_VISIBLE_DEVICES stays as it is (slots left empty): DeepSpeed's launch.py sets it to
    // the pool's ids, which are the user's entries when set and all devices when not.
    Cli here = c;
    if (!procs_given) {
      const int gpus = visible_gpu_count();
      here.local.num_procs =
          std::min(kMaxProcs, gpus > 0 ? gpus : cpu_device_count(std::getenv("LOCAL_SIZE")));
    }
    return run_here(here, {});
  }
  refuse_renumbered_devices();
  int slots = local_slot_count();
  if (procs_given) slots = std::max(slots, c.local.num_procs);
  Resources world = select_resources(local_pool(slots), c.include, c.exclude, c.num_nodes,
                                     procs_given ? c.local.num_procs : -1,
                                     "the pool without a hostfile");
  return run_here(c, world[0].slots);
}

int run_agent(Cli& c) {
  Resources world = decode_world(c.world_info);
  // Rank 0's store runs on node 0: the default 127.0.0.1 would send every other node's ranks to
  // their own loopback until the rendezvous timed out. (The launching dsrun always passes it.)
  if (world.size() > 1 && !c.master_addr_given)
    throw LaunchError("--world_info " + c.world_info + " has " + std::to_string(world.size()) +
                      " nodes: pass --master_addr (node 0's address, where rank 0's rendezvous "
                      "store listens; the default 127.0.0.1 is each node's own)");
  NodePlacement p = place_node(world, c.node_rank);
  LaunchOptions o = c.local;
  o.num_procs = p.local_size;
  o.node = {p.host, p.node_rank, p.num_nodes, p.first_rank, p.world_size, p.slots};
  o.check_port = p.node_rank == 0;  // the rendezvous store runs on node 0
  return run_job(o).exit_status;
}

std::vector<std::string> agent_flags(const Cli& c, const CLI::App& app) {
  std::vector<std::string> f;
  if (!c.local.append_local_rank) f.push_back("--no_local_rank");
  if (!c.local.log_dir.empty()) f.insert(f.end(), {"--enable_each_rank_log", c.local.log_dir});
  if (app.count("--kill_grace") || std::getenv("DSRUN_KILL_GRACE_S")) {
    char grace[32];
    std::snprintf(grace, sizeof grace, "%g", c.local.kill_grace_s);
    f.insert(f.end(), {"--kill_grace", grace});
  }
  return f;
}

int run_launcher(Cli& c, const CLI::App& app) {
  std::string hostfile = c.hostfile;
  struct stat st;
  if (hostfile.empty() && ::stat(kDefaultHostfile, &st) == 0) hostfile = kDefaultHostfile;
  const bool procs_given = app.count("--num_procs") || app.count("--num_gpus");
  if (hostfile.empty()) return run_without_hostfile(c, procs_given);
  Resources world = select_resources(read_hostfile(hostfile), c.include, c.exclude, c.num_nodes,
                                     procs_given ? c.local.num_procs : -1);
  Backend backend = parse_backend(c.launcher);
  if (world.size() == 1 && !c.force_multi) {
    // One host: DeepSpeed runs launch.py here whatever --launcher says (multi_node_exec =
    // force_multi or more than one host), so no ssh/mpirun/srun and no .deepspeed_env.
    return run_here(c, world[0].slots);
  }
  MultiNodeOptions m;
  m.world = world;
  m.backend = backend;
  m.launcher_args = split_words(c.launcher_args);
  m.ssh_port = c.ssh_port;
  m.ssh_check = !c.no_ssh_check;
  m.master_addr = c.master_addr_given ? c.local.master_addr : "";
  m.master_port = c.local.master_port;
  m.kill_grace_s = c.local.kill_grace_s;
  m.agent_flags = agent_flags(c, app);
  m.command = c.local.command;
  prepare_hosts(m);
  return with_restarts(c.max_restarts, [&](int count) {
    m.restart_count = count;
    return run_multinode(m);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Cli c;
  if (!grace_from_env(&c.local.kill_grace_s)) return kUsageError;
  CLI::App app{"dsrun: start the ranks of PROGRAM on this node or on the hosts of a hostfile "
               "(DeepSpeed's `deepspeed` launcher)",
               "dsrun"};
  add_options(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "dsrun: %s\nRun 'dsrun --help' for usage.\n", e.what());
    return kUsageError;
  }
  LaunchOptions& options = c.local;
  if (c.num_gpus > 0) options.num_procs = c.num_gpus;
  options.append_local_rank = app.count("--no_local_rank") == 0;
  c.master_addr_given = app.count("--master_addr") > 0;
  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--")
    options.command.erase(options.command.begin());
  if (options.command.empty()) {
    std::fprintf(stderr, "dsrun: no PROGRAM given\nRun 'dsrun --help' for usage.\n");
    return kUsageError;
  }
  if (options.command.front().rfind("-", 0) == 0) {
    const std::string& flag = options.command.front();
    if (const char* why = unsupported_deepspeed_flag(flag))
      std::fprintf(stderr, "dsrun: DeepSpeed's %s is not supported: %s\n", flag.c_str(), why);
    else
      std::fprintf(stderr, "dsrun: unknown option '%s' (PROGRAM must come after dsrun's options)\n",
                   flag.c_str());
    return kUsageError;
  }
  if (c.preflight)
    return run_preflight(options.command.front(), c.master_addr_given ? options.master_addr : "",
                         app.count("--master_port") ? options.master_port : 0);
  try {
    if (c.node_rank >= 0 || !c.world_info.empty()) {
      if (c.node_rank < 0 || c.world_info.empty())
        throw LaunchError("--node_rank and --world_info go together (node agent mode)");
      return run_agent(c);
    }
    return run_launcher(c, app);
  } catch (const LaunchError& e) {
    say(e.what());
    return kUsageError;
  }
}
